"""A researcher's own web apps behind their server (jupyter-server-proxy): forms only
from the server's own origin.

jupyter-server-proxy (/user/NAME/proxy/PORT/) leaves XSRF checks to the proxied
app, which rarely has any (a dashboard, TensorBoard). The researcher's login cookie
goes with a form another researcher's page posts there: on a real install
ada.hub.example.org and bob.hub.example.org are one site, and a cookie without
SameSite is sent with a cross-site top-level POST. So an unsafe request that
is authenticated by cookie must come from the server's own origin (its Origin, or
else its Referer), as JupyterHub asks of its own pages; one that carries a token
(a script, VS Code) is not a browser's and passes.
"""

from __future__ import annotations

from urllib.parse import urlsplit

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def same_origin(method: str, host: str, origin: str | None, referer: str | None,
                token_authenticated: bool) -> bool:
    """Whether a request to a proxied app may go on (the rule above)."""
    if method in SAFE_METHODS or token_authenticated:
        return True
    source = origin or referer
    return bool(source) and urlsplit(source).netloc == host


def install() -> None:
    """Put the rule on jupyter-server-proxy's handlers (where it is installed)."""
    try:
        from jupyter_server_proxy.handlers import ProxyHandler
    except ImportError:
        return
    from tornado import web

    def check_xsrf_cookie(self) -> None:
        request = self.request
        if not same_origin(request.method, request.host, request.headers.get("Origin"),
                           request.headers.get("Referer"), self.token_authenticated):
            raise web.HTTPError(403, "a form from another site to a proxied app")

    ProxyHandler.check_xsrf_cookie = check_xsrf_cookie
