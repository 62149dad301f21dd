"""Waiting for a server's first HTTP answer: the moment its billing session opens.

Any answer counts (whatever its status): the server is up and can be used.
A connection refused while it starts, or tornado's 599 (an HTTPClientError,
not an OSError) from a server that accepts but does not answer yet, means
"keep waiting", never a failed start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from gpulease.hub.db import utcnow

POLL_S = 0.01


async def first_answer(url: str, still_ours: Callable[[], bool],
                       timeout: float | None) -> datetime | bool | None:
    """When `url` first answered (UTC); False once `still_ours()` turns false (the
    process ended, or the server is being stopped); None after `timeout` seconds
    without an answer (None: no limit)."""
    client = AsyncHTTPClient()
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while deadline is None or loop.time() < deadline:
        if not still_ours():
            return False
        try:
            await client.fetch(url, raise_error=False, request_timeout=2, connect_timeout=1)
        except (OSError, HTTPClientError, TimeoutError):
            # Billing opens at the answer seen: a short pause keeps it within
            # ~10 ms of the server's first, and a refused connect costs little.
            await asyncio.sleep(POLL_S)
            continue
        return utcnow()
    return None
