"""Kernels and terminals, read from the server's own jupyter_server API through the proxy.

The culler's token needs `access:servers`. A server that does not answer
in time is reported as unknown (with why), never as quiet.

Servers running gpulease.singleuser answer both in one request
(`gpulease/activity`); others (an image without it) are read through
jupyter_server's own `api/kernels` and `api/terminals`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpulease.idle_culler.hubapi import HubClient, HubError, parse_time
from gpulease.idle_culler.signals import KernelState

NO_ANSWER = "no answer in time"
ACTIVITY_PATH = "gpulease/activity"
NOT_SUPPORTED = "HTTP 404"


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


@dataclass(frozen=True)
class ActivityState:
    """Kernels and terminals as one read gave them (None + error when unknown)."""

    kernels: tuple[KernelState, ...] | None
    kernels_error: str
    terminals_last_activity: datetime | None
    terminals_error: str


def parse_activity(body: Any) -> ActivityState:
    """`GET gpulease/activity`: {"kernels": [...], "terminals": [...] | null}."""
    if not isinstance(body, dict):
        raise ValueError(f"expected an object, got {type(body).__name__}")
    terminals = body.get("terminals")
    return ActivityState(
        kernels=parse_kernels(body.get("kernels")), kernels_error="",
        terminals_last_activity=None if terminals is None else parse_terminals(terminals),
        terminals_error="",
    )


async def read_activity(hub: HubClient, server_url: str, timeout_s: float) -> ActivityState:
    """Both at once; a server without the endpoint answers kernels_error NOT_SUPPORTED."""
    state, error = await _get(hub, server_url, ACTIVITY_PATH, timeout_s, parse_activity)
    if state is None:
        return ActivityState(None, error, None, error)
    return state
