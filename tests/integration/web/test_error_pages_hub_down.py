"""A gpulease service page about an error renders when the hub cannot say who is asking.

The gpulease service's pages show who is logged in, so rendering any of them asks
the hub who the browser's cookie belongs to. When the hub does not answer (it is
restarting, or unreachable from the service), that question must not be asked
inside `write_error` unguarded: tornado would log "Uncaught exception in
write_error" and send the error's status with an empty body, instead of the page
that says what went wrong and links home. A logged-in researcher meets this exactly when
error pages matter most. In-process: the service's app, a hub API nothing listens
on, and a browser's signed login cookie.
"""

from __future__ import annotations

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from tests.support.service_app import PREFIX, service_env

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def closed_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused at once."""
    sock, port = bind_unused_port()
    sock.close()
    return port


@pytest.fixture
async def service(tmp_path, monkeypatch):
    """The service's app, its hub's API on a port nothing listens on; (base URL, app)."""
    env = service_env(tmp_path / "gpulease.sqlite",
                      f"http://127.0.0.1:{closed_port()}/hub/api")
    for name, value in env.items():  # HubOAuth reads its settings from the environment
        monkeypatch.setenv(name, value)
    from gpulease.hub.service.app import make_app

    app = make_app(env)
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{port}", app
    server.stop()


def login_cookie(app) -> str:
    """What a logged-in browser sends: the service's signed cookie holding a hub token."""
    from jupyterhub.services.auth import HubOAuth

    name = HubOAuth().cookie_name
    value = web.create_signed_value(app.settings["cookie_secret"], name, "a-hub-token")
    return f"{name}={value.decode()}"


@pytest.mark.parametrize(("path", "status", "words"), [
    ("no-such-page", 404, "gpulease has no page at this address"),
    ("oauth_callback", 400, "Your sign-in did not complete"),
    # a stale state with a login cookie: the callback asks the hub who it is, itself
    ("oauth_callback?code=c0de&state=st4te", 500, "Your sign-in did not complete"),
])
async def test_a_service_error_page_renders_when_the_hub_does_not_answer(service, path, status,
                                                                          words):
    base, app = service
    r = await AsyncHTTPClient().fetch(f"{base}{PREFIX}{path}", raise_error=False,
                                      follow_redirects=False,
                                      headers={**HTML, "Cookie": login_cookie(app)})
    page = (r.body or b"").decode()
    assert r.code == status, (r.code, page[:2000])
    assert words in page, page[:2000] or "(an empty body)"
    assert 'href="/hub/home"' in page and "Go to the home page" in page, page[:2000]
    assert "c0de" not in page and "st4te" not in page and "a-hub-token" not in page
