"""An error a researcher's browser meets is a page that helps, never tornado's bare text.

Each surface a browser can reach (the hub's pages, the proxy's error target,
the gpulease service's pages and its sign-in, a server's `oauth_callback` and
`logout`) answers with the status kept, what went wrong in plain words, what
to do, and a link to the hub's home page; the JSON APIs stay JSON. The server's
pages never show the sign-in's `code` or `state`.

Here one real hub, proxy, gpulease service and server, asked as a browser asks
(tests/integration/web/test_error_pages.py: the words, and the server's two routes in
process, their links built from what JupyterHub gives the server).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from gpulease.hub.web.error_text import error_text
from tests.support.hubproc import free_port
from tests.support.pages import BARE, HTML


def assert_helpful(r: requests.Response, status: int, home: str = "") -> str:
    """A page (not tornado's bare one) with `status`, advice and a link to `home`: by
    default the hub's home, relative on the hub's origin and absolute from a server's or
    the service's (origins of their own)."""
    assert r.status_code == status, (r.status_code, r.text[:2000])
    assert r.headers["Content-Type"].startswith("text/html"), r.headers
    text = r.text
    assert not BARE.search(text), text[:2000]
    link = re.escape(home) if home else r"(http://localhost:\d+)?/hub/home"
    assert re.search(f'href="{link}"', text) and "Go to the home page" in text, text[:4000]
    assert re.search(r"Error \d{3}: \w", text), text[:4000]  # a title in words, beside the code
    return text


# --- the server's routes, in-process --------------------------------------------------------------


# --- one real hub, proxy, service and server -------------------------------------------------------

@pytest.fixture(scope="module")
def ada(hub) -> requests.Session:
    """ada, with a running server, and her browser: logged in to the hub, not yet to it."""
    admin = hub.admin_token
    token = hub.add_user(admin, "ada")
    r = hub.api("POST", "users/ada/server", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("ada", token)
    browser = hub.login_form("ada", "ada-pw-12345")
    assert browser.login_status == 302
    browser.headers.update(HTML)
    return browser


@pytest.mark.e2e
def test_a_sign_in_with_a_stale_state_is_a_page_that_leads_home(hub, ada):
    r = ada.get(hub.server_url("ada", "", "oauth_callback?code=bogus-code&state=bogus-state"),
                timeout=30)
    page = assert_helpful(r, 403)
    assert "did not complete" in page and "open your server again" in page.lower()
    assert "bogus-code" not in page and "bogus-state" not in page


@pytest.mark.e2e
def test_a_sign_in_whose_code_the_hub_refuses_is_a_page_that_leads_home(hub, ada):
    # the server's own redirect to the hub sets the state cookie, as in a real login
    r = ada.get(hub.server_url("ada", "", "lab"), allow_redirects=False, timeout=30)
    assert r.status_code == 302, r.text[:2000]
    state = parse_qs(urlsplit(r.headers["Location"]).query)["state"][0]
    r = ada.get(hub.server_url("ada", "", "oauth_callback"),
                params={"code": "a-code-the-hub-never-issued", "state": state}, timeout=30)
    page = assert_helpful(r, 500)  # JupyterHub's HubOAuth makes the hub's 400 its 500
    assert "did not complete" in page and "log in again" in page
    assert state not in page and "a-code-the-hub-never-issued" not in page


@pytest.mark.e2e
def test_a_logout_the_server_refuses_is_a_page_that_leads_home(hub, ada):
    r = ada.post(hub.server_url("ada", "", "logout"), timeout=30)  # no _xsrf: refused
    page = assert_helpful(r, 403)
    assert "Logging out of this server did not complete" in page


@pytest.mark.e2e
@pytest.mark.parametrize("path", ["/hub/no-such-page", "/user/nobody-here/"])
def test_the_hubs_404_is_a_page_that_leads_home(hub, ada, path):
    page = assert_helpful(ada.get(f"{hub.url}{path}", timeout=30), 404)
    assert error_text(404).advice in page and "lots of moons" not in page


@pytest.mark.e2e
def test_the_proxys_error_target_for_a_server_that_does_not_answer(hub, ada):
    # a route to a server whose process is gone: nothing listens on its port
    ghost = urlsplit(hub.server_url("ghost"))  # routed by its host, as JupyterHub routes it
    api = f"http://127.0.0.1:{hub.api_port}/api/routes/{ghost.hostname}{ghost.path}"
    auth = {"Authorization": f"token {hub.secrets()['proxy token']}"}
    dead = f"http://127.0.0.1:{free_port()}"
    assert requests.post(api, json={"target": dead}, headers=auth, timeout=10).status_code == 201
    try:
        r = ada.get(hub.server_url("ghost", "", "lab"), timeout=30)
    finally:
        requests.delete(api, headers=auth, timeout=10)
    page = assert_helpful(r, 503)  # the proxy keeps the status; the hub wrote the page
    assert "start or resume it from the home page" in page


@pytest.mark.e2e
def test_the_services_errors_are_pages_that_lead_home(hub, ada):
    forbidden = ada.get(f"{hub.urls.service()}admin/profiles", timeout=30)
    page = assert_helpful(forbidden, 403)
    assert "needs a gpulease admin or auditor" in page and error_text(403).advice in page.replace(
        "&#x27;", "'")
    missing = ada.get(f"{hub.urls.service()}no-such-page", timeout=30)
    assert "gpulease has no page at this address" in assert_helpful(missing, 404)
    # a sign-in to the service's pages that does not match (another browser's link)
    stranger = requests.get(f"{hub.urls.service()}oauth_callback",
                            params={"code": "c0de", "state": "st4te"}, headers=HTML, timeout=30)
    page = assert_helpful(stranger, 403)
    assert "did not complete" in page and "c0de" not in page and "st4te" not in page


@pytest.mark.e2e
def test_the_apis_still_answer_json(hub, ada):
    for url in (f"{hub.url}/hub/api/no-such-thing", hub.urls.service("api/no-such-thing")):
        r = ada.get(url, timeout=30)
        assert r.status_code == 404 and r.headers["Content-Type"].startswith(
            "application/json"), (url, r.text[:500])
        assert r.json()["status"] == 404
