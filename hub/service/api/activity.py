"""Servers push their kernel and terminal state here; the idle culler reads it.

- `PUT api/server-activity` `{"kernels": [{"id", "execution_state",
  "last_activity", "connections"}], "terminals": [{"name", "last_activity"}] | null,
  "last_kernel_activity"}` (the last, optional: any kernel's, shut down ones' too)
  — a server, with its own token (`JUPYTERHUB_API_TOKEN`). The state is
  stored for the server the token belongs to (hub/service/activity_store.py, server_of),
  never for a user or server named in the body. 204; 400 field by field; 403
  for a token that is not one server's own; 413 over 256 KiB; 429 with
  `Retry-After` beyond the push ration (hub/service/push_rate.py), before the body
  is read.
- `GET api/server-activity[?user=NAME...]` — gpulease admins (the culler):
  `{"since", "now", "servers": [{"user", "server", "pushed", "kernels":
  [...], "terminals": {"count", "last_activity"} | null, "last_kernel_activity"}]}`. `since` is when
  this service's memory began: a server not listed has not pushed since then.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from tornado import web

from gpulease.hub.service.activity_store import (
    MAX_BODY_BYTES,
    ActivityStore,
    iso,
    parse_push,
    server_of,
)
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.push_rate import PushRate
from gpulease.hub.service.streamed_push import StreamedPush


@web.stream_request_body
class ServerActivityHandler(StreamedPush):
    """The body is streamed so that its size is bounded before it is read."""

    max_body_bytes = MAX_BODY_BYTES
    what = "A server's state"

    @property
    def store(self) -> ActivityStore:
        return self.settings["gpulease_server_activity"]

    @property
    def rate(self) -> PushRate:
        return self.settings.setdefault("gpulease_push_rate", PushRate())

    async def admit(self) -> None:
        """Who pushes, within the ration and the size bound: before the body is read."""
        await self.identify()
        if self.request.method != "PUT":
            return
        # Rationed before the body is read: a flood costs no parsing.
        user, server = self._own_server()
        wait = self.rate.wait_s(user, server, time.monotonic())
        if wait:
            raise APIError(429, f"This server pushes its state too often: at most "
                                f"{self.rate.server_per_s:g} a second (bursts of "
                                f"{self.rate.server_burst:g}) per server and "
                                f"{self.rate.user_per_s:g} a second per user; "
                                f"try again in {wait} s",
                           headers={"Retry-After": str(wait)})
        self.bound_body()

    async def put(self) -> None:
        user, server = self._own_server()
        push = parse_push(self.body_json(), user, server, datetime.now(UTC))  # PushError
        self.store.put(push)
        self.set_status(204)
        self.finish()

    async def get(self) -> None:
        self.require_admin()
        now = datetime.now(UTC)
        users = set(self.get_arguments("user")) or None
        listed = ",".join(p.as_json for p in self.store.pushes(now, users))
        head = json.dumps({"since": iso(self.store.since), "now": iso(now)})[:-1]
        self.finish(f'{head}, "servers": [{listed}]}}')

    def _own_server(self) -> tuple[str, str]:
        return server_of(self.caller())  # PushError: not a server's token


ROUTES = [(r"api/server-activity", ServerActivityHandler)]
