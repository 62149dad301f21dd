"""Failed starts: the ones a server's own code failed, and the rationing of repeats.

A start counts here only when the researcher's code failed it: the server
exited before it answered, or did not answer within `http_timeout` (it is then
killed). A refusal before launch, an image that cannot be pulled, a lost node,
a preemption, the hub's shutdown or gpulease's own error is not the
researcher's doing and is never counted. Each counted start was billed for
what it ran (end reason `start_failed`); rationing keeps a loop of them from
churning the device pool: after `limit` counted failures of one user on one
profile within `window_s`, further starts of that profile are refused with
429 until the oldest of them leaves the window (`Retry-After` says when). An
admin may clear a user's count (`gpulease limits clear-failed-starts`); the
rationing and the clear are in the audit log.

`rationed_until` and `refusal` are the pure rule; `FailedStarts` the table.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, func, insert, select, update

from gpulease.core.clock import utcnow
from gpulease.core.refusal import Refusal
from gpulease.core.units import format_duration
from gpulease.store.audit import AuditLog
from gpulease.store.db import failed_starts, reading

DEFAULT_LIMIT = 3
DEFAULT_WINDOW_S = 600
ACTOR = "gpulease"  # the audit log's actor for a rationing gpulease decided


@dataclass(frozen=True)
class Rationing:
    """`limit` counted failed starts per user and profile within `window_s`; 0: off."""

    limit: int = DEFAULT_LIMIT
    window_s: int = DEFAULT_WINDOW_S

    def describe(self) -> str:
        return f"{self.limit} failed starts within {format_duration(self.window_s)}"


def rationed_until(failures: Sequence[dt.datetime], now: dt.datetime,
                   rule: Rationing) -> dt.datetime | None:
    """Until when a further start is refused (None: it is not). `failures` are the
    counted (not cleared) failed starts' times, in any order."""
    if rule.limit <= 0 or rule.window_s <= 0:
        return None
    window = dt.timedelta(seconds=rule.window_s)
    recent = sorted(t for t in failures if now - t < window)
    if len(recent) < rule.limit:
        return None
    # Refused until enough of them have left the window for one more to be allowed.
    return recent[len(recent) - rule.limit] + window


def refusal(profile: str, failures: Sequence[dt.datetime], last_why: str, now: dt.datetime,
            rule: Rationing) -> Refusal | None:
    """The 429 a further start of `profile` gets, or None when it may start."""
    until = rationed_until(failures, now, rule)
    if until is None:
        return None
    wait_s = max(1, math.ceil((until - now).total_seconds()))
    message = (f"Cannot start {profile}: its last {rule.limit} starts failed within "
               f"{format_duration(rule.window_s)} ({last_why}). Starts of {profile} are "
               f"paused until {until:%H:%M:%S} UTC (in {format_duration(wait_s)}): fix what "
               "stops your server from starting (your ~/.jupyter config, startup files, "
               "packages in your home), or ask an admin to clear this. Other profiles "
               "start as usual.")
    return Refusal(message, [("profile", message)], status=429,
                   headers={"Retry-After": str(wait_s)})


@dataclass(frozen=True)
class FailedStart:
    id: int
    user: str
    server: str
    profile: str
    at: dt.datetime
    why: str
    log_tail: str = ""  # the last lines its server wrote, as shown


TAIL_LIMIT = 8000  # characters kept of a tail: the kubelet's 2048 bytes, stripped, fit


def _row(r) -> FailedStart:
    return FailedStart(r.id, r.user_name, r.server_name, r.profile, r.at, r.why,
                       r.log_tail or "")


class FailedStarts:
    """The failed_starts table (see the module doc)."""

    def __init__(self, engine: Engine, rule: Rationing | None = None):
        self.engine = engine
        self.rule = rule or Rationing()

    def counted(self, user: str, profile: str | None = None,
                now: dt.datetime | None = None) -> list[FailedStart]:
        """The user's failed starts still counted (in the window, not cleared), oldest first."""
        now = now or utcnow()
        since = now - dt.timedelta(seconds=max(self.rule.window_s, 0))
        query = select(failed_starts).where(
            failed_starts.c.user_name == user, failed_starts.c.at > since,
            failed_starts.c.cleared_at.is_(None))
        if profile is not None:
            query = query.where(failed_starts.c.profile == profile)
        with reading(self.engine) as conn:
            rows = conn.execute(query.order_by(failed_starts.c.at)).all()
        return [_row(r) for r in rows]

    def last_by_server(self, user: str) -> dict[str, FailedStart]:
        """Each of the user's servers' most recent failed start, counted or cleared (what
        the home page shows its owner while the server stays stopped)."""
        latest = (select(failed_starts.c.server_name,
                         func.max(failed_starts.c.id).label("id"))
                  .where(failed_starts.c.user_name == user)
                  .group_by(failed_starts.c.server_name).subquery())
        query = select(failed_starts).join(latest, failed_starts.c.id == latest.c.id)
        with reading(self.engine) as conn:
            return {r.server_name: _row(r) for r in conn.execute(query).all()}

    def refusal(self, user: str, profile: str, now: dt.datetime | None = None
                ) -> Refusal | None:
        """The 429 for a start of `profile` by `user` now, or None."""
        now = now or utcnow()
        counted = self.counted(user, profile, now)
        if not counted:
            return None
        return refusal(profile, [f.at for f in counted], counted[-1].why, now, self.rule)

    def record(self, user: str, server: str, profile: str, why: str,
               at: dt.datetime | None = None, log_tail: str = "") -> bool:
        """Count one failed start (with the last lines its server wrote, as shown); True
        when it makes the user rationed on `profile` (then written to the audit log, in
        the same transaction)."""
        at = at or utcnow()
        with self.engine.begin() as conn:
            conn.execute(insert(failed_starts).values(
                user_name=user, server_name=server, profile=profile, at=at, why=why[:2000],
                log_tail=log_tail[-TAIL_LIMIT:] or None))
            since = at - dt.timedelta(seconds=max(self.rule.window_s, 0))
            times = conn.execute(select(failed_starts.c.at).where(
                failed_starts.c.user_name == user, failed_starts.c.profile == profile,
                failed_starts.c.at > since, failed_starts.c.cleared_at.is_(None))).scalars().all()
            until = rationed_until(times, at, self.rule)
            if until is None or rationed_until([t for t in times if t != at], at, self.rule):
                return False  # not rationed, or rationed already (logged then)
            AuditLog(self.engine).record(
                ACTOR, "failed_starts.rationed", f"user:{user}", None,
                {"profile": profile, "failed_starts": len(times),
                 "until": f"{until:%Y-%m-%dT%H:%M:%SZ}", "why": why[:500]}, conn=conn, at=at)
            return True

    def clear(self, user: str, actor: str, profile: str | None = None) -> int:
        """Forgive the user's counted failed starts (of `profile`, or all); how many.
        The rows stay, stamped; the clear is in the audit log."""
        now = utcnow()
        with self.engine.begin() as conn:
            where = [failed_starts.c.user_name == user, failed_starts.c.cleared_at.is_(None)]
            if profile is not None:
                where.append(failed_starts.c.profile == profile)
            cleared = conn.execute(update(failed_starts).where(*where).values(
                cleared_at=now, cleared_by=actor)).rowcount or 0
            AuditLog(self.engine).record(
                actor, "failed_starts.clear", f"user:{user}", {"failed_starts": cleared},
                {"failed_starts": 0, "profile": profile or "every profile"}, conn=conn, at=now)
        return cleared
