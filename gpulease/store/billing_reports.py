"""Usage listings, admin reports and CSV over the metering sessions.

Periods select sessions by their start: `since` inclusive, `until` exclusive,
so consecutive periods never count a session twice. A closed session counts
to its end, an open one to its last confirmed heartbeat (what it owes so far).

`report` and `spend_per_day` aggregate in SQL, because a month may hold a
million sessions. Their per-session arithmetic is the same integer rule as
`units.ms_cost` and `sessions.Session.billed_ms`: a closed session's
`billed_ms` as stored at its close, an open one's interval in whole
milliseconds (rounded down); cost is ceil(ms × rate / 3,600,000) µcr, written
in integer division as whole hours × rate plus the rest rounded up (see
`_cost`: exact for every cost a BIGINT charge can hold, at any rate); billed
seconds are each session's milliseconds rounded up to the second. SQL and
Python agree to the micro-credit and the millisecond (the tests check that
they do).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Engine, Select, func, literal_column, select

from gpulease.core.billing.rules import parse_account
from gpulease.core.clock import iso_z
from gpulease.core.units import format_credits
from gpulease.store.db import reading, sessions
from gpulease.store.gpu_stats import gpu_of_row
from gpulease.store.sessions import session_from_row

__all__ = ["GPU_COLUMNS", "GROUP_BY", "USAGE_COLUMNS", "UsageReport", "report", "spend_per_day",
           "to_csv", "usage"]

GROUP_BY = {"user": "user_name", "account": "account", "profile": "profile_slug",
            "tier": "tier"}
# (reservation, then the GPU's figures, last: scripts that read the columns before
# them by position keep working)
GPU_COLUMNS = ["gpu_mean_activity", "gpu_peak_activity", "gpu_peak_memory_bytes", "gpu_source"]
USAGE_COLUMNS = ["user", "server", "profile", "tier", "account", "started", "ended",
                 "billed_seconds", "billed_ms", "cost", "end_reason", "reservation",
                 *GPU_COLUMNS]
# Integer columns that hold µcr and are written as decimal credits in CSV.
AMOUNT_COLUMNS = frozenset({"cost", "amount", "amount_ucr", "balance", "spent", "monthly"})

Period = dt.datetime | dt.date | None

# Billed milliseconds of one session row, per dialect: the stored billed_ms of
# a closed session; otherwise (an open one) its interval to the last
# confirmation in whole milliseconds, rounded down. COALESCE evaluates the
# second only where billed_ms is NULL, so the exact but slower numeric of
# PostgreSQL's EXTRACT runs for open sessions only. SQLite: stored text
# 'YYYY-MM-DD HH:MM:SS.ffffff' (SQLAlchemy's format) -> integer microseconds,
# never through julianday's float.
_END = "COALESCE(ended_at, last_confirmed_at)"
_BILLED_MS_SQL = {
    "postgresql": ("COALESCE(billed_ms, GREATEST(0, CAST(FLOOR(EXTRACT(EPOCH FROM "
                   f"({_END} - started_at)) * 1000) AS BIGINT)))"),
    "sqlite": (
        f"COALESCE(billed_ms, MAX(0, ((CAST(strftime('%s', {_END}) AS INTEGER) * 1000000"
        f" + CAST(substr({_END}, 21, 6) AS INTEGER))"
        " - (CAST(strftime('%s', started_at) AS INTEGER) * 1000000"
        " + CAST(substr(started_at, 21, 6) AS INTEGER))) / 1000))"
    ),
}
MS_PER_HOUR = 3_600_000
_DAY_SQL = {"postgresql": "CAST(started_at AS DATE)", "sqlite": "date(started_at)"}


@dataclass(frozen=True)
class UsageReport:
    sessions: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)


def _moment(value: Period) -> dt.datetime | None:
    """A date means its midnight UTC; datetimes are naive UTC already."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime(value.year, value.month, value.day)


def _filtered(query: Select, *, user: str | None, account: str | None,
              since: Period, until: Period) -> Select:
    start, end = _moment(since), _moment(until)
    if user is not None:
        query = query.where(sessions.c.user_name == user)
    if account is not None:
        query = query.where(sessions.c.account == parse_account(account))
    if start is not None:
        query = query.where(sessions.c.started_at >= start)
    if end is not None:
        query = query.where(sessions.c.started_at < end)
    return query


