"""Waiting for a server's first HTTP answer: the moment it is ready.

An answer counts as JupyterHub's own readiness check counts it: a status below
500 (a 404 is the server up; a 503 is "not yet"). Billing does not wait for it:
the session opened at the launch (spawners/start/launch_billing.py), and a server
that answers gpulease below 500 but JupyterHub not (or not within
http_timeout) fails its start all the same (spawners/local/run_end.py). A connection
refused while it starts, a reset, a 5xx, or a server that accepts but does not
answer yet means "keep waiting", never a failed start by itself: the start
fails when `http_timeout` has passed.

The probe runs in a thread of its own and takes the time there, as the answer
arrives (its status line's first byte): on JupyterHub's event loop a busy moment
held the probe's next try or its resumption by 30-150 ms, once 1.4 s. A thread
per starting server (own_thread).
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime
from urllib.parse import urlsplit

from gpulease.core.clock import utcnow
from gpulease.spawners.own_thread import in_own_thread

POLL_S = 0.01  # between tries: billing opens within ~10 ms of the server's first answer
TRY_TIMEOUT_S = 2.0


STATUS_LINE = re.compile(rb"HTTP/\d(?:\.\d)? (\d{3})")


def _answered_at(host: str, port: int, path: str) -> datetime | None:
    """When the server began to answer a GET of `path` below 500 (its first byte), or
    None (no answer, or a 5xx: not ready).

    Only its status line is read: what follows, and how slowly, is the server's
    own code's to choose (a server that drips its headers or body held this
    thread for as long as it ran)."""
    conn = http.client.HTTPConnection(host, port, timeout=TRY_TIMEOUT_S)
    try:
        conn.request("GET", path)
        sock = conn.sock
        if sock is None:
            return None
        head = sock.recv(1)
        if not head:
            return None  # closed without a word: not an answer
        at = utcnow()
        while len(head) < 12 and b"\r\n" not in head:
            more = sock.recv(12 - len(head))
            if not more:
                break
            head += more
        status = STATUS_LINE.match(head)
        return at if status is not None and int(status.group(1)) < 500 else None
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
