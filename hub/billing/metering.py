"""Per-second metering in the hub process: sessions, heartbeat, credit enforcement.

The pure rules (what a session costs, what a balance is) live in
`gpulease.core.billing.rules` and `gpulease.core.billing.sessions`, the stores in
`gpulease.store.ledger` and `gpulease.store.sessions`; this module is the hub-side
loop around them:

- a session opens when a server's code can first run (its launch: the process
  started with its devices, or its container started) and closes when the last
  of it has ended, with the reason the stop carried (`start_failed` for a start
  that never answered);
- every `heartbeat` seconds the sessions of servers that still run are
  confirmed in one write, so a crashed hub loses or over-bills at most one
  interval; when the database cannot be reached, servers keep running and
  what could not be written (confirmations, closes) is written when it returns;
- a server the hub counts as running with no open session (its session could
  not be written at its launch, or it was started before a restart without
  one) gets one, logged as a warning with the gap;
- accounts at or below zero have their servers stopped (`out_of_credit`), so
  do members whose monthly cap on a group account is spent (`account_cap`):
  a stop is asked on every heartbeat until the server is gone, pending or
  not, and a stop not done by the next heartbeat has its process tree killed
  (the decisions: `gpulease.core.billing.enforcement`);
- users with less than LOW_BALANCE_MINUTES left are told;
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
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from gpulease.core.billing.enforcement import (
    ACCOUNT_CAP,
    PREEMPTED,
    CapUse,
    Metered,
    Preempting,
    Repair,
    RunningServer,
    StopOrder,
    StopProgress,
    missing_sessions,
    stop_actions,
    who_must_stop,
)
from gpulease.core.billing.rules import LOW_BALANCE_MINUTES, minutes_left, month_start
from gpulease.core.billing.sessions import Key, LiveSession, Session
from gpulease.core.clock import utcnow
from gpulease.core.notices import render_account_cap
from gpulease.core.tiers import ON_DEMAND, is_preemptible
from gpulease.core.units import format_credits, seconds_text
from gpulease.hub.billing import metrics
from gpulease.store.ledger import Ledger
from gpulease.store.member_caps import capped_spends
from gpulease.store.sessions import SessionLedger

log = logging.getLogger("gpulease.metering")

class HubServers(Protocol):
    """The hub's side of the heartbeat (gpulease.hub.billing.server_control over JupyterHub)."""

    async def is_running(self, user: str, server: str) -> bool:
        """Its process runs (polls it: a dead one has its session closed there)."""

    def is_active(self, user: str, server: str) -> bool:
        """The hub still counts it: running, starting or stopping."""

    async def running(self) -> list[RunningServer]:
        """Servers the hub counts as running and ready, with what a session needs."""

    async def stop(self, user: str, server: str) -> None:
        """Start a stop as the REST API would, pending or not; none while one is in flight."""

    async def kill(self, user: str, server: str) -> int:
        """SIGKILL the server's process tree now (a stop that did not complete); how many."""


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
    # Tells a user of a notice (kind, user, server, profile, minutes, optionally its
    # (subject, text)): credit low, a cap stop; set by the hub to post a notice and
    # notify by the user's channel.
    announce: Callable[..., Awaitable[None]] | None = None
    shutting_down: bool = False
    # Writes that failed while the database was unreachable, retried each heartbeat.
    deferred: list[Callable[[], object]] = field(default_factory=list)
    # Stops the heartbeat enforces (out of credit, a member's cap) until the server is gone.
    stopping: dict[Key, StopProgress] = field(default_factory=dict)
    # Spot servers told they are preempted, stopped (reason preempted) from their deadline.
    preempting: dict[Key, Preempting] = field(default_factory=dict)
    # While the hub starts again the spawns the previous one left queued (one at a
    # time), a preemption it restored may be for a start not yet back in the queue:
    # none is taken back until they all are (gpulease.hub.servers.queue_resume.resume_then_serve).
    queue_resuming: bool = False
    # (server, reservation) pairs told that the reservation is ending (reservation_ends)
    told_of_ends: set[tuple[Key, int]] = field(default_factory=set)
    # Asks the hub for a heartbeat at a moment (set by the hub): a preempted server is
    # stopped at its deadline, not up to a heartbeat interval after it.
    beat_at: Callable[[datetime], None] | None = None
    # A stop not done after this long has the server's process tree killed; None:
    # by the next heartbeat.
    kill_after: float | None = None

    def __post_init__(self) -> None:
        self.sessions = SessionLedger(self.engine)
        self.ledger = Ledger(self.engine)

    @property
    def lease_ttl_s(self) -> float:
        return 3 * self.heartbeat_s

    @property
    def kill_after_s(self) -> float:
        # Half an interval: the next heartbeat after the first stop kills, timer jitter or not.
        return self.heartbeat_s / 2 if self.kill_after is None else self.kill_after

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
                s.id, s.profile, s.account, s.rate_per_hour_ucr, max(s.last_confirmed, now),
                s.tier, s.reservation_id)
            if s.preempted_until is not None:  # the deadline its user was told stands
                self.preempting[(s.user, s.server)] = Preempting(
                    s.preempted_until, s.preempt_why or "preempted", s.id)
                self.beat_for(s.preempted_until)
        for s in closed:
            metrics.session_closed(s.profile, s.end_reason or "hub_lost", s.billed_ms(),
                                   s.cost())
            log.warning("session %d of %s/%s closed as hub_lost at %s (%s s billed)",
                        s.id, s.user, s.server or "(default)", s.ended,
                        seconds_text(s.billed_ms()))
        metrics.OPEN_SESSIONS.set(len(self.live))

    # --- sessions -----------------------------------------------------------------

    def open(self, user: str, server: str, profile: str, account: str, rate_per_hour_ucr: int,
             started: datetime, tier: str = ON_DEMAND,
             reservation_id: int | None = None,
             run_started: datetime | None = None) -> Session:
        session = self.sessions.open(user, server, profile, account, rate_per_hour_ucr, started,
                                     tier, reservation_id, run_started)
        self.live[(user, server)] = LiveSession(session.id, profile, account, rate_per_hour_ucr,
                                                started, tier, reservation_id)
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
        preempted = self.preempting.pop((user, server), None)
        if live is None:
            return
        if self.shutting_down and reason == "user":
            reason = "hub_shutdown"
        ended = live.last_alive if reason == "server_died" else (ended or utcnow())
        if preempted is not None and preempted.session_id == live.session_id:
            # billed to the end of its grace period, however late the stop came after it
            ended = min(ended, preempted.deadline)
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
                                   session.billed_ms(), session.cost())
        return True

    # --- heartbeat ------------------------------------------------------------------

    async def heartbeat(self, hub: HubServers) -> None:
        """Confirm, repair, enforce: one pass over what the hub runs (see the module doc)."""
        now = utcnow()
        for key, live in list(self.live.items()):
            if await hub.is_running(*key):
                live.last_alive = max(live.last_alive, now)
            elif key in self.live and not hub.is_active(*key):
                # The hub no longer counts it at all, and nothing closed its
                # session (a stop that failed halfway): bill to when it was seen.
                log.warning("%s/%s: server gone with its session %d open; closing it",
                            key[0], key[1] or "(default)", live.session_id)
                await asyncio.to_thread(self.close, *key, "server_died")
        try:
            running = await hub.running()
        except Exception:  # the repair waits for the next heartbeat; the rest goes on
            log.exception("heartbeat: could not list the running servers")
            running = []
        try:
            # Database work runs in a thread: an unreachable database must not
            # freeze the hub's event loop (and so every running server's proxy).
            facts = await asyncio.to_thread(self._write_and_read, now, running)
        except SQLAlchemyError as e:
            metrics.HEARTBEAT_FAILURES.inc()
            log.error("heartbeat: billing database unreachable, servers keep running and "
                      "are billed when it returns: %s", e)
            return
        if facts is None:  # another hub meters this database now
            return
        balances, caps = facts
        self._order_stops(now, balances, caps)
        self._order_preemptions(now)
        await self._enforce_stops(hub, now)
        await self._tell_low_balances(balances)

    def _write_and_read(self, now: datetime, running: list[RunningServer]
                        ) -> tuple[dict[str, int], dict[tuple[str, str], CapUse]] | None:
        if not self._write_heartbeat(now):
            return None
        for repair in missing_sessions(running, set(self.live), now):
            self._repair(repair, now)
        accounts = {live.account for live in self.live.values()}
        balances = self.ledger.balances(accounts) if accounts else {}
        pairs = {(live.account, user) for (user, _), live in self.live.items()
                 if live.rate_per_hour_ucr > 0 and live.account.startswith("group:")}
        caps = {pair: CapUse(*figures) for pair, figures in
                capped_spends(self.engine, pairs, month_start(now)).items()}
        return balances, caps

    def _repair(self, repair: Repair, now: datetime) -> None:
        s = repair.server
        user, server = s.key
        session = self.open(user, server, s.profile, s.account, s.rate_per_hour_ucr, repair.since,
                            s.tier, s.reservation_id, run_started=s.started_at)
        # It runs now: confirmed up to now at once, so the gap is billed from this heartbeat.
        self.live[s.key].last_alive = now
        self.sessions.confirm([session.id], now)
        metrics.METERING_GAPS.inc()
        log.warning("%s/%s runs on %s with no open billing session (gap of %.0f s, since %s); "
                    "opened session %d from %s", user, server or "(default)", s.profile,
                    repair.gap_s, _iso(s.launched_at or s.started_at), session.id,
                    _iso(repair.since))

    def _write_heartbeat(self, now: datetime) -> bool:
        """Renew the lease, write what is pending, confirm; False: the lease is lost."""
        if not self.sessions.renew_lease(self.holder, self.lease_ttl_s, now=now):
            log.critical("another hub took over metering of this database; "
                         "this hub stops confirming sessions")
            self.live.clear()
            return False
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
        return True

    def _order_stops(self, now: datetime, balances: dict[str, int],
                     caps: dict[tuple[str, str], CapUse]) -> None:
        metered = [Metered(key, live.account, live.rate_per_hour_ucr)
                   for key, live in self.live.items()]
        for order in who_must_stop(metered, balances, caps):
            if order.key not in self.stopping:
                user, server = order.key
                log.warning("%s/%s: %s; stopping the server (%s)", user, server or "(default)",
                            order.why, order.reason)
                self.stopping[order.key] = StopProgress(order, now,
                                                        self.live[order.key].session_id)

    def preempt(self, key: Key, deadline: datetime, why: str, on_demand: bool = False) -> bool:
        """Stop `key`, a running server of a preemptible tier (spot; or, `on_demand`, an
        on-demand one displaced from reserved capacity: gpulease/core/capacity/displacement.py),
        from `deadline` with reason preempted. False when it is no running session of such a
        tier or is being preempted already. A server on a reservation is never preempted."""
        live = self.live.get(key)
        if live is None or key in self.preempting:
            return False
        if not (live.tier == ON_DEMAND if on_demand else is_preemptible(live.tier)):
            return False
        self.preempting[key] = Preempting(deadline, why, live.session_id)
        self.beat_for(deadline)
        return True

    def beat_for(self, deadline: datetime) -> None:
        """Heartbeats at a preemption's deadline (its stop) and once a stop may have
        failed (its kill), so neither waits for the next regular beat."""
        if self.beat_at is not None:
            self.beat_at(deadline)
            self.beat_at(deadline + timedelta(seconds=self.kill_after_s + 0.1))

    def withdraw_preemption(self, key: Key) -> bool:
        """Take back `key`'s preemption before its deadline: the start it was for is no
        longer waiting. False once its stop is ordered (or it was not being preempted)."""
        if key not in self.preempting or key in self.stopping:
            return False
        del self.preempting[key]
        return True

    def _order_preemptions(self, now: datetime) -> None:
        for key, told in list(self.preempting.items()):
            live = self.live.get(key)
            if live is None or live.session_id != told.session_id:
                del self.preempting[key]  # ended (or restarted) before its deadline
            elif now >= told.deadline and key not in self.stopping:
                log.warning("%s/%s: %s; stopping the server (%s)", key[0], key[1] or "(default)",
                            told.why, PREEMPTED)
                self.stopping[key] = StopProgress(
                    StopOrder(key, PREEMPTED, live.account, told.why), now, live.session_id)

    async def _enforce_stops(self, hub: HubServers, now: datetime) -> None:
        """Push every ordered stop until its server is gone (a stop per heartbeat, then kill)."""
        for key, progress in list(self.stopping.items()):
            user, server = key
            live = self.live.get(key)
            if live is None or live.session_id != progress.session_id:
                # Gone, its session closed with the reason. A start since (credit granted
                # and started again within a heartbeat) is another run, admitted on its
                # own credit: not this stop's to interrupt.
                del self.stopping[key]
                continue
            order = progress.order
            if key in self.live and not progress.reason_recorded:
                try:
                    await asyncio.to_thread(self.sessions.request_end_reason, user, server,
                                            order.reason)
                    progress.reason_recorded = True
                except SQLAlchemyError as e:  # tried again next heartbeat
                    log.error("could not record %s for %s/%s: %s", order.reason, user, server, e)
                if order.reason == ACCOUNT_CAP and progress.attempts == 0:
                    await self._tell_cap_stop(order)
            actions = stop_actions(progress, now, self.kill_after_s)
            if "kill" in actions:
                metrics.CREDIT_STOPS_FAILED.labels(reason=order.reason).inc()
            if "kill" in actions and await hub.kill(user, server):
                progress.killed += 1
                waited = (now - progress.first_at).total_seconds()
                log.warning("%s/%s: the %s stop had not completed after %.0f s (%d tries); "
                            "killed its processes", user, server or "(default)", order.reason,
                            waited, progress.attempts)
            progress.attempts += 1
            await hub.stop(user, server)

    async def _tell_cap_stop(self, order: StopOrder) -> None:
        if self.announce is None or order.cap is None:
            return
        user, server = order.key
        live = self.live.get(order.key)
        rendered = render_account_cap(user, server, live.profile if live else None,
                                      order.account, order.cap.cap_ucr, order.cap.spent_ucr)
        await self.announce("suspended", user, server, live.profile if live else None, None,
                            rendered)

    async def _tell_low_balances(self, balances: dict[str, int]) -> None:
        low: dict[str, str] = {}
        for (user, server), live in list(self.live.items()):
            if (user, server) in self.stopping:
                continue
            balance = balances.get(live.account, 0)
            left = minutes_left(balance, live.rate_per_hour_ucr)
            if left is not None and left < LOW_BALANCE_MINUTES:
                low[user] = (f"Low balance: {live.account} has {format_credits(balance)} credits, "
                             f"about {left} min of {live.profile}. Servers stop at zero.")
                if user not in self.low and self.announce is not None:
                    # once when the balance turns low, not every heartbeat
                    await self.announce("credit_low", user, server, live.profile, left)
        self.low = low


def _iso(moment: datetime | None) -> str:
    return "an unknown time" if moment is None else f"{moment:%Y-%m-%dT%H:%M:%SZ}"


def beat_at(when: datetime, beat: Callable[[], Awaitable[None]]) -> None:
    """Run `beat` (the hub's heartbeat) at `when`, UTC: a little after, so that the beat
    sees the moment passed. Meter.beat_at, as the hub sets it."""
    delay = max(0.0, (when - utcnow()).total_seconds()) + 0.05
    asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(beat()))
