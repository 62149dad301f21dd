"""How many named servers one user may have: JupyterHub's limit, refused with 409.

`JupyterHub.named_server_limit_per_user` (gpulease's default: 5, set in
hub_config) counts a user's named servers, stopped ones included, and
JupyterHub refuses one more with 400. gpulease answers 409 (a limit, as its
other per-user limits) naming the limit: `GPULeaseHub` hands JupyterHub, in
place of the configured value, `refusing_limit(value)` — a callable of the
handler, which that option documents — and the callable itself refuses a new
named server beyond the limit. It runs where JupyterHub checks the limit,
before any server row is written, on every path that creates a named server:
the REST API (`POST`/`PUT` on /users/{name}/servers/{server}, `PATCH`
renaming the default server) and the spawn page. JupyterHub's own check then
finds nothing more to refuse. The configured value may itself be JupyterHub's
callable; it is asked first.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection
from typing import Any

from gpulease.core.refusal import Refusal
from gpulease.spawners.http_error import http_error

# gpulease's default for JupyterHub.named_server_limit_per_user (hub_config sets it).
NAMED_SERVER_LIMIT = 5
_SHOWN_NAMES = 10


def named_server_refusal(user: str, existing: Collection[str], server: str,
                         limit: int) -> str | None:
    """Why `user` (whose servers are `existing`, "" the default) may not create named
    server `server`, or None. 0: no limit; an existing server is no new one."""
    if limit <= 0 or not server or server in existing:
        return None
    named = sorted(name for name in existing if name)
    if len(named) < limit:
        return None
    shown = ", ".join(named[:_SHOWN_NAMES]) + (", ..." if len(named) > _SHOWN_NAMES else "")
    return (f"{user} already has {len(named)} named servers ({shown}), the most one user may "
            f"have (named_server_limit_per_user {limit}); {server} is not created. Delete a "
            "named server you no longer need, or start one of these instead.")


def _target(handler: Any) -> tuple[str, str] | None:
    """(user, new server name) a handler is about to check, or None for others."""
    from jupyterhub.apihandlers.users import UserServerAPIHandler
    from jupyterhub.handlers.pages import SpawnHandler

    if not isinstance(handler, UserServerAPIHandler | SpawnHandler):
        return None  # e.g. the home and admin pages, which only show the limit
    args = list(handler.path_args or ())
    if not args:
        return None
    user, server = args[0], args[1] if len(args) > 1 else ""
    if handler.request.method == "PATCH":  # renaming the default server: the new name
        try:
            body = json.loads(handler.request.body or b"{}")
        except ValueError:
            return None  # JupyterHub answers the malformed body itself
        name = body.get("name") if isinstance(body, dict) else None
        server = name if isinstance(name, str) else ""
    return (user, server) if server else None  # the default server is no named one


def _refuse_beyond(handler: Any, limit: int) -> None:
    target = _target(handler) if limit else None
    if target is None:
        return
    user = handler.find_user(target[0])
    if user is None:
        return  # JupyterHub answers 404 itself
    refusal = named_server_refusal(user.name, set(user.orm_spawners), target[1], int(limit))
    if refusal is not None:
        raise http_error(Refusal(refusal, [("name", refusal)], status=409))


def refusing_limit(limit: int | Callable) -> Callable[[Any], Any]:
    """The named_server_limit_per_user to hand JupyterHub: `limit` (a number, or
    JupyterHub's callable of the handler), refusing one server too many with 409.

    For a number or a plain callable it answers at once, with no await: JupyterHub
    then counts and creates the server in the same step of its event loop, so
    requests sent at once cannot together pass the limit. An async callable is
    awaited first (then JupyterHub's own check, 400, catches what races past).
    """

    def limit_for(handler: Any) -> Any:
        value = limit(handler) if callable(limit) else limit
        if inspect.isawaitable(value):
            async def resolved() -> int:
                number = await value
                _refuse_beyond(handler, number)
                return number

            return resolved()
        _refuse_beyond(handler, value)
        return value

    limit_for.gpulease_configured = limit  # what the admin set, for tests and logs
    return limit_for
