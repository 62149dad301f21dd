"""Page requests on a host name other than the hub's are sent to the hub's.

The hub's login cookie is set for the host a browser logged in on: one who opened
`http://127.0.0.1:8000` would be logged in there, but users' servers, on subdomains of
`localhost`, send them to `localhost` to log in, and the two never meet. So a page
request (a browser's navigation: GET or HEAD, no token) on any other host name is
redirected, path and query kept, to the hub's public URL. API requests with a token
work on any host name the hub listens on (a script's `http://127.0.0.1:8000/hub/api`),
and a page the hub answers on a user's subdomain (a stopped server's URL, which
JupyterHub itself sends on to the hub) is redirected too: the hub renders no page on a
user's origin.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from tornado import httputil, web
from tornado.routing import Matcher


def is_page_request(request: httputil.HTTPServerRequest, api_prefix: str) -> bool:
    """A browser's navigation rather than a client's call."""
    if request.method not in ("GET", "HEAD") or request.headers.get("Authorization"):
        return False
    if "token" in request.query_arguments or request.path.startswith(api_prefix):
        return False
    mode = request.headers.get("Sec-Fetch-Mode")
    if mode is not None:
        return mode == "navigate"
    return "text/html" in request.headers.get("Accept", "")


class OtherHostPage(Matcher):
    """Matches page requests whose Host is not the hub's public host."""

    def __init__(self, public_url: str, api_prefix: str) -> None:
        self.netloc = urlsplit(public_url).netloc.lower()
        self.api_prefix = api_prefix

    def match(self, request: httputil.HTTPServerRequest) -> dict | None:
        if (request.host or "").lower() == self.netloc:
            return None
        return {} if is_page_request(request, self.api_prefix) else None


class ToPublicHost(web.RequestHandler):
    def initialize(self, public_url: str) -> None:
        self.public = urlsplit(public_url)

    def get(self, *args: str) -> None:
        self.redirect(f"{self.public.scheme}://{self.public.netloc}{self.request.uri}")

    head = get


def install(app: web.Application, public_url: str, hub_prefix: str) -> None:
    """Put the redirect ahead of every other route of the hub's tornado application."""
    from tornado.routing import Rule

    rule = Rule(OtherHostPage(public_url, hub_prefix + "api/"), ToPublicHost,
                {"public_url": public_url})
    app.default_router.rules.insert(0, rule)
