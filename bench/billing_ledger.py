"""Ledger throughput and usage reports: the `heartbeat` and `report` parts of bench/billing.py.

  heartbeat  1,000 open sessions (SessionLedger.open) of 1,000 accounts with a
             grant each, in a fresh SQLite file and a fresh PostgreSQL database;
             the heartbeat's database work as the hub does it -- confirm every
             session, renew the lease (Meter._write_heartbeat) and read the
             balances of all accounts (Ledger.balances) -- repeated and timed.
  report     1,000,000 closed sessions over two calendar months in a fresh
             PostgreSQL database (generated server-side with generate_series,
             then VACUUM ANALYZE); billing_reports.report for one month grouped
             by user, account and profile, and billing_reports.usage of one user.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event, insert, make_url, text

from gpulease.core.billing.rules import to_ms
from gpulease.core.billing.sessions import LiveSession
from gpulease.core.clock import utcnow
from gpulease.hub.billing.metering import Meter
from gpulease.store import billing_reports
from gpulease.store.db import ledger_entries, open_database
from gpulease.store.sessions import SessionLedger

REPORT_TARGET_MS = 500.0


# --- PostgreSQL scratch databases ----------------------------------------------------------


@contextmanager
def scratch_postgres(server_url: str, label: str) -> Iterator[str]:
    """A fresh database on the server, dropped (even with connections left) at the end."""
    server = make_url(server_url)
    name = f"gpulease_bench_{label}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# --- 3. heartbeat throughput ---------------------------------------------------------------


def open_sessions(engine: Engine, users: list[str], server: str, label: str) -> Meter:
    """One open session per user (SessionLedger.open), carried by a Meter holding the lease."""
    t0 = time.perf_counter()
    now = utcnow()
    ledger = SessionLedger(engine)
    opened = [ledger.open(u, server, "cpu", f"user:{u}", 3_600_000, now) for u in users]
    print(f"  {label}: {len(opened)} sessions opened in {time.perf_counter() - t0:.1f} s",
          flush=True)
    meter = Meter(engine, heartbeat_s=15)
    meter.acquire_lease()
    for s in opened:  # as Meter.recover builds them
        meter.live[(s.user, s.server)] = LiveSession(
            s.id, s.profile, s.account, s.rate_per_hour_ucr, s.last_confirmed)
    return meter


def time_heartbeats(meter: Meter, label: str, min_reps: int = 20, min_s: float = 3.0) -> float:
    """Heartbeats per second: Meter._write_heartbeat + Ledger.balances, as Meter.heartbeat."""
    accounts = {live.account for live in meter.live.values()}
    count = len(meter.live)
    writes: list[float] = []
    reads: list[float] = []
    started = time.perf_counter()
    now = utcnow()
    while len(writes) < min_reps or time.perf_counter() - started < min_s:
        now = utcnow()
        for live in meter.live.values():  # what heartbeat() does before writing
            live.last_alive = now
        t1 = time.perf_counter()
        meter._write_heartbeat(now)
        t2 = time.perf_counter()
        balances = meter.ledger.balances(accounts)
        t3 = time.perf_counter()
        writes.append(t2 - t1)
        reads.append(t3 - t2)
        if len(balances) != len(accounts) or len(meter.live) != count:
            raise RuntimeError(f"{label}: heartbeat lost sessions or accounts")
    total = sum(writes) + sum(reads)
    rate = len(writes) / total
    print(f"  {label}: {len(writes)} heartbeats of {count} sessions in {total:.2f} s: "
          f"write (lease + confirm) median {statistics.median(writes) * 1000:.1f} ms, "
          f"balances median {statistics.median(reads) * 1000:.1f} ms "
          f"-> {rate:.1f} heartbeats/s", flush=True)
    confirmed = meter.sessions.open_sessions()
    if len(confirmed) != count or any(s.last_confirmed != to_ms(now) for s in confirmed):
        raise RuntimeError(f"{label}: the last heartbeat did not confirm every session")
    meter.release_lease()
    return rate


def bench_heartbeat(url: str, label: str, sessions_n: int) -> float:
    engine = open_database(url)
    try:
        users = [f"hb{i:05d}" for i in range(sessions_n)]
        with engine.begin() as conn:
            conn.execute(insert(ledger_entries), [
                {"account": f"user:{u}", "kind": "grant", "amount_ucr": 1_000_000_000,
                 "note": "bench", "actor": "bench", "created_at": utcnow()} for u in users])
        return time_heartbeats(open_sessions(engine, users, "", label), label)
    finally:
        engine.dispose()


# --- 4. usage report over a million sessions ---------------------------------------------

PROFILE_RATES = {  # µcr per hour
    "cpu": 100_000, "h200-1g": 1_200_000, "h200-2g": 2_400_000, "h200-3g": 3_600_000,
    "h200-7g": 8_400_000, "h200": 9_600_000,
}
GENERATE = """
INSERT INTO sessions (user_name, server_name, profile_slug, account, rate_per_hour_ucr,
                      started_at, last_confirmed_at, ended_at, end_reason, billed_ms)
SELECT 'u' || lpad(u::text, 4, '0'),
       CASE WHEN g % 3 = 0 THEN '' ELSE 'nb' || (g % 4)::text END,
       p.slug,
       CASE WHEN random() < 0.2 THEN 'group:lab' || lpad((u % 50)::text, 2, '0')
            ELSE 'user:u' || lpad(u::text, 4, '0') END,
       p.rate, st, date_trunc('milliseconds', st + len - (random() * 15) * interval '1 second'),
       st + len, CASE WHEN g % 7 = 0 THEN 'idle' ELSE 'user' END,
       CAST(EXTRACT(EPOCH FROM len) * 1000 AS BIGINT)
