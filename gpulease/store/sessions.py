"""Metering sessions: one row per run of a server, and the lease on metering.

A session opens when the server's code can first run (its launch), is confirmed on every
heartbeat, and closes when its devices are released: the close and its one
charge row are written in the same transaction, so a crash can never leave a
closed session unbilled or bill it twice (`ledger_entries.session_id` is
unique). Times are kept on the millisecond (a start rounded up to it, a
confirmation or an end down), and a session costs ceil(billed_ms × rate /
3,600,000) µcr, rounded once over its whole length. After a hub crash,
`recover` carries on the sessions whose servers still run and closes the
others at their last confirmation: no invented milliseconds.

Only one hub process may meter a database: `acquire_lease` refuses a second.

What a session is (and its billed time and cost) is gpulease/core/billing/sessions.py;
this module is its table's store.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, Engine, case, delete, func, insert, select, update

from gpulease.core.billing.rules import BillingError, billed_ms, parse_account, to_ms
from gpulease.core.billing.sessions import MeterConflict, Session, check_end_reason
from gpulease.core.clock import utcnow
from gpulease.core.tiers import ALL_TIERS, ON_DEMAND
from gpulease.core.units import MAX_UCR, seconds_text
from gpulease.store.db import ledger_entries, meter_lease, reading, sessions
from gpulease.store.ledger import advisory_lock

_LEASE_ID = 1
_open = sessions.c.ended_at.is_(None)


def session_from_row(row: Any) -> Session:
    return Session(row.id, row.user_name, row.server_name, row.profile_slug, row.account,
                   int(row.rate_per_hour_ucr), row.started_at, row.last_confirmed_at,
                   row.ended_at, row.end_reason, row.requested_end_reason,
                   None if row.billed_ms is None else int(row.billed_ms), row.tier,
                   row.preempted_until, row.preempt_why, row.reservation_id)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        return True
    except OSError:
        return False
    return True


class SessionLedger:
    def __init__(self, engine: Engine):
        self.engine = engine

    # --- reading ------------------------------------------------------------------
    def _select(self, *where: Any) -> list[Session]:
        with reading(self.engine) as conn:
            rows = conn.execute(select(sessions).where(*where).order_by(sessions.c.id))
            return [session_from_row(row) for row in rows]

    def get(self, session_id: int) -> Session | None:
        found = self._select(sessions.c.id == session_id)
        return found[0] if found else None

    def open_sessions(self) -> list[Session]:
        return self._select(_open)

    def open_for(self, user: str, server: str) -> Session | None:
        found = self._select(_open, sessions.c.user_name == user,
                             sessions.c.server_name == server)
        return found[0] if found else None

    def latest_by_server(self, user: str) -> dict[str, Session]:
        """Each of the user's servers' most recent session (open or closed)."""
        latest: dict[str, Session] = {}
        for session in self._select(sessions.c.user_name == user):
            latest[session.server] = session  # ordered by id: the last one wins
        return latest

    # --- writing ------------------------------------------------------------------
    def open(self, user: str, server: str, profile: str, account: str,
             rate_per_hour_ucr: int, started: dt.datetime, tier: str = ON_DEMAND,
             reservation_id: int | None = None,
             run_started: dt.datetime | None = None) -> Session:
        """Open a session; a session of the same server left open (a crash) closes first.
        `run_started`: the hub's start of the run it bills (JupyterHub's `started`, naive
        UTC), which the GPU readings name (gpulease/store/gpu_stats.py)."""
        if tier not in ALL_TIERS:
            raise BillingError(400, f"tier: {tier!r} is not one of {', '.join(ALL_TIERS)}", "tier")
        if (isinstance(rate_per_hour_ucr, bool) or not isinstance(rate_per_hour_ucr, int)
                or not 0 <= rate_per_hour_ucr <= MAX_UCR):
            raise BillingError(400, f"rate: {rate_per_hour_ucr!r} is not a non-negative "
                                    "integer of µcr per hour", "rate")
        account = parse_account(account)
        started = to_ms(started, up=True)
        with self.engine.begin() as conn:
            advisory_lock(conn, f"server:{user}/{server}")
            stale = conn.execute(select(sessions).where(
                _open, sessions.c.user_name == user, sessions.c.server_name == server)).first()
            if stale is not None:
                # Its server cannot still be running if it is starting again: bill
                # what was confirmed, nothing more.
                self._close_in(conn, stale.id, stale.last_confirmed_at, "hub_lost")
            # A server's sessions never overlap: one asked to start before the end
            # of the last (a repair from a first answer already billed, a clock
            # stepped back) starts at that end, so no moment is billed twice.
            last_end = conn.execute(select(func.max(sessions.c.ended_at)).where(
                sessions.c.user_name == user, sessions.c.server_name == server)).scalar()
            if last_end is not None and last_end > started:
                started = last_end
            new_id = conn.execute(insert(sessions).values(
                user_name=user, server_name=server, profile_slug=profile, account=account,
                rate_per_hour_ucr=rate_per_hour_ucr, started_at=started,
                last_confirmed_at=started, tier=tier, reservation_id=reservation_id,
                run_started_at=run_started,
            )).inserted_primary_key[0]
            row = conn.execute(select(sessions).where(sessions.c.id == new_id)).one()
            return session_from_row(row)

    def continue_on_demand(self, session_id: int, at: dt.datetime,
                           rate_per_hour_ucr: int) -> Session | None:
        """A reserved session whose reservation ended at `at` while its server runs on:
        closed there (reason reservation_ended, nothing charged for it) and, in the same
        transaction, an on-demand session of the same server opened from there. None
        when it is no longer open (its server stopped meanwhile)."""
        with self.engine.begin() as conn:
            row = conn.execute(select(sessions).where(sessions.c.id == session_id, _open)
                               ).first()
            if row is None:
                return None
            advisory_lock(conn, f"server:{row.user_name}/{row.server_name}")
            at = max(to_ms(at), row.started_at)
            self._close_in(conn, session_id, at, "reservation_ended")
            new_id = conn.execute(insert(sessions).values(
                user_name=row.user_name, server_name=row.server_name,
                profile_slug=row.profile_slug, account=row.account,
                rate_per_hour_ucr=rate_per_hour_ucr, started_at=at,
                last_confirmed_at=max(at, row.last_confirmed_at), tier=ON_DEMAND,
                run_started_at=row.run_started_at,  # the same run goes on
            )).inserted_primary_key[0]
            return session_from_row(conn.execute(
                select(sessions).where(sessions.c.id == new_id)).one())

    def confirm(self, session_ids: Collection[int], at: dt.datetime) -> int:
        """Confirm open sessions up to `at` in ONE statement; returns how many are open.

        The CASE keeps a later confirmation (a clock step back, a late
        heartbeat) from moving `last_confirmed_at` backwards.
        """
        ids = list(session_ids)
        if not ids:
            return 0
        at = to_ms(at)
        c = sessions.c
        with self.engine.begin() as conn:
            result = conn.execute(
                update(sessions).where(c.id.in_(ids), _open)
                .values(last_confirmed_at=case((c.last_confirmed_at < at, at),
                                               else_=c.last_confirmed_at)))
            return int(result.rowcount)

    def close(self, session_id: int, ended: dt.datetime, reason: str) -> Session | None:
        """Close and charge; closing a closed session returns it unchanged."""
        check_end_reason(reason)
        with self.engine.begin() as conn:
            return self._close_in(conn, session_id, ended, reason)

    def close_server(self, user: str, server: str, ended: dt.datetime,
                     reason: str) -> Session | None:
        """Close the open session of a server, if it has one."""
        check_end_reason(reason)
        with self.engine.begin() as conn:
            found = conn.execute(select(sessions.c.id).where(
                _open, sessions.c.user_name == user, sessions.c.server_name == server)).scalar()
            return None if found is None else self._close_in(conn, found, ended, reason)

    @staticmethod
    def _close_in(conn: Connection, session_id: int, ended: dt.datetime,
                  reason: str) -> Session | None:
        row = conn.execute(select(sessions).where(sessions.c.id == session_id)).first()
        if row is None or row.ended_at is not None:
            return None if row is None else session_from_row(row)
        ended = max(to_ms(ended), row.started_at)
        if row.preempted_until is not None and ended >= row.preempted_until:
            # A preempted spot server is billed to its deadline, however late its stop
            # (a hub that died after the deadline and before the stop included).
            ended, reason = max(row.preempted_until, row.started_at), "preempted"
        # A reason given through api/stop (idle, out_of_credit, account_cap, admin...) says
        # why the server went better than whoever noticed it stopping.
        final = row.requested_end_reason or reason
        ms = billed_ms(row.started_at, ended)
        closed = conn.execute(
            update(sessions).where(sessions.c.id == session_id, _open)
            .values(ended_at=ended, end_reason=final, billed_ms=ms))
        if closed.rowcount == 0:
            # Closed by a concurrent transaction since we read it: theirs stands.
            return session_from_row(conn.execute(select(sessions).where(
                sessions.c.id == session_id)).one())
        session = replace(session_from_row(row), ended=ended, end_reason=final, closed_ms=ms)
        conn.execute(insert(ledger_entries).values(
            account=session.account, kind="charge", amount_ucr=-session.cost(),
            note=f"{session.profile} {seconds_text(ms)} s", actor="metering",
            user_name=session.user, session_id=session.id, created_at=ended,
        ))
        return session

    def set_preemption(self, session_id: int, until: dt.datetime | None,
                       why: str | None = None) -> bool:
        """Record that an open session is being preempted until `until` (None: no more)."""
        with self.engine.begin() as conn:
            return conn.execute(update(sessions).where(sessions.c.id == session_id, _open)
                                .values(preempted_until=until,
                                        preempt_why=None if until is None else (why or "")[:500])
                                ).rowcount > 0

    def request_end_reason(self, user: str, server: str, reason: str) -> bool:
        """Record why a server is being stopped, for the close that follows."""
        check_end_reason(reason)
        with self.engine.begin() as conn:
            result = conn.execute(update(sessions).where(
                _open, sessions.c.user_name == user, sessions.c.server_name == server,
            ).values(requested_end_reason=reason))
            return result.rowcount > 0

    def recover(self, running: Callable[[str, str], bool]
                ) -> tuple[list[Session], list[Session]]:
        """After a restart: carry on sessions whose server runs, close the rest (hub_lost)."""
        carried: list[Session] = []
        closed: list[Session] = []
        for session in self.open_sessions():
            if running(session.user, session.server):
                carried.append(session)
                continue
            with self.engine.begin() as conn:
                done = self._close_in(conn, session.id, session.last_confirmed, "hub_lost")
            if done is not None:
                closed.append(done)
        return carried, closed

    # --- meter lease --------------------------------------------------------------
    def acquire_lease(self, holder: str, host: str, pid: int, ttl_s: float,
                      now: dt.datetime | None = None,
                      pid_alive: Callable[[int], bool] = pid_alive) -> None:
        """Become the one metering process, or raise MeterConflict naming who is."""
        now = now or utcnow()
        expires = now + dt.timedelta(seconds=ttl_s)
        values = {"holder": holder, "host": host, "pid": pid, "expires_at": expires}
        with self.engine.begin() as conn:
            advisory_lock(conn, "meter_lease")
            row = conn.execute(select(meter_lease).where(meter_lease.c.id == _LEASE_ID)).first()
            if row is None:
                conn.execute(insert(meter_lease).values(id=_LEASE_ID, **values))
                return
            if row.holder != holder and row.expires_at > now and (
                    row.host != host or pid_alive(row.pid)):
                raise MeterConflict(
                    f"Another hub meters this billing database: {row.holder} on host "
                    f"{row.host}, pid {row.pid}, lease until {row.expires_at:%Y-%m-%dT%H:%M:%SZ}. "
                    "Stop it, or wait for its lease to expire.")
            conn.execute(update(meter_lease).where(meter_lease.c.id == _LEASE_ID).values(**values))

    def renew_lease(self, holder: str, ttl_s: float, now: dt.datetime | None = None) -> bool:
        """Extend our lease; False if another process holds it now."""
        expires = (now or utcnow()) + dt.timedelta(seconds=ttl_s)
        with self.engine.begin() as conn:
            result = conn.execute(update(meter_lease).where(
                meter_lease.c.id == _LEASE_ID, meter_lease.c.holder == holder,
            ).values(expires_at=expires))
            return result.rowcount == 1

    def release_lease(self, holder: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(meter_lease).where(
                meter_lease.c.id == _LEASE_ID, meter_lease.c.holder == holder))
