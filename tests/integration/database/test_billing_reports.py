"""Usage listings, SQL reports and CSV, checked against Python's arithmetic on both databases."""

from __future__ import annotations

import csv
import datetime as dt
import io
import random
from collections import defaultdict

import pytest
from sqlalchemy import insert

from gpulease.core.billing.rules import billed_seconds
from gpulease.core.clock import iso_z
from gpulease.core.units import MAX_UCR, ms_cost
from gpulease.store.billing_reports import USAGE_COLUMNS, report, spend_per_day, to_csv, usage
from gpulease.store.db import sessions
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger

T0 = dt.datetime(2024, 3, 1)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def sample(engine):
    """Three closed sessions and an open one, around the period [T0, T0 + 1 day)."""
    meter = SessionLedger(engine)
    before = meter.open("alice", "early", "cpu", "user:alice", 3_600_000, at(-1))
    meter.close(before.id, at(100), "user")
    first = meter.open("alice", "", "h200-1g", "user:alice", 3_600_000, T0)  # exactly since
    meter.close(first.id, at(61.2), "user")
    lab = meter.open("bob", "big", "h200-2", "group:lab", 7_000_001, at(3600))
    meter.close(lab.id, at(3600 + 1234.000001), "idle")
    running = meter.open("alice", "x", "h200-1g", "group:lab", 1_200_000, at(7200))
    meter.confirm([running.id], at(7200 + 299.5))
    edge = meter.open("carol", "", "cpu", "user:carol", 3_600_000, at(86400))  # exactly until
    meter.close(edge.id, at(86500), "user")
    return engine


