"""hub/web/canonical_host.py: a browser's page request on another host name goes to the hub's.

A tornado application standing in for the hub's (the same install() the hub calls in
init_tornado_application), asked as a browser and as clients ask.
"""

from __future__ import annotations

import asyncio

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from gpulease.hub.web import canonical_host

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


async def test_a_page_with_a_token_in_its_query_is_sent_too(base):
    # else ?token= would make the hub render its login form on a user's origin
    r = await ask(f"{base}/hub/login?token=x", NAVIGATE, host="mallory.localhost:8000")
    assert r.code == 302 and r.headers["Location"] == "http://localhost:8000/hub/login?token=x"


@pytest.mark.parametrize("headers", [{}, {"Sec-Fetch-Mode": "cors"}, {"Accept": "*/*"}])
async def test_on_a_users_subdomain_every_get_outside_the_api_is_sent(base, headers):
    r = await ask(f"{base}/hub/token", headers, host="mallory.localhost:8000")
    assert r.code == 302 and r.headers["Location"] == "http://localhost:8000/hub/token"


async def test_on_a_users_subdomain_nothing_else_is_answered_but_the_api(base):
    r = await ask(f"{base}/hub/login", NAVIGATE, method="POST", body="x=1",
                  host="mallory.localhost:8000")
    assert r.code == 404
    r = await ask(f"{base}/hub/api/users", {"Authorization": "token t"},
                  host="mallory.localhost:8000")
    assert r.code == 200


@pytest.mark.parametrize("host", ["localhost", "localhost:80", "LOCALHOST.", "localhost."])
async def test_the_default_port_and_case_are_the_same_host(host):
    app = web.Application([(r"/(.*)", Page)])
    canonical_host.install(app, "http://localhost/", "/hub/")
    server = app.listen(0, address="127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    try:
        r = await ask(f"http://127.0.0.1:{port}/hub/login", NAVIGATE, host=host)
        assert r.code == 200, r.headers.get("Location")  # no redirect to itself
    finally:
        server.stop()


@pytest.mark.parametrize("target, where", [
    ("//evil.example/x", "http://localhost:8000/evil.example/x"),
    ("@evil.example/x", "http://localhost:8000/@evil.example/x"),
])
async def test_the_redirect_stays_on_the_hub_whatever_the_target(base, target, where):
    import socket
    from urllib.parse import urlsplit

    port = urlsplit(base).port

    def raw() -> str:  # a request target no browser sends; off the loop the server runs on
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Sec-Fetch-Mode: navigate\r\n\r\n".encode())
            return s.recv(4096).decode()

    answer = await asyncio.to_thread(raw)
    location = next((line.split(": ", 1)[1] for line in answer.split("\r\n")
                     if line.lower().startswith("location:")), "")
    assert urlsplit(location).netloc in ("localhost:8000", ""), answer[:500]
