"""A page for a failed sign-in to, or logout from, a server, instead of tornado's bare text.

The server's `/oauth_callback` (JupyterHub's `JupyterHubOAuthCallbackHandler`)
is a plain tornado RequestHandler: a stale or replayed `state`, a `code` the
hub refuses or a hub that does not answer raise an HTTPError, which tornado
answers with nothing but "403: Forbidden". `/logout` (a jupyter-server page)
answers with jupyter-server's page, which names the error and nothing else.
Here each says what went wrong, what to do and links to the hub's home page,
with the status kept. It shows no detail of the exception: those name the
hub's API URL, or echo the `error_description` a callback URL carries.

jupyter-server builds its routes (the identity provider's `get_handlers()`)
before any extension loads, and JupyterHub's extension forces its own
identity provider class, so `install` swaps the two routes' handler classes
in the app's router for subclasses that only add `write_error`.
"""

from __future__ import annotations

import functools
import html
from typing import Any

from gpulease.sign_in_failure import sign_in_failure

HOME_SETTING = "gpulease_hub_home"
LOGOUT_SETTING = "gpulease_hub_logout"

_LOGOUT_FAILED = (
    "Logging out of this server did not complete",
    "The logout request was not one this server accepts (an out-of-date page, say).",
    "Log out from the hub's home page instead, or open your server again from there.",
)


def sign_in_text(status: int) -> tuple[str, str, str]:
    """At `/oauth_callback`: what went wrong (a headline and its cause), and what to do."""
    failure = sign_in_failure(status, to=" to this server", reopen="your server")
    return failure.headline, failure.cause, failure.advice


def logout_text(status: int) -> tuple[str, str, str]:
    """At `/logout`: what went wrong, and what to do."""
    return _LOGOUT_FAILED


def render(status: int, text: tuple[str, str, str], home_url: str, logout_url: str) -> str:
    """The whole page; every value escaped."""
    e = functools.partial(html.escape, quote=True)
    headline, cause, todo = text
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Error {status}: {e(headline)}</title>
<style>
  body {{ margin: 0; font: 16px/1.5 system-ui, sans-serif; color: #1d2330; background: #f6f7fa; }}
  main {{ max-width: 40rem; margin: 4rem auto; padding: 1.5rem 2rem; background: #fff;
          border: 1px solid #d9dee7; border-radius: 6px; }}
  h1 {{ font-size: 1.3rem; margin-top: 0; }}
  a.home {{ display: inline-block; margin-right: 1rem; padding: .4rem .9rem; border-radius: 4px;
            background: #2f6fde; color: #fff; text-decoration: none; }}
</style>
</head>
<body>
<main>
<h1>Error {status}: {e(headline)}</h1>
<p class="cause">{e(cause)}</p>
<p class="todo">{e(todo)}</p>
<p><a class="home" href="{e(home_url)}">Go to the home page</a>
<a class="login" href="{e(logout_url)}">Log out and log in again</a></p>
</main>
</body>
</html>
"""


@functools.cache
def with_error_page(base: type, texts: Any) -> type:
    """`base` (a tornado handler class) whose errors are the page above, worded by `texts`."""

    class WithErrorPage(base):  # type: ignore[misc, valid-type]
        def write_error(self, status_code: int, **kwargs: Any) -> None:
            # tornado cleared the headers before calling this
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.finish(render(status_code, texts(status_code), self.settings[HOME_SETTING],
                               self.settings[LOGOUT_SETTING]))

    WithErrorPage.__name__ = WithErrorPage.__qualname__ = f"{base.__name__}WithErrorPage"
    return WithErrorPage


def install(serverapp: Any) -> bool:
    """Give a JupyterHub server's `/oauth_callback` and `/logout` routes the page above.

    A no-op (False) in a Jupyter server not run by JupyterHub.
    """
    try:
        from jupyterhub.singleuser.extension import (
            JupyterHubIdentityProvider,
            JupyterHubOAuthCallbackHandler,
        )
        from jupyterhub.utils import url_path_join
    except ImportError:
        return False
    provider = getattr(serverapp, "identity_provider", None)
    if not isinstance(provider, JupyterHubIdentityProvider):
        return False
    hub = provider.hub_auth
    settings = serverapp.web_app.settings
    settings[HOME_SETTING] = hub.hub_host + url_path_join(hub.hub_prefix, "home")
    settings[LOGOUT_SETTING] = hub.hub_host + url_path_join(hub.hub_prefix, "logout")
    texts = {JupyterHubOAuthCallbackHandler: sign_in_text,
             provider.logout_handler_class: logout_text}
    for rule in serverapp.web_app.wildcard_router.rules:
        if rule.target in texts:
            rule.target = with_error_page(rule.target, texts[rule.target])
    return True
