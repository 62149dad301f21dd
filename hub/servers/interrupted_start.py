"""A start interrupted by a stop answers 409 naming what happened, not a bare 500.

JupyterHub cancels a pending start when its server is stopped (a DELETE, an
admin's stop, or gpulease's own: credit that ran out while it started, billed
from its launch), and the POST that asked for the start then ends in that
cancellation, answered "500: Internal Server Error" with a traceback in the
log. The researcher is told instead that the start was stopped before the
server was ready, and where its session says why and what was billed.
"""

from __future__ import annotations

import asyncio

from jupyterhub.apihandlers.users import UserServerAPIHandler
from tornado import web


class InterruptibleStartHandler(UserServerAPIHandler):
    async def post(self, user_name, server_name=""):
        try:
            return await super().post(user_name, server_name)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request itself is being cancelled: not the start's doing
            name = f"the server {server_name}" if server_name else "your server"
            raise web.HTTPError(
                409, f"The start of {name} was stopped before it was ready: by a stop "
                "(yours or an admin's), or because the account ran out of credit while it "
                "started. It was billed from its launch to its end; its session in your "
                "usage (api/usage) gives the reason.") from None


def with_interruptible_starts(handlers: list[tuple]) -> list[tuple]:
    """JupyterHub's route list with its server API handler answering an interrupted start."""
    return [(route[0], InterruptibleStartHandler, *route[2:])
            if isinstance(route, tuple) and len(route) > 1 and route[1] is UserServerAPIHandler
            else route for route in handlers]
