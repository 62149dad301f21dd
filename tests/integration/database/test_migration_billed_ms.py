"""Migration 0006 (metering to the millisecond) over rows from before it, on SQLite and
PostgreSQL: no past charge changes, and what was running bills on by the millisecond.

The rows are what metering by the second wrote: times with microseconds, and for
each closed session one charge of ceil(seconds × rate / 3600) µcr, its seconds
the interval rounded up. The old rule is written out here, not imported, so that
a change to today's code cannot make the test agree with itself.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, insert, select, text

from gpulease.store.billing_reports import report, usage
from gpulease.store.db import (
    MIGRATIONS_DIR,
    ledger_entries,
    make_engine,
    sessions,
    sqlite_url,
    upgrade,
)
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger

T0 = dt.datetime(2026, 11, 3, 9, 0, 0)
RATES = [0, 1, 1_200_000, 3_599_999, 7_000_001, 123_456_789]


def old_seconds(started: dt.datetime, ended: dt.datetime) -> int:
    micros = (ended - started) // dt.timedelta(microseconds=1)
    return max(0, -(-micros // 1_000_000))


def old_charge(seconds: int, rate: int) -> int:
    return -(-seconds * rate // 3600)


@pytest.fixture(params=["sqlite", "postgres"])
def before_0006(request, tmp_path) -> Iterator[Engine]:
    """A database migrated to 0005 only, as a hub of the previous release left it."""
    if request.param == "sqlite":
        url = sqlite_url(tmp_path / "gpulease.sqlite")
    else:
        url = request.getfixturevalue("postgres_database")
    engine = make_engine(url)
    upgrade(engine, "0005")
    yield engine
    engine.dispose()


def _old_rows(engine: Engine) -> tuple[list[dict], list[dict]]:
    """300 closed sessions with their charges and 5 open ones, written by the old rule."""
    rng = random.Random(13)
    closed, running = [], []
    lengths = [0, 1, 999, 999_999, 1_000_000, 1_000_001, 59_999_999]
    with engine.begin() as conn:
        for i in range(305):
            start = T0 + dt.timedelta(microseconds=rng.randrange(20 * 86400 * 10**6))
            length = dt.timedelta(microseconds=rng.choice(
                lengths + [rng.randrange(8 * 3600 * 10**6)]))
            rate = rng.choice(RATES)
            row = {"user_name": rng.choice(["ann", "ben"]), "server_name": f"s{i}",
                   "profile_slug": rng.choice(["cpu", "h200-1g"]),
                   "account": rng.choice(["user:ann", "group:lab"]),
                   "rate_per_hour_ucr": rate, "started_at": start,
                   "last_confirmed_at": start + length}
            if i >= 300:
                new_id = conn.execute(insert(sessions).values(**row)).inserted_primary_key[0]
                running.append({**row, "id": new_id})
                continue
            ended = start + length
            new_id = conn.execute(insert(sessions).values(
                **row, ended_at=ended, end_reason="user")).inserted_primary_key[0]
            seconds = old_seconds(start, ended)
            conn.execute(insert(ledger_entries).values(
                account=row["account"], kind="charge", amount_ucr=-old_charge(seconds, rate),
                note=f"{row['profile_slug']} {seconds}s", actor="metering",
                user_name=row["user_name"], session_id=new_id, created_at=ended))
            closed.append({**row, "id": new_id, "seconds": seconds,
                           "charge": old_charge(seconds, rate)})
        conn.execute(insert(ledger_entries).values(
            account="user:ann", kind="grant", amount_ucr=10**12, note="", actor="admin",
            created_at=T0))
    return closed, running


def _ledger_rows(engine: Engine) -> list[tuple]:
    with engine.connect() as conn:
        # The columns of 0005 (later migrations add some, e.g. reservation_id in 0010).
        columns = [ledger_entries.c[name] for name in (
            "id", "account", "kind", "amount_ucr", "note", "actor", "user_name", "session_id",
            "created_at")]
        return [tuple(r) for r in conn.execute(select(*columns).order_by(ledger_entries.c.id))]


def test_the_migration_keeps_every_past_charge(before_0006):
    engine = before_0006
    closed, running = _old_rows(engine)
    ledger_before = _ledger_rows(engine)

    upgrade(engine, "0006")

    assert _ledger_rows(engine) == ledger_before  # the ledger itself is not touched
    with engine.connect() as conn:
        stored = dict(conn.execute(select(sessions.c.id, sessions.c.billed_ms)).all())
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    assert version == "0006"
    upgrade(engine)  # the later migrations (identities, tiers) leave these rows as they are
    meter = SessionLedger(engine)
    for row in closed:
        # What it was charged for, in milliseconds: the whole seconds, times 1000.
        assert stored[row["id"]] == row["seconds"] * 1000
        session = meter.get(row["id"])
        assert session.billed_seconds() == row["seconds"]
        assert session.cost() == row["charge"], row  # recomputed by the new rule: the same
    assert all(stored[row["id"]] is None for row in running)

    # Reports over the old rows, in SQL and in Python, give the charges to the micro-credit.
    whole = {"since": T0 - dt.timedelta(days=1), "until": T0 + dt.timedelta(days=30)}
    listed = {s["server"]: s for s in usage(engine, **whole).sessions}
    for row in closed:
        assert listed[row["server_name"]]["cost"] == row["charge"]
        assert listed[row["server_name"]]["billed_ms"] == row["seconds"] * 1000
    expected: dict = defaultdict(int)
    for row in closed:
        expected[row["user_name"]] += row["charge"]
    for row in running:  # open: to the last confirmation, by the millisecond
        ms = (row["last_confirmed_at"] - row["started_at"]) // dt.timedelta(milliseconds=1)
        expected[row["user_name"]] += -(-ms * row["rate_per_hour_ucr"] // 3_600_000)
    assert {r["key"]: r["cost"] for r in report(engine, group_by="user", **whole)} == expected
    # A balance is its rows (unchanged) less what open sessions accrued, now by the ms.
    for account in ("user:ann", "group:lab"):
        rows = sum(e["amount_ucr"] for e in Ledger(engine).entries(account))
        accrued = sum(
            -(-((r["last_confirmed_at"] - r["started_at"]) // dt.timedelta(milliseconds=1))
              * r["rate_per_hour_ucr"] // 3_600_000) for r in running if r["account"] == account)
        assert Ledger(engine).balance(account, now=T0) == rows - accrued


def test_a_session_running_across_the_migration_is_billed_by_the_millisecond(before_0006):
    engine = before_0006
    start = T0 + dt.timedelta(microseconds=500_250)
    with engine.begin() as conn:
        conn.execute(insert(sessions).values(
            user_name="ann", server_name="", profile_slug="cpu", account="user:ann",
            rate_per_hour_ucr=3_600_000, started_at=start,
            last_confirmed_at=start + dt.timedelta(seconds=30)))
    upgrade(engine)
    meter = SessionLedger(engine)
    (session,) = meter.open_sessions()
    assert session.billed_ms() == 30_000  # accrued so far, by the new rule
    closed = meter.close(session.id, start + dt.timedelta(seconds=61, microseconds=100_900),
                         "user")
    # From its microsecond start (.500250) to an end put on its millisecond (61.601150
    # down to 61.601): 61,100.75 ms, billed 61,100, not the 62 s metering by the
    # second would have charged.
    assert closed.ended == T0 + dt.timedelta(seconds=61, milliseconds=601)
    assert closed.billed_ms() == 61_100 and closed.cost() == 61_100
    (charge,) = [e for e in Ledger(engine).entries() if e["kind"] == "charge"]
    assert charge["amount_ucr"] == -61_100 and charge["note"] == "cpu 61.100 s"


def _head() -> str:
    """The newest migration's id (the one a fresh upgrade ends at)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(cfg).get_current_head()


def _downgrade(engine: Engine, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)


def test_a_downgrade_that_would_lose_milliseconds_is_refused(before_0006):
    engine = before_0006
    upgrade(engine)
    meter = SessionLedger(engine)
    whole = meter.open("ann", "a", "cpu", "user:ann", 3_600_000, T0)
    meter.close(whole.id, T0 + dt.timedelta(seconds=5), "user")
    _downgrade(engine, "0005")  # nothing billed by the millisecond yet: allowed
    upgrade(engine)
    assert SessionLedger(engine).get(whole.id).billed_ms() == 5000
    by_ms = meter.open("ann", "b", "cpu", "user:ann", 3_600_000, T0)
    meter.close(by_ms.id, T0 + dt.timedelta(milliseconds=61_100), "user")
    with pytest.raises(RuntimeError, match="1 session.* billed by the millisecond"):
        _downgrade(engine, "0005")
    with engine.connect() as conn:  # nothing changed: still the newest, its milliseconds kept
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == \
            _head()
    assert SessionLedger(engine).get(by_ms.id).billed_ms() == 61_100