FROM (SELECT g, (g * 7919) % :users AS u, g % :profiles AS pi,
             date_trunc('milliseconds', :t0 + random() * :span * interval '1 second') AS st,
             date_trunc('milliseconds',
                        (60 + power(random(), 2) * 28800) * interval '1 second') AS len
      FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g) AS x
JOIN (SELECT (ordinality - 1)::int AS pi, slug, rate
      FROM unnest(CAST(:slugs AS text[]), CAST(:rates AS bigint[])) WITH ORDINALITY
           AS t(slug, rate)) AS p USING (pi)
"""
# Sessions as metering writes them: times on the millisecond, billed_ms stored at the
# close; each closed session's charge, ceil(billed_ms × rate / 3,600,000) as
# SessionLedger.close writes it, and a grant per account.
CHARGES = """
INSERT INTO ledger_entries (account, kind, amount_ucr, note, actor, user_name, session_id,
                            created_at)
SELECT account, 'charge', -((billed_ms * rate_per_hour_ucr + 3599999) / 3600000),
       profile_slug || ' session', 'metering', user_name, id, ended_at
FROM sessions
"""
GRANTS = """
INSERT INTO ledger_entries (account, kind, amount_ucr, note, actor, created_at)
SELECT DISTINCT account, 'grant', 1000000000000, 'bench', 'bench', CAST(:at AS timestamp)
FROM sessions
"""


def month_bounds() -> tuple[dt.datetime, dt.datetime, dt.datetime]:
    """Starts of the month before last, last month and this month (naive UTC)."""
    this = utcnow().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (this - dt.timedelta(days=1)).replace(day=1)
    before = (last - dt.timedelta(days=1)).replace(day=1)
    return before, last, this


def timed(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    times: list[float] = []
    result: Any = None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times, result


def explain(engine: Engine, fn: Callable[[], Any]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the one statement `fn` runs, captured as it runs."""
    captured: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
             executemany: bool) -> None:
        captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    statement, parameters = captured[-1]
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
        lines = [row[0] for row in cursor.fetchall()]
        raw.rollback()
        return lines
    finally:
        raw.close()


def bench_report(url: str, rows: int, reps: int, sessions_n: int) -> float:
    engine = open_database(url)
    try:
        before, last, this = month_bounds()
        users = max(1, rows // 500)
        span = (this - before).total_seconds()
        t0 = time.perf_counter()
        batch = 100_000
        with engine.begin() as conn:
            conn.execute(text("SELECT setseed(0.42)"))
            for lo in range(1, rows + 1, batch):
                conn.execute(text(GENERATE), {
                    "users": users, "profiles": len(PROFILE_RATES), "t0": before,
                    "span": span, "lo": lo, "hi": min(rows, lo + batch - 1),
                    "slugs": list(PROFILE_RATES), "rates": list(PROFILE_RATES.values())})
            conn.execute(text(CHARGES))
            conn.execute(text(GRANTS), {"at": before})
        loaded = time.perf_counter() - t0
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
            in_month = conn.execute(text(
                "SELECT count(*) FROM sessions WHERE started_at >= :a AND started_at < :b"),
                {"a": last, "b": this}).scalar()
        vacuum = time.perf_counter() - t0 - loaded
        print(f"  {rows:,} sessions of {users:,} users over {before:%Y-%m} and {last:%Y-%m} "
              f"and their charge rows loaded in {loaded:.1f} s (+ VACUUM ANALYZE {vacuum:.1f} s);"
              f" {in_month:,} started in {last:%Y-%m}", flush=True)

        medians: dict[str, float] = {}
        for group_by in billing_reports.GROUP_BY:
            def run_report(group_by: str = group_by) -> list[dict[str, Any]]:
                return billing_reports.report(engine, since=last, until=this, group_by=group_by)

            run_report()  # untimed: the first run reads the table into the cache
            times, result = timed(run_report, reps)
            medians[group_by] = statistics.median(times)
            total = sum(r["sessions"] for r in result)
            print(f"  report by {group_by:<8} {len(result):>5} rows, {total:,} sessions: "
                  f"median {medians[group_by]:.0f} ms (min {min(times):.0f}, "
                  f"max {max(times):.0f}) over {reps}", flush=True)
            if total != in_month:
                raise RuntimeError(f"report by {group_by} counts {total}, not {in_month}")

        whole, _ = timed(lambda: billing_reports.report(engine, since=before, until=this,
                                                         group_by="profile"), reps)
        print(f"  report by profile over both months ({rows:,} sessions): median "
              f"{statistics.median(whole):.0f} ms", flush=True)
        who = "u0042"
        times, usage = timed(lambda: billing_reports.usage(engine, user=who, since=last,
                                                           until=this), reps)
        print(f"  usage of {who} for {last:%Y-%m}: {len(usage.sessions)} sessions, median "
              f"{statistics.median(times):.1f} ms", flush=True)

        slowest = max(medians, key=lambda k: medians[k])
        plan = explain(engine, lambda: billing_reports.report(
            engine, since=last, until=this, group_by=slowest))
        print(f"  where the time goes (report by {slowest}, EXPLAIN ANALYZE):")
        for line in plan:
            print(f"    {line}")

        # Not a figure: the heartbeat on this database, where every account has a history.
        live = [f"u{i:04d}" for i in range(min(sessions_n, users))]
        print(f"  the heartbeat with this history ({rows:,} sessions and charges):", flush=True)
        time_heartbeats(open_sessions(engine, live, "live", "postgres"), "postgres")
        return medians[slowest]
    finally:
        engine.dispose()
