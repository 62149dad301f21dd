"""What counts as a user's activity in a notebook server: use, not background polls.

A JupyterLab tab left open polls the server's REST API (kernels, sessions,
terminals, contents) every few seconds; jupyter_server counts every API
request as activity, reports it to the hub, and so an abandoned tab would
keep an idle GPU rented forever — the weakness of idle cullers that judge by
activity alone. Here only requests that change something count (running or
interrupting a kernel, saving or creating files, starting terminals: POST,
PUT, PATCH, DELETE). Kernel executions and terminal input count on their own
through the kernels' and terminals' activity, which this does not touch.
"""

from __future__ import annotations

from typing import Any

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def counts_as_use(method: str) -> bool:
    return method.upper() not in READ_METHODS


def install() -> None:
    """Make jupyter_server's API activity count only requests that change something.

    jupyter_server has no setting for this; APIHandler.update_api_activity is
    its one place that records API activity, so it is wrapped (once).
    """
    from jupyter_server.base.handlers import APIHandler

    original = APIHandler.update_api_activity
    if getattr(original, "_gpulease_use_only", False):
        return

    def update_api_activity(self: Any) -> None:
        if counts_as_use(self.request.method or "GET"):
            original(self)

    update_api_activity._gpulease_use_only = True  # type: ignore[attr-defined]
    APIHandler.update_api_activity = update_api_activity