def test_usage_rows_and_period_bounds(sample):
    got = usage(sample, since=T0, until=T0 + dt.timedelta(days=1))
    assert [(r["user"], r["profile"]) for r in got.sessions] == [
        ("alice", "h200-1g"), ("bob", "h200-2"), ("alice", "h200-1g")]
    first, lab, running = got.sessions
    assert set(first) == set(USAGE_COLUMNS)
    assert first == {"user": "alice", "server": "", "profile": "h200-1g", "tier": "on-demand",
                     "reservation": None, "account": "user:alice", "started": T0, "ended": at(61.2),
                     "billed_seconds": 62, "billed_ms": 61_200, "cost": 61_200,
                     "end_reason": "user", "gpu_mean_activity": None, "gpu_peak_activity": None,
                     "gpu_peak_memory_bytes": None, "gpu_source": None}
    # 1234.000001 s: the end goes down to its millisecond, the cost is rounded once.
    assert lab["billed_ms"] == 1_234_000 and lab["billed_seconds"] == 1234
    assert lab["cost"] == -(-1_234_000 * 7_000_001 // 3_600_000)
    assert running["ended"] is None and running["end_reason"] is None
    assert running["billed_ms"] == 299_500 and running["billed_seconds"] == 300
    assert running["cost"] == 99_834  # ceil(299,500 × 1.2 credits/h)
    assert got.totals == {"billed_seconds": 62 + 1234 + 300,
                          "billed_ms": 61_200 + 1_234_000 + 299_500,
                          "cost": sum(r["cost"] for r in got.sessions)}


def test_usage_filters(sample):
    day = {"since": T0.date(), "until": (T0 + dt.timedelta(days=1)).date()}
    assert [r["server"] for r in usage(sample, user="alice", **day).sessions] == ["", "x"]
    assert [r["user"] for r in usage(sample, account="group:lab", **day).sessions] == [
        "bob", "alice"]
    assert [r["user"] for r in usage(sample, account="carol").sessions] == ["carol"]
    assert len(usage(sample).sessions) == 5
    assert usage(sample, user="nobody").totals == {"billed_seconds": 0, "billed_ms": 0,
                                                   "cost": 0}


def test_closed_costs_equal_their_charges(sample):
    charged = {r["session_id"]: -r["amount_ucr"] for r in Ledger(sample).entries()
               if r["kind"] == "charge"}
    meter = SessionLedger(sample)
    for session_id, amount in charged.items():
        assert meter.get(session_id).cost() == amount


@pytest.mark.parametrize("group_by, field", [
    ("user", "user"), ("account", "account"), ("profile", "profile")])
def test_report_equals_python_sums(engine, group_by, field):
    rng = random.Random(7)
    meter = SessionLedger(engine)
    for i in range(300):
        start = T0 + dt.timedelta(microseconds=rng.randrange(40 * 86400 * 10**6))
        user = rng.choice(["alice", "bob", "carol", "dave"])
        s = meter.open(user, f"s{i}", rng.choice(["cpu", "h200-1g", "h200-8"]),
                       rng.choice([f"user:{user}", "group:lab", "group:astro"]),
                       rng.choice([0, 1, 1_200_000, 3_600_000, 7_000_001, 123_456_789]), start)
        length = dt.timedelta(microseconds=rng.choice(
            [0, 1, 999_999, 1_000_000, 1_000_001, rng.randrange(10 * 3600 * 10**6)]))
        if i % 5 == 0:
            meter.confirm([s.id], start + length)  # stays open
        else:
            meter.close(s.id, start + length, "user")
    _rows_from_before_the_millisecond(engine, rng)
    since, until = T0 + dt.timedelta(days=3), T0 + dt.timedelta(days=34)
    expected: dict = defaultdict(lambda: {"sessions": 0, "billed_seconds": 0, "billed_ms": 0,
                                          "cost": 0})
    for row in usage(engine, since=since, until=until).sessions:
        bucket = expected[row[field]]
        bucket["sessions"] += 1
        bucket["billed_seconds"] += row["billed_seconds"]
        bucket["billed_ms"] += row["billed_ms"]
        bucket["cost"] += row["cost"]
    got = report(engine, since=since, until=until, group_by=group_by)
    assert got == [{"key": key, **expected[key]} for key in sorted(expected)]
    assert sum(r["sessions"] for r in got) < 300  # the period really cut some out


def _rows_from_before_the_millisecond(engine, rng: random.Random) -> None:
    """Rows as metering before milliseconds left them, written directly: times with
    microseconds, closed ones billed whole seconds (billed_ms as migration 0006 sets
    it), open ones carried across the upgrade, and closed ones without billed_ms."""
    rows = []
    for i in range(60):
        start = T0 + dt.timedelta(days=4, microseconds=rng.randrange(20 * 86400 * 10**6))
        end = start + dt.timedelta(microseconds=rng.randrange(1, 5 * 3600 * 10**6))
        kind = i % 3
        rows.append({
            "user_name": rng.choice(["alice", "erin"]), "server_name": f"old{i}",
            "profile_slug": "cpu", "account": rng.choice(["user:erin", "group:lab"]),
            "rate_per_hour_ucr": rng.choice([1, 3_599_999, 123_456_789]),
            "started_at": start, "last_confirmed_at": end,
            "ended_at": None if kind == 1 else end, "end_reason": None if kind == 1 else "user",
            "billed_ms": (billed_seconds(start, end) * 1000) if kind == 0 else None,
        })
    with engine.begin() as conn:
        conn.execute(insert(sessions), rows)


def test_report_refuses_unknown_grouping(engine):
    with pytest.raises(ValueError, match="user, account, profile"):
        report(engine, since=T0, until=at(1), group_by="server")
    assert report(engine, since=T0, until=at(1), group_by="user") == []


def test_spend_per_day(sample):
    days = spend_per_day(sample, user=None, account=None, since=T0 - dt.timedelta(days=1),
                         until=T0 + dt.timedelta(days=3))
    per_day = usage(sample, since=T0 - dt.timedelta(days=1), until=T0 + dt.timedelta(days=3))
    assert [d for d, _ in days] == [(T0 + dt.timedelta(days=n)).date() for n in range(-1, 3)]
    assert sum(c for _, c in days) == per_day.totals["cost"]
    assert days[0][1] == 101_000 and days[2][1] == 100_000 and days[3][1] == 0
    alice = spend_per_day(sample, user="alice", account="group:lab", since=None, until=None)
    assert alice == [(T0.date(), 99_834)]


def test_csv_columns_and_formatting(sample):
    rows = usage(sample, user="alice", since=T0).sessions
    text = to_csv(rows, USAGE_COLUMNS)
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed[0] == USAGE_COLUMNS
    assert parsed[1] == ["alice", "", "h200-1g", "on-demand", "user:alice",
                         "2024-03-01T00:00:00Z", "2024-03-01T00:01:01.200Z", "62", "61200",
                         "0.061200", "user", "", "", "", "", ""]
    assert parsed[2][6] == "" and parsed[2][8] == "299500" and parsed[2][9] == "0.099834"
    assert parsed[2][10] == ""
    assert to_csv([{"key": "x", "cost": -1_500_000, "extra": 1}], ["key", "cost", "missing"]) \
        == "key,cost,missing\r\nx,-1.500000,\r\n"


def test_iso_z():
    assert iso_z(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02T03:04:05Z"
    aware = dt.datetime(2024, 1, 2, 4, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert iso_z(aware) == "2024-01-02T03:04:05Z"
    assert iso_z(dt.datetime(2024, 1, 2, 3, 4, 5, 120_000)) == "2024-01-02T03:04:05.120Z"
    assert iso_z(dt.datetime(2024, 1, 2, 3, 4, 5, 1)) == "2024-01-02T03:04:05.000001Z"


# ceil(ms × rate / 3,600,000) with ms × rate past 64 bits: a rate above
# (2**63 - 1) // 3,599,999 µcr/h (about 2.56 million credits an hour) overflowed
# the SQL's (ms mod an hour) × rate, while Python's exact ints charged it.
@pytest.mark.parametrize("rate", [(2**63 - 1) // 3_599_999 + 1, 10**15, 2**62, MAX_UCR])
def test_sql_costs_agree_with_python_for_every_cost_a_charge_can_hold(engine, rate):
    meter = SessionLedger(engine)
    lengths = [ms for ms in (1, 999, 1_799_999, 3_599_999, 3_600_001, 7_199_999)
               if ms_cost(ms, rate) <= MAX_UCR]
    for n, ms in enumerate(lengths):  # one user and one day each: no sum past 64 bits
        start = T0 + dt.timedelta(days=n)
        s = meter.open(f"u{n}", "", "h200-8", f"user:u{n}", rate, start)
        closed = meter.close(s.id, start + dt.timedelta(milliseconds=ms), "user")
        assert closed.billed_ms() == ms
    everything = {"since": T0, "until": T0 + dt.timedelta(days=len(lengths))}
    expected = {f"u{n}": ms_cost(ms, rate) for n, ms in enumerate(lengths)}
    assert {r["user"]: r["cost"] for r in usage(engine, **everything).sessions} == expected
    assert {r["key"]: r["cost"] for r in report(engine, group_by="user", **everything)} \
        == expected
    per_day = spend_per_day(engine, user=None, account=None, **everything)
    assert [c for _, c in per_day] == [ms_cost(ms, rate) for ms in lengths]
