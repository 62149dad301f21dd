"""The error pages' words and a server's two sign-in routes, in process: each status has a
title and advice, what the page shows is escaped, and the server's sign-in and logout
errors lead to the hub's home (tests/e2e/test_error_pages.py asks a real hub).
"""

from __future__ import annotations

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpulease.hub.web.error_text import error_text
from gpulease.singleuser import error_page
from tests.support.pages import BARE, HTML
from tests.support.singleuser_app import hub_server_app


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 429, 500, 502, 503, 504, 599])
def test_every_status_has_a_title_and_advice(status):
    text = error_text(status)
    assert text.title and text.advice.endswith(".")


def test_the_servers_page_escapes_what_it_shows():
    page = error_page.render(403, ("<b>x</b>", "a & b", "c"), 'https://h/"><script>', "/l")
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page and "a &amp; b" in page
    assert "<script>" not in page and 'href="https://h/&quot;&gt;&lt;script&gt;"' in page


async def test_the_servers_sign_in_and_logout_errors_lead_to_the_hubs_home(tmp_path, monkeypatch):
    # the hub on a host of its own, under a base URL: links come from what it gives
    app = hub_server_app(tmp_path, monkeypatch, base="/base/", hub_host="https://hub.example")
    sock, port = bind_unused_port()
    server = HTTPServer(app.web_app)
    server.add_sockets([sock])
    client = AsyncHTTPClient()
    base = f"http://127.0.0.1:{port}/base/user/ada"
    try:
        callback = await client.fetch(f"{base}/oauth_callback?code=the-code&state=the-state",
                                      headers=HTML, raise_error=False)
        logout = await client.fetch(f"{base}/logout", method="POST", body="", headers=HTML,
                                    raise_error=False)
        api = await client.fetch(f"{base}/api/contents/nothing-here", headers=HTML,
                                 raise_error=False)
    finally:
        server.stop()
    home = "https://hub.example/base/hub/home"
    for answer, words in ((callback, "sign-in to this server did not complete"),
                          (logout, "Logging out of this server did not complete")):
        assert answer.code in (403, 405), (answer.code, answer.body[:2000])
        page = answer.body.decode()
        assert words in page and f'href="{home}"' in page, page
        assert 'href="https://hub.example/base/hub/logout"' in page, page
        assert not BARE.search(page), page
    assert "the-code" not in callback.body.decode() and "the-state" not in callback.body.decode()
    # the API stays JSON
    assert api.code in (403, 404) and api.headers["Content-Type"].startswith("application/json")
