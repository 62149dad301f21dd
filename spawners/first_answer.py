"""Waiting for a server's first HTTP answer: the moment its billing session opens.

Any answer counts (whatever its status): the server is up and can be used. It
counts from its first byte (see `_answered_at`).
A connection refused while it starts, a reset, or a server that accepts but
does not answer yet means "keep waiting", never a failed start.

The probe runs in a thread of its own and takes the time there, as the answer
arrives: on JupyterHub's event loop a busy moment (each starting server's
first activity report, another spawn) held the probe's next try or its
resumption by 30-150 ms, once 1.4 s, and the session opened that much after
the server answered (bench/billing.py). A thread per starting server
(own_thread).
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from datetime import datetime
from urllib.parse import urlsplit

from gpulease.hub.db import utcnow
from gpulease.spawners.own_thread import in_own_thread

POLL_S = 0.01  # between tries: billing opens within ~10 ms of the server's first answer
TRY_TIMEOUT_S = 2.0


def _answered_at(host: str, port: int, path: str) -> datetime | None:
    """When the server began to answer a GET of `path` (its first byte), or None.

    The first byte is the answer: what follows, and how slowly, is the server's
    own code's to choose. Waiting for the whole of it let a server that drips its
    headers or body (each byte within the per-read timeout) open its billing
    session when it chose to finish, or hold this thread for as long as it ran.
    """
    conn = http.client.HTTPConnection(host, port, timeout=TRY_TIMEOUT_S)
    try:
        conn.request("GET", path)
        if conn.sock is not None and conn.sock.recv(1):
            return utcnow()
        return None  # closed without a word: not an answer
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def probe(url: str, still_ours: Callable[[], bool], timeout: float | None,
          cancelled: threading.Event) -> datetime | bool | None:
    """Blocking: try `url` every POLL_S; the UTC time of its first answer, False
    once `still_ours()` turns false or `cancelled` is set, None after `timeout`."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path or "/"
    deadline = None if timeout is None else time.monotonic() + timeout
    while deadline is None or time.monotonic() < deadline:
        if cancelled.is_set() or not still_ours():
            return False
        answered = _answered_at(host, port, path)
        if answered is not None:
            return answered
        cancelled.wait(POLL_S)
    return None


async def first_answer(url: str, still_ours: Callable[[], bool],
                       timeout: float | None) -> datetime | bool | None:
    """When `url` first answered (UTC); False once `still_ours()` turns false (the
    process ended, or the server is being stopped); None after `timeout` seconds
    without an answer (None: no limit). `still_ours` is called from the probe's
    thread: it must only read."""
    cancelled = threading.Event()
    try:
        return await in_own_thread(lambda: probe(url, still_ours, timeout, cancelled),
                                   "gpulease-first-answer")
    finally:
        cancelled.set()  # a cancelled wait (the spawn given up) ends its probe too
