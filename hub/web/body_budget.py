"""Request bodies held at once by one HTTP server, bounded across its connections.

Tornado holds a request's body in memory from its first byte until the request
is answered, up to the server's max_body_size (1 MiB for the hub and the
gpulease service). That bounds one request, not many at once: before any
login, 300 connections through the hub's proxy, each with a body of almost
1 MiB sent and its last byte held back, made the hub hold 315 MB (the service
270 MB), and a stranger can open thousands. Here each server keeps a budget:

- a body of at most `SMALL_BODY_BYTES` (a login, a token, a start, an API
  call) is always taken, so that a flood of large bodies cannot crowd the
  logins out; what such bodies hold together is bounded by the connections
  the host allows;
- a larger one counts what it declares (Content-Length, up to the server's
  max_body_size) or, sent chunked, what it has sent so far, against
  `BUDGET_BYTES` shared by all of them, from its headers until its answer is
  written or its connection closes. One that does not fit is refused before
  any more of it is read (tornado's bare 400, the connection closed; through
  the proxy, its 503).

And a body must arrive within `BODY_TIMEOUT_S` of its headers: tornado waits
for one forever, so a body sent a byte a minute held its memory, and a
connection, for as long as the client liked (the proxy in front gives up
after 5 minutes).
"""

from __future__ import annotations

import re
from typing import Any

from tornado import httputil
from tornado.httpserver import HTTPServer

SMALL_BODY_BYTES = 16 << 10  # 16 KiB
BUDGET_BYTES = 64 << 20  # 64 MiB of larger bodies at once, per server
BODY_TIMEOUT_S = 60.0


class BodyBudget:
    """Bytes of large request bodies held at once (pure bookkeeping)."""

    def __init__(self, total: int = BUDGET_BYTES, small: int = SMALL_BODY_BYTES) -> None:
        self.total = total
        self.small = small
        self.held = 0

    def take(self, nbytes: int) -> bool:
        if self.held + nbytes > self.total:
            return False
        self.held += nbytes
        return True

    def give_back(self, nbytes: int) -> None:
        self.held -= nbytes


def declared_length(headers: httputil.HTTPHeaders) -> int | None:
    """The body length a request declares; None when none or a malformed one (which
    tornado refuses itself)."""
    text = headers.get("Content-Length")
    if text is None:
        return None
    pieces = {piece.strip() for piece in text.split(",")}
    # ASCII digits only: str.isdigit() takes '²', which int() then refuses, and
    # this runs before tornado's own (strict) parse of the header.
    if len(pieces) != 1 or not re.fullmatch(r"[0-9]+", next(iter(pieces))):
        return None
    return int(pieces.pop())


class _CountedBody(httputil.HTTPMessageDelegate):
    """Passes one request on to `delegate`, counting its body against `budget`."""

    def __init__(self, delegate: httputil.HTTPMessageDelegate, connection: Any,
                 budget: BodyBudget, cap: int) -> None:
        self._delegate = delegate
        self._budget = budget
        self._cap = cap
        self._chunked = True  # until it declares a length
        self._received = 0
        self._taken = 0
        # Tornado's HTTP1Connection resolves this once the answer is written or
        # the connection closes: the body is held until then, not only while it
        # arrives (a login waiting for the password pool still holds its body).
        self._answered = getattr(connection, "_finish_future", None)
        if self._answered is not None:
            self._answered.add_done_callback(lambda _future: self._give_back())

    def _take(self, nbytes: int) -> None:
        if not self._budget.take(nbytes):
            raise httputil.HTTPInputError(
                f"request bodies over {self._budget.small} bytes, held at once, would "
                f"pass {self._budget.total} bytes")
        self._taken += nbytes

    def _give_back(self) -> None:
        self._budget.give_back(self._taken)
        self._taken = 0

    def headers_received(self, start_line: Any, headers: httputil.HTTPHeaders) -> Any:
        declared = declared_length(headers)
        if declared is not None:
            self._chunked = False
            if declared > self._budget.small:
                self._take(min(declared, self._cap))
        return self._delegate.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        if self._chunked:
            self._received += len(chunk)
            if self._received > self._budget.small:
                self._take(self._received - self._taken)  # what it has sent so far
        return self._delegate.data_received(chunk)

    def finish(self) -> None:
        self._delegate.finish()
        if self._answered is None:
            self._give_back()

    def on_connection_close(self) -> None:
        self._delegate.on_connection_close()
        self._give_back()


class BudgetedHTTPServer(HTTPServer):
    """Tornado's HTTPServer with a `BodyBudget` of its own (module docstring)."""

    def initialize(self, *args: Any, body_budget: BodyBudget | None = None,
                   **kwargs: Any) -> None:
        kwargs.setdefault("body_timeout", BODY_TIMEOUT_S)
        super().initialize(*args, **kwargs)
        self.body_budget = body_budget or BodyBudget()

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        delegate = super().start_request(server_conn, request_conn)
        cap = self.conn_params.max_body_size or BUDGET_BYTES
        return _CountedBody(delegate, request_conn, self.body_budget, cap)
