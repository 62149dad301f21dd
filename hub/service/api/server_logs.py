"""Servers' logs API (api/logs): what a server wrote to its stdout and stderr.

- `GET api/logs/{user}` (the default server) and `GET api/logs/{user}/{server}`,
  `?lines=N` for its last N lines: gpulease admins, and the server's owner. Anyone
  else gets 403: a server's output is its owner's (their data, their paths, their
  mistakes). The text is the log as shown (gpulease.core.server_log.shown_text:
  no terminal control sequence of a researcher's reaches an admin's terminal).

Embedded shape: the server's current log file, this start's or its last start's
(<state>/logs/servers/<user>/<server>.log; the rotated ones are on disk beside
it), at most its last MAX_BYTES. Cluster shape: the full logs are Kubernetes'
(`kubectl logs`, named in the answer); the answer holds what gpulease kept, the
last lines of the server's last failed start (its container's termination
message). A name outside the rules is a 400 naming the rule; a server with no
log is a 404 saying so.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tornado import web

from gpulease.core.clock import iso_z
from gpulease.core.server_log import (
    kubectl_logs_command,
    log_path,
    server_name_problem,
    shown_text,
)
from gpulease.host.server_logs import ServerLogError, read_log
from gpulease.hub.service.api.failed_starts import checked_user
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.store.failed_starts import FailedStarts

MAX_BYTES = 1024 * 1024  # of a log's end, at most, in one answer
MAX_LINES = 100_000


def checked_lines(text: str | None) -> int | None:
    """`?lines=` as a count (None: all), or a 400 naming what is allowed."""
    if text is None or text == "":
        return None
    if not text.isdigit() or not 1 <= int(text) <= MAX_LINES:
        raise APIError(400, f"lines must be a whole number from 1 to {MAX_LINES}, not {text!r}",
                       [{"field": "lines", "message": f"1 to {MAX_LINES}"}])
    return int(text)


class ServerLogHandler(BaseAPIHandler):
    async def get(self, user: str, server: str | None = None):
        me = self.caller()
        user = checked_user(user)
        server = server or ""
        problem = server_name_problem(server)
        if problem:
            raise APIError(400, problem, [{"field": "server", "message": problem}])
        if not (self.is_admin() or (me.get("kind", "user") == "user" and me["name"] == user)):
            raise APIError(403, "Only gpulease admins and the server's owner may read a "
                                "server's log")
        lines = checked_lines(self.get_query_argument("lines", None))
        if self.settings.get("gpulease_cluster") is not None:
            await self._cluster(user, server)
            return
        root = self.settings.get("gpulease_server_log_root") or ""
        if not root:
            raise APIError(404, "This hub keeps no servers' logs")
        try:
            data = await asyncio.to_thread(read_log, Path(root), user, server, lines, MAX_BYTES)
        except ServerLogError as e:
            raise APIError(503, str(e)) from None
        named = f"{user}/{server}" if server else f"{user}'s default server"
        if data is None:
            raise APIError(404, f"{named} has no log: it was never started since servers' "
                                "logs were kept")
        self.write_json({
            "user": user, "server": server, "shape": "embedded", "lines": lines,
            "file": str(log_path(Path(root), user, server)),
            "truncated": lines is None and len(data) >= MAX_BYTES,
            "log": shown_text(data),
        })

    async def _cluster(self, user: str, server: str) -> None:
        namespace = self.settings["gpulease_cluster"].namespace
        last = (await asyncio.to_thread(FailedStarts(self.ctx.engine).last_by_server,
                                        user)).get(server)
        self.write_json({
            "user": user, "server": server, "shape": "cluster",
            "full_log": kubectl_logs_command(namespace, user, server),
            "failed_start_at": iso_z(last.at) if last is not None else None,
            # kept as shown when it was recorded (stripped again: older rows too)
            "log": shown_text(last.log_tail) if last is not None else "",
        })


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/logs/([^/]+)", ServerLogHandler),
    (r"api/logs/([^/]+)/([^/]+)", ServerLogHandler),
]
