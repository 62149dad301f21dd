"""Kernels and terminals, read from the server's own jupyter_server API through the proxy.

The culler's token needs `access:servers`. A server that does not answer
in time is reported as unknown (with why), never as quiet.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from gpulease.idle_culler.hubapi import HubClient, HubError, parse_time
from gpulease.idle_culler.signals import KernelState

NO_ANSWER = "no answer in time"


def parse_kernels(body: Any) -> tuple[KernelState, ...]:
    """`GET /api/kernels` of jupyter_server: [{id, name, last_activity, execution_state,
    connections}]."""
    if not isinstance(body, list):
        raise ValueError(f"expected a list of kernels, got {type(body).__name__}")
    return tuple(
        KernelState(
            id=str(k.get("id", "")),
            execution_state=str(k.get("execution_state") or "unknown"),
            last_activity=parse_time(k.get("last_activity")),
            connections=int(k.get("connections") or 0),
        )
        for k in body
    )


def parse_terminals(body: Any) -> datetime | None:
    """The latest `last_activity` of `GET /api/terminals` ([{name, last_activity}])."""
    if not isinstance(body, list):
        raise ValueError(f"expected a list of terminals, got {type(body).__name__}")
    times = [t for t in (parse_time(term.get("last_activity")) for term in body) if t]
    return max(times) if times else None


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return NO_ANSWER
    if isinstance(exc, HubError):
        return f"HTTP {exc.status}"
    return f"{type(exc).__name__}: {exc}"


async def _get(hub: HubClient, server_url: str, path: str, timeout_s: float, parse):
    try:
        body = await asyncio.wait_for(hub.server_json(server_url, path, timeout_s),
                                      timeout_s + 1)
        return parse(body), ""
    except Exception as exc:  # any failure is 'unknown', whatever it is
        return None, describe_error(exc)


async def read_kernels(hub: HubClient, server_url: str,
                       timeout_s: float) -> tuple[tuple[KernelState, ...] | None, str]:
    """The server's kernels, or None and why they could not be read."""
    return await _get(hub, server_url, "api/kernels", timeout_s, parse_kernels)


async def read_terminals(hub: HubClient, server_url: str,
                         timeout_s: float) -> tuple[datetime | None, str]:
    """The latest terminal activity (None: no terminal), or None and why it is unknown."""
    when, error = await _get(hub, server_url, "api/terminals", timeout_s, parse_terminals)
    if error.startswith("HTTP 404"):
        # A server without jupyter_server_terminals has no terminals at all.
        return None, ""
    return when, error
