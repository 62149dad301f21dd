"""hub/canonical_host: a browser's page request on another host name goes to the hub's.

A tornado application standing in for the hub's (the same install() the hub calls in
init_tornado_application), asked as a browser and as clients ask.
"""

from __future__ import annotations

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from gpulease.hub import canonical_host

PUBLIC = "http://localhost:8000/"
NAVIGATE = {"Sec-Fetch-Mode": "navigate", "Accept": "text/html"}


class Page(web.RequestHandler):
    def get(self, *_):
        self.write("the hub answered")

    post = get


@pytest.fixture
async def base():
    app = web.Application([(r"/(.*)", Page)])
    canonical_host.install(app, PUBLIC, "/hub/")
    server = app.listen(0, address="127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.stop()


async def ask(url, headers=None, method="GET", body=None, host=None):
    headers = dict(headers or {})
    if host:
        headers["Host"] = host
    try:
        return await AsyncHTTPClient().fetch(url, headers=headers, method=method, body=body,
                                             follow_redirects=False)
    except HTTPClientError as e:
        return e.response


async def test_a_navigation_on_127_0_0_1_goes_to_localhost_path_and_query_kept(base):
    r = await ask(f"{base}/hub/home?next=%2Fhub%2Fspawn", NAVIGATE)
    assert r.code == 302
    assert r.headers["Location"] == "http://localhost:8000/hub/home?next=%2Fhub%2Fspawn"


async def test_a_browser_without_fetch_metadata_asking_for_html_is_sent_too(base):
    r = await ask(f"{base}/hub/login", {"Accept": "text/html,application/xhtml+xml"})
    assert r.code == 302 and r.headers["Location"] == "http://localhost:8000/hub/login"


async def test_on_a_users_subdomain_the_hub_renders_no_page(base):
    r = await ask(f"{base}/user/ada/lab", NAVIGATE, host="ada.localhost:8000")
    assert r.code == 302 and r.headers["Location"] == "http://localhost:8000/user/ada/lab"


@pytest.mark.parametrize("headers, path", [
    ({"Authorization": "token abc", **NAVIGATE}, "/hub/home"),  # a client with a token
    (NAVIGATE, "/hub/home?token=abc"),
    (NAVIGATE, "/hub/api/users"),  # the API, on any host name
    ({"Sec-Fetch-Mode": "cors", "Accept": "text/html"}, "/hub/home"),  # a page's fetch
    ({"Accept": "application/json"}, "/hub/health"),  # a probe
])
async def test_clients_are_answered_where_they_ask(base, headers, path):
    r = await ask(f"{base}{path}", headers)
    assert r.code == 200 and r.body == b"the hub answered"


async def test_a_post_is_answered_where_it_is_sent(base):
    r = await ask(f"{base}/hub/login", NAVIGATE, method="POST", body="x=1")
    assert r.code == 200


async def test_the_hubs_own_host_is_served(base):
    r = await ask(f"{base}/hub/home", NAVIGATE, host="localhost:8000")
    assert r.code == 200 and r.body == b"the hub answered"
