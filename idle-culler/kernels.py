"""Kernels and terminals, read from the server's own jupyter_server API through the proxy.

The culler's token needs `access:servers`. A server that does not answer
in time is reported as unknown (with why), never as quiet.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpulease.idle_culler.hubapi import HubClient, HubError, parse_time
from gpulease.idle_culler.signals import KernelState


@dataclass(frozen=True)
class ServerActivity:
    kernels: tuple[KernelState, ...] | None
    kernels_error: str
    terminals_last_activity: datetime | None
    terminals_error: str


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
        return "no answer in time"
    if isinstance(exc, HubError):
        return f"HTTP {exc.status}"
    return f"{type(exc).__name__}: {exc}"


async def read_activity(hub: HubClient, server_url: str, timeout_s: float) -> ServerActivity:
    """Kernels and terminals of one server, each unknown on its own if it fails."""

    async def one(path: str, parse):
        try:
            body = await asyncio.wait_for(hub.server_json(server_url, path, timeout_s),
                                          timeout_s + 1)
            return parse(body), ""
        except Exception as exc:  # any failure is 'unknown', whatever it is
            return None, describe_error(exc)

    (kernels, k_err), (terms, t_err) = await asyncio.gather(
        one("api/kernels", parse_kernels), one("api/terminals", parse_terminals))
    if t_err.startswith("HTTP 404"):
        # A server without jupyter_server_terminals has no terminals at all.
        terms, t_err = None, ""
    return ServerActivity(kernels, k_err, terms, t_err)