def usage(engine: Engine, *, user: str | None = None, account: str | None = None,
          since: Period = None, until: Period = None,
          now: dt.datetime | None = None) -> UsageReport:
    """Sessions (by start) with billed seconds and cost; `now` is not used: open
    sessions count to their last confirmation, which is what they owe."""
    query = _filtered(select(sessions), user=user, account=account, since=since, until=until)
    with reading(engine) as conn:
        rows = conn.execute(query.order_by(sessions.c.started_at, sessions.c.id)).all()
    listed = []
    for row in rows:
        s = session_from_row(row)
        listed.append({
            "user": s.user, "server": s.server, "profile": s.profile, "tier": s.tier,
            "reservation": s.reservation_id, "account": s.account,
            "started": s.started, "ended": s.ended, "billed_seconds": s.billed_seconds(),
            "billed_ms": s.billed_ms(), "cost": s.cost(), "end_reason": s.end_reason,
            **gpu_of_row(row),  # what its GPU did (the culler's readings), kept at its close
        })
    totals = {"billed_seconds": sum(r["billed_seconds"] for r in listed),
              "billed_ms": sum(r["billed_ms"] for r in listed),
              "cost": sum(r["cost"] for r in listed)}
    return UsageReport(listed, totals)


def _measured(engine: Engine, *columns: Any) -> Any:
    """A subquery of sessions with `billed` (milliseconds) beside the given columns."""
    billed = literal_column(_BILLED_MS_SQL[engine.dialect.name], BigInteger).label("billed")
    return select(*columns, sessions.c.rate_per_hour_ucr, billed)


def _cost(sub: Any) -> Any:
    # ceil(ms × rate / 3,600,000) with ms = hours × H + rest and rate = q × H + r
    # (H = 3,600,000): hours × rate + rest × q + ceil(rest × r / H). Each term is
    # at most the cost and rest × r < H², so every cost a BIGINT charge can hold
    # is exact, at any rate (rest × rate alone overflows above ~2.56e12 µcr/h).
    billed, rate = sub.c.billed, sub.c.rate_per_hour_ucr
    rest = billed % MS_PER_HOUR
    return ((billed // MS_PER_HOUR) * rate + rest * (rate // MS_PER_HOUR)
            + (rest * (rate % MS_PER_HOUR) + MS_PER_HOUR - 1) // MS_PER_HOUR)


def _seconds(sub: Any) -> Any:
    return (sub.c.billed + 999) // 1000


def report(engine: Engine, *, since: Period, until: Period,
           group_by: str) -> list[dict[str, Any]]:
    """Sessions, billed seconds and cost per user, account or profile, in SQL."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    key = sessions.c[GROUP_BY[group_by]].label("key")
    sub = _filtered(_measured(engine, key), user=None, account=None,
                    since=since, until=until).subquery()
    query = (select(sub.c.key, func.count().label("sessions"),
                    func.coalesce(func.sum(_seconds(sub)), 0).label("billed_seconds"),
                    func.coalesce(func.sum(sub.c.billed), 0).label("billed_ms"),
                    func.coalesce(func.sum(_cost(sub)), 0).label("cost"))
             .group_by(sub.c.key).order_by(sub.c.key))
    with reading(engine) as conn:
        return [{"key": r.key, "sessions": int(r.sessions),
                 "billed_seconds": int(r.billed_seconds), "billed_ms": int(r.billed_ms),
                 "cost": int(r.cost)}
                for r in conn.execute(query)]


def spend_per_day(engine: Engine, *, user: str | None, account: str | None,
                  since: Period, until: Period) -> list[tuple[dt.date, int]]:
    """Cost per UTC day of start (a session counts on the day it started).

    With both ends given every day of the period is listed, 0 where nothing
    ran, so a chart shows the gaps.
    """
    day = literal_column(_DAY_SQL[engine.dialect.name]).label("day")
    sub = _filtered(_measured(engine, day), user=user, account=account,
                    since=since, until=until).subquery()
    query = (select(sub.c.day, func.sum(_cost(sub)).label("cost"))
             .group_by(sub.c.day).order_by(sub.c.day))
    with reading(engine) as conn:
        spent = {(d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d))): int(c)
                 for d, c in conn.execute(query)}
    start, end = _moment(since), _moment(until)
    if start is None or end is None:
        return sorted(spent.items())
    days: list[tuple[dt.date, int]] = []
    current = start.date()
    while dt.datetime(current.year, current.month, current.day) < end:
        days.append((current, spent.get(current, 0)))
        current += dt.timedelta(days=1)
    return days


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in AMOUNT_COLUMNS and isinstance(value, int) and not isinstance(value, bool):
        return format_credits(value)
    if isinstance(value, dt.datetime):
        return iso_z(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def to_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """CSV with a header: amounts (see AMOUNT_COLUMNS) as decimal credits, times with Z."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(column, row.get(column)) for column in columns])
    return out.getvalue()
