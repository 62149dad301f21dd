"""Page requests on a host name other than the hub's are sent to the hub's.

The hub's login cookie is set for the host a browser logged in on: one who opened
`http://127.0.0.1:8000` would be logged in there, but users' servers, on subdomains of
`localhost`, send them to `localhost` to log in, and the two never meet. So a page
request (a browser's navigation: GET or HEAD, no Authorization header) on any other
host name is redirected, path and query kept, to the hub's public URL. API requests
work on any host name the hub listens on (a script's `http://127.0.0.1:8000/hub/api`).

On a user's or the service's subdomain the hub renders nothing at all outside its API:
every GET there is redirected (a stopped server's URL, which JupyterHub would send on
to the hub anyway), anything else answered 404, so no hub page, form or cookie ever
exists on an origin a user's code controls (`?token=` on a page included).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from tornado import httputil, web
from tornado.routing import Matcher, Rule

from gpulease.hub.web.origins import DEFAULT_PORTS


def host_and_port(netloc: str, scheme: str) -> tuple[str, int]:
    """A Host header (or URL netloc) as browsers mean it: lower case, no trailing dot,
    the scheme's default port when none is written."""
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return netloc.lower(), -1  # not a host name: never the hub's
    return (parts.hostname or "").rstrip("."), port or DEFAULT_PORTS.get(scheme, 0)


def is_page_request(request: httputil.HTTPServerRequest) -> bool:
    """A browser's navigation rather than a client's call."""
    if request.method not in ("GET", "HEAD") or request.headers.get("Authorization"):
        return False
    mode = request.headers.get("Sec-Fetch-Mode")
    if mode is not None:
        return mode == "navigate"
    return "text/html" in request.headers.get("Accept", "")


class OtherHost(Matcher):
    """Matches what the hub answers elsewhere than its public host (module doc)."""

    def __init__(self, public_url: str, api_prefix: str) -> None:
        public = urlsplit(public_url)
        self.scheme = public.scheme
        self.hub = host_and_port(public.netloc, public.scheme)
        self.api_prefix = api_prefix

    def match(self, request: httputil.HTTPServerRequest) -> dict | None:
        host = host_and_port(request.host or "", self.scheme)
        if host == self.hub or request.path.startswith(self.api_prefix):
            return None
        if host[0].endswith("." + self.hub[0]):  # a user's or the service's subdomain
            return {}
        return {} if is_page_request(request) else None


class ToPublicHost(web.RequestHandler):
    def initialize(self, public_url: str) -> None:
        self.public = urlsplit(public_url)

    def get(self, *args: str) -> None:
        # the path as a path, whatever the request target was ("//x", "@x", "http://x")
        target = urlsplit(self.request.uri or "/")
        path = "/" + target.path.lstrip("/") + (f"?{target.query}" if target.query else "")
        self.redirect(f"{self.public.scheme}://{self.public.netloc}{path}")

    head = get

    def prepare(self) -> None:
        if self.request.method not in ("GET", "HEAD"):
            raise web.HTTPError(404, "the hub answers this on its own host only")


def install(app: web.Application, public_url: str, hub_prefix: str) -> None:
    """Put the redirect ahead of every other route of the hub's tornado application."""
    rule = Rule(OtherHost(public_url, hub_prefix + "api/"), ToPublicHost,
                {"public_url": public_url})
    app.default_router.rules.insert(0, rule)
