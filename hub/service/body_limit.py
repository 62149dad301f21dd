"""Request bodies to the gpulease service are bounded: at most 1 MiB.

Tornado reads a whole body into memory before a handler runs (up to its
HTTP server's max_body_size, 100 MB by default). Here:

- A body that declares more (Content-Length) is refused with 413 in the
  service's error shape, and none of it is kept: a routing rule ahead of
  every route sends the request to `BodyTooLargeHandler`, which streams, so
  tornado buffers nothing for it. It reads the body on and drops it (up to
  `DRAIN_BYTES`) before it answers: configurable-http-proxy, in front of the
  service for everyone but the servers, answers 503 instead of the service's
  413 when the service stops reading a body it is still sending. A body
  declared larger still is answered at once and its connection closed.
- A body without a length (chunked) is read only up to the bound: the HTTP
  server's max_body_size (app.main, the backstop) cuts the connection past
  it. Tornado answers that itself, before any handler runs, with a bare 400:
  the size is known only once the bound is crossed, mid-body.

`PUT api/server-activity` has its own, lower bound (hub/service/activity_store.py).
"""

from __future__ import annotations

from tornado import httputil, web
from tornado.routing import Matcher

from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.web.body_budget import declared_length

MAX_BODY_BYTES = 1 << 20  # 1 MiB
DRAIN_BYTES = 64 << 20  # read on and dropped before the 413, up to this


def too_large(size: int, close: bool = False) -> APIError:
    return APIError(413, f"A request body to the gpulease service is at most {MAX_BODY_BYTES} "
                         f"bytes (1 MiB); this one has {size} bytes. Nothing of it was kept "
                         "and nothing was changed.",
                    headers={"Connection": "close"} if close else None)


class DeclaresTooMuch(Matcher):
    """Matches a request whose Content-Length is over `limit`, whatever its path."""

    def __init__(self, limit: int = MAX_BODY_BYTES):
        self.limit = limit

    def match(self, request: httputil.HTTPServerRequest) -> dict | None:
        length = declared_length(request.headers)
        return {} if length is not None and length > self.limit else None


@web.stream_request_body
class BodyTooLargeHandler(BaseAPIHandler):
    """413 for a body declared over the bound, keeping none of it (streaming)."""

    def prepare(self) -> None:
        self._declared = declared_length(self.request.headers) or 0
        if self._declared > DRAIN_BYTES:
            # Answered before the body; tornado then closes the connection.
            self.request.connection.set_max_body_size(self._declared)  # no second, bare 400
            raise too_large(self._declared, close=True)
        self.request.connection.set_max_body_size(self._declared)

    def data_received(self, chunk: bytes) -> None:
        pass  # dropped

    def refuse(self, *args: str) -> None:
        raise too_large(self._declared)

    get = head = post = put = patch = delete = options = refuse
