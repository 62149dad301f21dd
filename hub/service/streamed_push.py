"""A push to the gpulease service whose sender, ration and size are checked before
its body is read: servers' kernel state (api/activity.py) and the culler's GPU
readings (api/gpu.py).

The handler streams (`@web.stream_request_body` on the subclass), so tornado has
read nothing when `admit` refuses; such a refusal closes the connection
(UNREAD_BODY: without it the hub's proxy kept the connection for its next
request, to any path of the service, which failed with the proxy's 503). The
token is identified without blocking the loop: thousands of servers push, and
HubAuth's synchronous lookup would wait for the hub inline (a browser's cookie
takes HubOAuth's usual path).
"""

from __future__ import annotations

from typing import Any

from jupyterhub.services.auth import UserNotAllowed
from tornado import web

from gpulease.core.refusal import Refusal
from gpulease.core.units import json_loads
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError

UNREAD_BODY = {"Connection": "close"}


class TokenIdentified(BaseAPIHandler):
    """The caller identified by its token without blocking the loop (`identify`)."""

    async def identify(self) -> None:
        token = self.hub_auth.get_token(self, in_cookie=False)
        if not token:
            return
        try:
            model = await self.hub_auth.user_for_token(token, sync=False)
        except web.HTTPError as e:
            raise APIError(503, "The hub cannot identify this token now "
                                f"({e.log_message or e.status_code}); try again") from None
        try:
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed:
            self._hub_auth_user_cache = None


class StreamedPush(TokenIdentified):
    """`admit` before the body; `body_json` after it, within `max_body_bytes`.
    `what` names the body in refusals ("A server's state")."""

    max_body_bytes: int
    what: str

    async def prepare(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        try:
            await self.admit()
        except Refusal as e:
            if self.request.method == "PUT":  # refused with its body unread
                e.headers = {**e.headers, **UNREAD_BODY}
            raise

    async def admit(self) -> None:
        """Who pushes, within the ration: refuse (a Refusal) before the body is read."""
        raise NotImplementedError

    def bound_body(self) -> None:
        """413 for a body declared over the bound; a chunked one is cut past it."""
        length = self.request.headers.get("Content-Length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            raise APIError(413, f"{self.what} is at most {self.max_body_bytes} bytes "
                                f"(Content-Length {length[:20]})")
        self.request.connection.set_max_body_size(self.max_body_bytes)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= self.max_body_bytes:
            self._chunks.append(chunk)

    def body_json(self) -> Any:
        """The body read, as JSON: 413 over the bound, 400 empty or not JSON."""
        if self._size > self.max_body_bytes:
            raise APIError(413, f"{self.what} is at most {self.max_body_bytes} bytes")
        body = b"".join(self._chunks)
        if not body:
            raise APIError(400, "A JSON body is required")
        try:
            return json_loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"The body is not valid JSON: {e}") from None
