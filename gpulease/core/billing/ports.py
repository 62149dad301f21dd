"""What the spawners need of the hub's meter, declared.

The hub makes one meter per process (hub/billing/metering.py's `Meter` is it) and hands it
to the spawners through their context (spawners/context.py, `meter`). Spawners
open a session when a server's code can first run and close it when its devices
are released, mark a server alive, preempt spot servers and read which sessions
run; they reach nothing else of it. Typed against this Protocol, not the hub's
class: the spawners import no hub module, and a test can hand them a meter of
its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Protocol

from gpulease.core.billing.enforcement import Preempting
from gpulease.core.billing.sessions import Key, LiveSession, Session
from gpulease.core.tiers import ON_DEMAND


class SessionRecords(Protocol):
    """The sessions' store, as far as spawners read and mark it."""

    def latest_by_server(self, user: str) -> dict[str, Session]:
        """Each of the user's servers' most recent session (open or closed)."""

    def set_preemption(self, session_id: int, until: dt.datetime | None,
                       why: str | None = None) -> bool:
        """Record that an open session is being preempted until `until` (None: no more)."""

    def request_end_reason(self, user: str, server: str, reason: str) -> bool:
        """Record why a server is being stopped, for the close that follows."""


class Announce(Protocol):
    """Post a notice the hub raises itself and tell its user by their channel; never
    raises (hub/servers/notifier.py's `announce`, bound to the hub's store and backends)."""

    def __call__(self, kind: str, user: str, server: str, profile: str | None,
                 minutes: float | None, rendered: tuple[str, str] | None = None,
                 deadline: dt.datetime | None = None) -> Awaitable[None]: ...


class Meter(Protocol):
    """The hub's meter, as the spawners use it."""

    # The open sessions, by (user, server); the spawners read them, never write.
    live: dict[Key, LiveSession]
    # Spot (or displaced) servers told they are preempted, by (user, server).
    preempting: dict[Key, Preempting]
    # While the hub restarts the spawns its predecessor left queued, no preemption is
    # taken back (hub/servers/queue_resume.py).
    queue_resuming: bool
    # Writes that failed while the database was unreachable, retried each heartbeat.
    deferred: list[Callable[[], object]]
    announce: Announce | None
    sessions: SessionRecords

    def open(self, user: str, server: str, profile: str, account: str, rate_per_hour_ucr: int,
             started: dt.datetime, tier: str = ON_DEMAND,
             reservation_id: int | None = None,
             run_started: dt.datetime | None = None) -> Session:
        """Open the server's session, billed from `started`; `run_started`: the hub's start
        of the run it bills (JupyterHub's `started`), which GPU readings name."""

    def close(self, user: str, server: str, reason: str,
              ended: dt.datetime | None = None) -> None:
        """Close the server's session (kept for later if the database is unreachable)."""

    def mark_alive(self, user: str, server: str, at: dt.datetime | None = None) -> None:
        """The server was seen alive at `at` (now): a death is billed up to here."""

    def preempt(self, key: Key, deadline: dt.datetime, why: str,
                on_demand: bool = False) -> bool:
        """Stop `key` from `deadline` with reason preempted; False if it cannot be."""

    def withdraw_preemption(self, key: Key) -> bool:
        """Take back `key`'s preemption before its deadline; False once its stop is ordered."""
