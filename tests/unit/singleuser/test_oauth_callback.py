"""A single-user server's sign-in, in process: the /oauth_callback route holds the
provider's hub_auth, and the browser tests' allow-list applies only where named
(tests/e2e/test_oauth_to_lab.py walks it on a real hub).
"""

from __future__ import annotations

from tests.support.singleuser_app import hub_server_app


def test_the_callback_route_holds_the_providers_hub_auth(tmp_path, monkeypatch):
    app = hub_server_app(tmp_path, monkeypatch)
    assert "gpulease.singleuser" in app.extension_manager.extensions
    callbacks = [rule for rule in app.web_app.wildcard_router.rules
                 if rule.matcher.regex.pattern.endswith("/oauth_callback$")]
    assert len(callbacks) == 1
    hub_auth = app.identity_provider.hub_auth
    assert callbacks[0].target_kwargs["hub_auth"] is hub_auth
    assert getattr(hub_auth, "reads_websocket_url_token", False)  # the rule is installed
    # loading again (another extension point) keeps the one instance
    from gpulease.singleuser import ws_token

    assert ws_token.install(app) and app.identity_provider.hub_auth is hub_auth


def test_the_browser_tests_allow_list_applies_only_where_named():
    """A 424 of a stopped server's tab passes only a test that stops it on purpose."""
    from tests.support.browser import HttpErrors

    class Context:
        def on(self, event, handler):
            pass

    errors = HttpErrors(Context())
    errors.answers.append((424, "GET", "http://127.0.0.1:1/hub/user/cy/api/kernels/k"))
    assert errors.unexpected() == ["424 GET http://127.0.0.1:1/hub/user/cy/api/kernels/k"]
    assert errors.unexpected("server stopped") == []
    errors.answers.append((500, "PUT", "http://127.0.0.1:1/user/cy/lab/api/workspaces/default"))
    assert errors.unexpected("server stopped") == [
        "500 PUT http://127.0.0.1:1/user/cy/lab/api/workspaces/default"]
