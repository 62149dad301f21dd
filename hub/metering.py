"""Per-second metering in the hub process: sessions, heartbeat, credit enforcement.

The pure rules (what a session costs, what a balance is) live in
`gpulease.hub.ledger` and `gpulease.hub.sessions`; this module is the hub-side
loop around them:

- a session opens when a server first answers HTTP and closes when its devices
  are released, with the reason the stop carried;
- every `heartbeat` seconds the sessions of servers that still run are
  confirmed in one write, so a crashed hub loses or over-bills at most one
  interval; when the database cannot be reached, servers keep running and
  what could not be written (confirmations, closes) is written when it returns;
- accounts at or below zero have their servers stopped (`out_of_credit`), and
  users with less than LOW_BALANCE_MINUTES left are told;
- a lease in the database makes sure two hubs never meter the same sessions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from gpulease.hub import metrics
from gpulease.hub.db import utcnow
from gpulease.hub.ledger import LOW_BALANCE_MINUTES, Ledger, minutes_left
from gpulease.hub.sessions import Session, SessionLedger
from gpulease.hub.units import format_credits

log = logging.getLogger("gpulease.metering")

Key = tuple[str, str]  # (user, server name)


@dataclass
class LiveSession:
    """What the hub keeps in memory about an open session."""

    session_id: int
    profile: str
    account: str
    rate_per_hour_ucr: int
    last_alive: datetime
    stopping: bool = False


@dataclass
class PendingClose:
    session_id: int
    key: Key
    ended: datetime
    reason: str


@dataclass
class Meter:
    engine: Engine
    heartbeat_s: float = 15.0
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )
    live: dict[Key, LiveSession] = field(default_factory=dict)
    pending: list[PendingClose] = field(default_factory=list)
    low: dict[str, str] = field(default_factory=dict)
    # Tells a user their credit runs low (kind, user, server, profile, minutes left);
    # set by the hub to post a notice and notify by the user's channel.
    announce: Callable[[str, str, str, str, float], Awaitable[None]] | None = None
    shutting_down: bool = False
    # Writes that failed while the database was unreachable, retried each heartbeat.
    deferred: list[Callable[[], object]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sessions = SessionLedger(self.engine)
        self.ledger = Ledger(self.engine)

    @property
    def lease_ttl_s(self) -> float:
        return 3 * self.heartbeat_s

    # --- lifecycle ----------------------------------------------------------------

    def acquire_lease(self) -> None:
        """Refuse to meter (MeterConflict) while another live hub does."""
        self.sessions.acquire_lease(self.holder, socket.gethostname(), os.getpid(),
                                    self.lease_ttl_s)

    def release_lease(self) -> None:
        try:
            self.sessions.release_lease(self.holder)
        except SQLAlchemyError as e:
            log.warning("could not release the metering lease: %s", e)

    def recover(self, running: Callable[[str, str], bool]) -> None:
        """After a start: carry on the sessions whose servers still run, close the rest."""
        carried, closed = self.sessions.recover(running)
        now = utcnow()
        for s in carried:
            self.live[(s.user, s.server)] = LiveSession(
                s.id, s.profile, s.account, s.rate_per_hour_ucr, max(s.last_confirmed, now))
        for s in closed:
            metrics.session_closed(s.profile, s.end_reason or "hub_lost", s.billed_seconds(),
                                   s.cost())
            log.warning("session %d of %s/%s closed as hub_lost at %s (%d s billed)",
                        s.id, s.user, s.server or "(default)", s.ended, s.billed_seconds())
        metrics.OPEN_SESSIONS.set(len(self.live))

    # --- sessions -----------------------------------------------------------------

    def open(self, user: str, server: str, profile: str, account: str, rate_per_hour_ucr: int,
             started: datetime) -> Session:
        session = self.sessions.open(user, server, profile, account, rate_per_hour_ucr, started)
        self.live[(user, server)] = LiveSession(session.id, profile, account, rate_per_hour_ucr,
                                                started)
        metrics.OPEN_SESSIONS.set(len(self.live))
        return session

    def mark_alive(self, user: str, server: str, at: datetime | None = None) -> None:
        live = self.live.get((user, server))
        if live is not None:
            live.last_alive = max(live.last_alive, at or utcnow())

    def close(self, user: str, server: str, reason: str, ended: datetime | None = None) -> None:
        """Close the server's session; kept for later if the database is unreachable.

        A server that died is billed up to the last time it was seen alive, never
        for the time it took the hub to notice.
        """
        live = self.live.pop((user, server), None)
        metrics.OPEN_SESSIONS.set(len(self.live))
        if live is None:
            return
        if self.shutting_down and reason == "user":
            reason = "hub_shutdown"
        ended = live.last_alive if reason == "server_died" else (ended or utcnow())
        self._write_close(PendingClose(live.session_id, (user, server), ended, reason))

    def _write_close(self, close: PendingClose) -> bool:
        try:
            session = self.sessions.close(close.session_id, close.ended, close.reason)
        except SQLAlchemyError as e:
            log.error("billing database unreachable; closing session %d later: %s",
                      close.session_id, e)
            self.pending.append(close)
            return False
        if session is not None:
            metrics.session_closed(session.profile, session.end_reason or close.reason,
                                   session.billed_seconds(), session.cost())
        return True

    # --- heartbeat ------------------------------------------------------------------

    async def heartbeat(
        self,
        is_running: Callable[[str, str], Awaitable[bool]],
        stop_server: Callable[[str, str], Awaitable[None]],
    ) -> None:
        now = utcnow()
        for key, live in list(self.live.items()):
            if await is_running(*key):
                live.last_alive = max(live.last_alive, now)
        accounts = {live.account for live in self.live.values()}
        try:
            # Database work runs in a thread: an unreachable database must not
            # freeze the hub's event loop (and so every running server's proxy).
            await asyncio.to_thread(self._write_heartbeat, now)
            balances = await asyncio.to_thread(self.ledger.balances, accounts) if accounts else {}
        except SQLAlchemyError as e:
            metrics.HEARTBEAT_FAILURES.inc()
            log.error("heartbeat: billing database unreachable, servers keep running and "
                      "are billed when it returns: %s", e)
            return
        await self._enforce_credit(balances, stop_server)

    def _write_heartbeat(self, now: datetime) -> None:
        if not self.sessions.renew_lease(self.holder, self.lease_ttl_s, now=now):
            log.critical("another hub took over metering of this database; "
                         "this hub stops confirming sessions")
            self.live.clear()
            return
        pending, self.pending = self.pending, []
        for close in pending:
            self._write_close(close)
        deferred, self.deferred = self.deferred, []
        for write in deferred:
            try:
                write()
            except SQLAlchemyError:
                self.deferred.append(write)
        # Confirm each session up to when it was last seen alive, in as few
        # writes as there are distinct times (normally one).
        by_time: dict[datetime, list[int]] = {}
        for live in self.live.values():
            by_time.setdefault(live.last_alive, []).append(live.session_id)
        for at, ids in by_time.items():
            self.sessions.confirm(ids, at)

    async def _enforce_credit(
        self, balances: dict[str, int], stop_server: Callable[[str, str], Awaitable[None]]
    ) -> None:
        low: dict[str, str] = {}
        for (user, server), live in list(self.live.items()):
            balance = balances.get(live.account, 0)
            if balance <= 0 and live.rate_per_hour_ucr > 0 and not live.stopping:
                live.stopping = True
                log.warning("%s/%s: %s is out of credit (%s); stopping the server",
                            user, server or "(default)", live.account, format_credits(balance))
                try:
                    await asyncio.to_thread(
                        self.sessions.request_end_reason, user, server, "out_of_credit")
                except SQLAlchemyError as e:
                    log.error("could not record out_of_credit for %s/%s: %s", user, server, e)
                await stop_server(user, server)
                continue
            left = minutes_left(balance, live.rate_per_hour_ucr)
            if left is not None and left < LOW_BALANCE_MINUTES:
                low[user] = (f"Low balance: {live.account} has {format_credits(balance)} credits, "
                             f"about {left} min of {live.profile}. Servers stop at zero.")
                if user not in self.low and self.announce is not None:
                    # once when the balance turns low, not every heartbeat
                    await self.announce("credit_low", user, server, live.profile, left)
        self.low = low
