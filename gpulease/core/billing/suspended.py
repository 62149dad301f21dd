"""Which of a user's servers are suspended, and how the home page says so (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gpulease.core.billing.sessions import Session
from gpulease.core.units import format_duration

# Stops gpulease made on the user's behalf: the server can be resumed as it was.
SUSPEND_REASONS = {
    "idle": "Suspended after {timeout} idle",
    "out_of_credit": "Suspended: out of credit",
    "account_cap": "Suspended: your monthly cap on {account} is spent",
    "max_runtime": "Stopped at its maximum runtime",
    "preempted": "Suspended: its spot GPU went to an on-demand start",
    "reservation_ended": "Suspended at the end of its reservation",
}


@dataclass(frozen=True)
class SuspendedServer:
    server: str
    profile: str
    reason: str
    text: str


def suspended_servers(
    latest: dict[str, Session], active: set[str], idle_timeouts: dict[str, int]
) -> list[SuspendedServer]:
    """Servers not running now whose last session ended with a suspend reason."""
    out = []
    for server, session in sorted(latest.items()):
        if server in active or session.ended is None:
            continue
        template = SUSPEND_REASONS.get(session.end_reason or "")
        if template is None:
            continue
        timeout = format_duration(idle_timeouts.get(session.profile, 0)).replace("m", " min")
        out.append(SuspendedServer(server, session.profile, session.end_reason or "",
                                   template.format(timeout=timeout, account=session.account)))
    return out
