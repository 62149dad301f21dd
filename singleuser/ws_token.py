"""`?token=` on websocket upgrades from non-browser clients (VS Code, scripts).

JupyterHub 5 stopped accepting a token in the URL (`?token=...`) on pages:
a URL with a token in it leaks (history, Referer, logs, screenshots, links
shared by mistake) and lets anyone who sends a victim such a link log the
victim in to the sender's server ("login CSRF"). It still accepts it on
websockets, because a browser's WebSocket API cannot set an Authorization
header; it recognises a websocket by the `Sec-Fetch-Mode: websocket` header
(`HubAuth._get_token_url`), which browsers add. Non-browser clients do not
send Fetch Metadata headers at all: VS Code's Jupyter extensions (through
@jupyterlab/services and Node's `ws`) put the token only in the websocket's
query string, so since JupyterHub 5 their kernel websocket fails with 403
(microsoft/vscode-jupyter-hub#75).

The fix here accepts the URL token in one more case, and only that one:

- the handler is a tornado `WebSocketHandler` (kernel channels, terminals,
  events): ordinary pages and REST endpoints are unchanged, so
  `/lab?token=...` or `api/contents?token=...` are still refused unless
  JupyterHub's own rules (`HubAuth.allow_token_in_url`) accept them;
- the request is a genuine websocket handshake (RFC 6455): `GET` with
  `Upgrade: websocket`, `Connection: upgrade`, a 16-byte `Sec-WebSocket-Key`
  and `Sec-WebSocket-Version: 13`;
- it carries no `Sec-Fetch-Mode` header, i.e. it does not come from a
  browser (browsers always send it; for them JupyterHub's rule stays the only
  one).

Why this is safe: a web page cannot make such a request by any other means
than the WebSocket API: `Upgrade`, `Connection` and every `Sec-` header are
forbidden header names for fetch/XHR, and a page's WebSocket always carries
`Sec-Fetch-Mode: websocket` (so JupyterHub already accepts its URL token).
The case added is therefore exactly "a websocket, from a client that is not a
browser" — the case JupyterHub's rule meant to allow, recognised by the
handshake itself instead of a header only browsers send. Nothing is
persisted from a websocket's URL token (JupyterHub stores a URL token in a
cookie only for `navigate` requests to non-websocket handlers), so no session
can be planted this way; cookie-only websocket rules
(`allow_websocket_cookie_auth`) are untouched; a websocket URL does not reach
history or Referer headers; and jupyter_server's request log scrubs `token`
from the URLs it logs. The token still has to be valid and hold
`access:servers` for this server: a token of another user gets 403 as before.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def _tokens(value: str | None) -> set[str]:
    return {part.strip().lower() for part in (value or "").split(",") if part.strip()}


def is_websocket_handshake(method: str, headers: Mapping[str, str]) -> bool:
    """An RFC 6455 opening handshake: GET, Upgrade/Connection, a key and version 13."""
    if method.upper() != "GET":
        return False
    if "websocket" not in _tokens(headers.get("Upgrade")):
        return False
    if "upgrade" not in _tokens(headers.get("Connection")):
        return False
    if headers.get("Sec-WebSocket-Version", "").strip() != "13":
        return False
    try:
        key = base64.b64decode(headers.get("Sec-WebSocket-Key", "").strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(key) == 16


def accepts_url_token(method: str, headers: Mapping[str, str], websocket_handler: bool) -> bool:
    """Whether a URL token may authenticate a request JupyterHub's own rule turned down."""
    if "Sec-Fetch-Mode" in headers:
        return False  # a browser: JupyterHub's rule (fetch mode websocket) is the only one
    return websocket_handler and is_websocket_handshake(method, headers)


@functools.cache
def _hub_oauth_class(base: type) -> type:
    """`base` (JupyterHub's HubOAuth or a subclass of it) that also reads `?token=` on
    non-browser websocket handshakes."""
    from tornado.websocket import WebSocketHandler

    class WebsocketTokenHubOAuth(base):  # type: ignore[misc, valid-type]
        """HubOAuth that also reads `?token=` on non-browser websocket handshakes."""

        reads_websocket_url_token = True

        def _get_token_url(self, handler: Any) -> str:
            token = super()._get_token_url(handler)
            if token:
                return token
            request = handler.request
            if accepts_url_token(request.method or "", request.headers,
                                 isinstance(handler, WebSocketHandler)):
                return handler.get_argument("token", "")
            return ""

    WebsocketTokenHubOAuth.__name__ = WebsocketTokenHubOAuth.__qualname__ = (
        f"WebsocketToken{base.__name__}")
    return WebsocketTokenHubOAuth


def install(serverapp: Any) -> bool:
    """Give a JupyterHub single-user server's HubOAuth the websocket rule above.

    A no-op (False) in a Jupyter server not run by JupyterHub, or when this
    JupyterHub has no `_get_token_url` to extend (a version this was not
    written for: then its own behaviour stays, and a warning says so).
    """
    try:
        from jupyterhub.services.auth import HubOAuth
        from jupyterhub.singleuser.extension import JupyterHubIdentityProvider
    except ImportError:
        return False
    provider = getattr(serverapp, "identity_provider", None)
    if not isinstance(provider, JupyterHubIdentityProvider):
        return False
    if not callable(getattr(HubOAuth, "_get_token_url", None)):
        log.warning("gpulease: this JupyterHub has no HubOAuth._get_token_url; websocket "
                    "token-in-URL for non-browser clients (VS Code) is not enabled")
        return False
    hub_auth = provider.hub_auth
    if getattr(hub_auth, "reads_websocket_url_token", False):
        return True
    # The instance's class changes in place; the instance is never replaced.
    # jupyter-server bound `/oauth_callback` to this very object before any
    # extension loads, and since JupyterHub 6.0 it keeps each pending browser
    # login's PKCE code verifier and next URL in its own memory (`_oauth_states`,
    # keyed by the state cookie). A second instance would take the login redirect
    # while the callback looked in the first: every browser login would end on a
    # 500 at oauth_callback ("Code verifier required"). The subclass adds no state,
    # so the object keeps all of its own.
    hub_auth.__class__ = _hub_oauth_class(type(hub_auth))
    return True
