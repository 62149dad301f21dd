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

from jupyterhub.services.auth import UserNotAllowed
from tornado import web

from gpulease.core.refusal import Refusal
from gpulease.core.units import json_loads
from gpulease.hub.service.activity_store import (
    MAX_BODY_BYTES,
    ActivityStore,
    iso,
    parse_push,
    server_of,
)
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.push_rate import PushRate

# A refusal before the body is read: tornado then closes the connection, and says
# so only with this header. Without it the hub's proxy kept the connection for its
# next request, to any path of the service, which failed (the proxy's 503).
UNREAD_BODY = {"Connection": "close"}


@web.stream_request_body
class ServerActivityHandler(BaseAPIHandler):
    """The body is streamed so that its size is bounded before it is read."""

    @property
    def store(self) -> ActivityStore:
        return self.settings["gpulease_server_activity"]

    @property
    def rate(self) -> PushRate:
        return self.settings.setdefault("gpulease_push_rate", PushRate())

    async def prepare(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        try:
            await self._admit()
        except Refusal as e:
            if self.request.method == "PUT":  # refused with its body unread
                e.headers = {**e.headers, **UNREAD_BODY}
            raise

    async def _admit(self) -> None:
        """Who pushes, within the ration and the size bound: before the body is read."""
        # Identify the token without blocking the loop: thousands of servers
        # push, and HubAuth's synchronous lookup would wait for the hub inline.
        # (A browser's cookie, for GET, takes HubOAuth's usual path.)
        token = self.hub_auth.get_token(self, in_cookie=False)
        if token:
            try:
                model = await self.hub_auth.user_for_token(token, sync=False)
            except web.HTTPError as e:
                raise APIError(503, "The hub cannot identify this token now "
                                    f"({e.log_message or e.status_code}); try again") from None
            try:
                self._hub_auth_user_cache = self.check_hub_user(model) if model else None
            except UserNotAllowed:
                self._hub_auth_user_cache = None
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
        length = self.request.headers.get("Content-Length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            raise APIError(413, f"A server's state is at most {MAX_BODY_BYTES} bytes "
                                f"(Content-Length {length[:20]})")
        # Chunked bodies: the connection is cut once past the bound.
        self.request.connection.set_max_body_size(MAX_BODY_BYTES)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= MAX_BODY_BYTES:
            self._chunks.append(chunk)

    async def put(self) -> None:
        user, server = self._own_server()
        if self._size > MAX_BODY_BYTES:
            raise APIError(413, f"A server's state is at most {MAX_BODY_BYTES} bytes")
        body = b"".join(self._chunks)
        if not body:
            raise APIError(400, "A JSON body is required")
        try:
            data = json_loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"The body is not valid JSON: {e}") from None
        push = parse_push(data, user, server, datetime.now(UTC))  # PushError: its status
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
