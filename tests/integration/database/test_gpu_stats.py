"""The culler's GPU readings folded into open sessions (issue 47), on SQLite and PostgreSQL,
and migrations 0013 and 0014 that hold them, up and down."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, select, text

from gpulease.hub.service import billing_views as bv
from gpulease.store.billing_reports import USAGE_COLUMNS, to_csv, usage
from gpulease.store.db import MIGRATIONS_DIR, make_engine, sessions, sqlite_url, upgrade
from gpulease.store.gpu_stats import GpuSample, fold_readings, mean_activity
from gpulease.store.sessions import SessionLedger

T0 = dt.datetime(2026, 5, 4, 9)
GPU_COLUMNS = {"gpu_activity_samples", "gpu_activity_sum", "gpu_activity_peak",
               "gpu_memory_peak_bytes", "gpu_reading_source"}
COVERAGE_COLUMNS = {"gpu_activity_read_ms", "gpu_memory_read_ms", "run_started_at"}
# The server's start the culler read it for: the hub lists it before its session opens.
STARTED = T0 - dt.timedelta(seconds=5)


def sample(user: str, server: str, activity: float | None, memory: int | None, source: str,
           started: dt.datetime = STARTED) -> GpuSample:
    return GpuSample(user, server, started, activity, memory, source)


def fold(engine, samples, interval_ms: int = 10_000):
    return fold_readings(engine, samples, interval_ms)


def row(engine, session_id: int):
    with engine.connect() as conn:
        return conn.execute(select(sessions).where(sessions.c.id == session_id)).one()


def test_two_pushes_fold_into_the_open_session_only(engine):
    meter = SessionLedger(engine)
    done = meter.open("ada", "old", "h200-1g", "user:ada", 3_600_000, T0)
    fold(engine, [sample("ada", "old", 80.0, 5 * 2**30, "nvml")])
    meter.close(done.id, T0 + dt.timedelta(minutes=5), "user")
    kept = row(engine, done.id)
    ada = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, T0)
    bob = meter.open("bob", "gpu", "h200-1g", "user:bob", 3_600_000, T0)

    accepted = fold(engine, [
        sample("ada", "", 37.5, 1_000, "nvml"),
        sample("bob", "gpu", None, 2**40, "dcgm"),  # memory only: no activity sample
        sample("carol", "", 99.0, 1, "nvml"),  # no session at all: skipped
        sample("ada", "old", 100.0, 9 * 2**30, "gpm"),  # its session is closed
    ])
    fold(engine, [
        sample("ada", "", 12.5, 500, ""),  # no source named: the last one stays
        sample("bob", "gpu", 20.0, None, "gpm"),
    ])

    assert accepted == [ada.id, bob.id, None, None]
    a = row(engine, ada.id)
    assert (a.gpu_activity_samples, a.gpu_activity_sum, a.gpu_activity_peak) == (2, 50.0, 37.5)
    assert (a.gpu_activity_read_ms, a.gpu_memory_read_ms) == (20_000, 20_000)
    assert a.gpu_memory_peak_bytes == 1_000 and a.gpu_reading_source == "nvml"
    b = row(engine, bob.id)
    assert (b.gpu_activity_samples, b.gpu_activity_sum, b.gpu_activity_peak) == (1, 20.0, 20.0)
    assert b.gpu_memory_peak_bytes == 2**40 and isinstance(b.gpu_memory_peak_bytes, int)
    assert b.gpu_reading_source == "gpm"
    assert (b.gpu_activity_read_ms, b.gpu_memory_read_ms) == (10_000, 10_000)
    # A closed session keeps what it had at its close.
    assert row(engine, done.id) == kept
    assert (kept.gpu_activity_samples, kept.gpu_activity_peak) == (1, 80.0)
    with engine.connect() as conn:
        users = set(conn.execute(select(sessions.c.user_name)).scalars())
    assert "carol" not in users


def test_a_push_with_nothing_read_changes_nothing(engine):
    meter = SessionLedger(engine)
    s = meter.open("ada", "", "cpu", "user:ada", 0, T0)
    fold(engine, [sample("ada", "", None, None, "")])
    fold(engine, [])
    r = row(engine, s.id)
    assert r.gpu_activity_samples == 0
    assert (r.gpu_activity_sum, r.gpu_activity_peak, r.gpu_memory_peak_bytes,
            r.gpu_reading_source) == (None, None, None, None)


def test_usage_and_its_csv_carry_each_sessions_gpu(engine):
    meter = SessionLedger(engine)
    read = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, T0)
    unread = meter.open("ada", "b", "h200-1g", "user:ada", 3_600_000, T0 + dt.timedelta(1))
    for activity in (10.0, 20.0, 30.5):
        fold(engine, [sample("ada", "", activity, 7 * 2**30, "nvml")])
    meter.close(read.id, T0 + dt.timedelta(hours=1), "user")
    assert unread.id
    report = usage(engine, user="ada", since=T0)
    first, second = report.sessions
    assert (first["gpu_mean_activity"], first["gpu_peak_activity"]) == (20.2, 30.5)
    assert first["gpu_peak_memory_bytes"] == 7 * 2**30 and first["gpu_source"] == "nvml"
    assert second["gpu_mean_activity"] is None and second["gpu_source"] is None
    view = bv.usage_view(report.sessions, report.totals)
    assert view["sessions"][0]["gpu"] == {"mean_activity": 20.2, "peak_activity": 30.5,
                                          "peak_memory_bytes": 7 * 2**30, "source": "nvml"}
    lines = list(csv.reader(io.StringIO(to_csv(bv.csv_rows(view["sessions"]), USAGE_COLUMNS))))
    gpu_at = lines[0].index("gpu_mean_activity")
    assert lines[1][gpu_at:gpu_at + 4] == ["20.2", "30.5", str(7 * 2**30), "nvml"]
    assert lines[2][gpu_at:gpu_at + 4] == ["", "", "", ""]


def test_mean_activity():
    assert mean_activity(0, None) is None and mean_activity(3, 60.5) == 20.2
    assert mean_activity(None, 1.0) is None


@pytest.fixture(params=["sqlite", "postgres"])
def at_0012(request, tmp_path):
    url = (sqlite_url(tmp_path / "gpulease.sqlite") if request.param == "sqlite"
           else request.getfixturevalue("postgres_database"))
    engine = make_engine(url)
    upgrade(engine, "0012")
    yield engine
    engine.dispose()


def _downgrade(engine, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)


def _columns(engine) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns("sessions")}


def test_migrations_0013_and_0014_up_and_down_keep_the_sessions(at_0012):
    engine = at_0012
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO sessions (user_name, server_name, profile_slug, account, "
            "rate_per_hour_ucr, started_at, last_confirmed_at, tier) VALUES ('ada', '', "
            "'h200-1g', 'user:ada', 1000, :t, :t, 'on-demand')"), {"t": T0})
    assert not GPU_COLUMNS & _columns(engine)
    upgrade(engine, "0013")
    assert GPU_COLUMNS <= _columns(engine) and not COVERAGE_COLUMNS & _columns(engine)
    with engine.connect() as conn:
        old = conn.execute(text("SELECT gpu_activity_samples, gpu_activity_peak "
                                "FROM sessions")).one()
    assert tuple(old) == (0, None)
    upgrade(engine, "0014")
    assert COVERAGE_COLUMNS <= _columns(engine)
    with engine.connect() as conn:
        old = conn.execute(select(sessions)).one()
    # earlier sessions were covered by no reading: the rule leaves them out
    assert (old.gpu_activity_read_ms, old.gpu_memory_read_ms) == (0, 0)
    fold(engine, [sample("ada", "", 55.5, 2**35, "nvml")])
    with engine.connect() as conn:
        assert conn.execute(select(sessions.c.gpu_activity_peak,
                                   sessions.c.gpu_memory_read_ms)).one() == (55.5, 10_000)
    _downgrade(engine, "0013")
    assert GPU_COLUMNS <= _columns(engine) and not COVERAGE_COLUMNS & _columns(engine)
    _downgrade(engine, "0012")
    assert not GPU_COLUMNS & _columns(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT user_name FROM sessions")).scalars().all() == ["ada"]
    upgrade(engine)
    assert GPU_COLUMNS <= _columns(engine)


def test_a_reading_of_an_earlier_run_of_the_server_is_kept_nowhere(engine):
    """The culler's list is up to a pass old: a server stopped and started again since
    holds other devices (maybe the ones another researcher got), so a reading taken for
    its earlier run must not count in the new session."""
    meter = SessionLedger(engine)
    first = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, T0)
    meter.close(first.id, T0 + dt.timedelta(minutes=10), "user")
    again_at = T0 + dt.timedelta(minutes=11)
    again = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, again_at)
    # Read for the first run (started before it), pushed once the second is open:
    assert fold(engine, [sample("ada", "", 99.0, 2**36, "nvml", started=STARTED)]) == [None]
    # Read for a start at the very moment the first session ended: still the first run's.
    at_end = T0 + dt.timedelta(minutes=10)
    assert fold(engine, [sample("ada", "", 99.0, 2**36, "nvml", started=at_end)]) == [None]
    r = row(engine, again.id)
    assert (r.gpu_activity_samples, r.gpu_memory_peak_bytes, r.gpu_memory_read_ms) == (0, None, 0)
    # Read for the second run (the hub lists its start before its session opens): kept.
    second = again_at - dt.timedelta(seconds=2)
    assert fold(engine, [sample("ada", "", 40.0, 2**30, "nvml", started=second)]) == [again.id]
    assert row(engine, again.id).gpu_activity_peak == 40.0
    # A reading with nothing read is still accepted (the status bar shows "no reading").
    assert fold(engine, [sample("ada", "", None, None, "", started=second)]) == [again.id]


def test_a_reading_stands_for_its_interval_up_to_the_longest_the_service_takes(engine):
    s = SessionLedger(engine).open("ada", "", "h200-1g", "user:ada", 3_600_000, T0)
    fold(engine, [sample("ada", "", 1.0, 1, "nvml")], interval_ms=300_000)
    assert row(engine, s.id).gpu_memory_read_ms == 300_000  # readings every 5 minutes
    fold(engine, [sample("ada", "", 1.0, 1, "nvml")], interval_ms=900_000)
    assert row(engine, s.id).gpu_memory_read_ms == 600_000


def test_a_run_from_before_runs_were_kept_goes_on_across_a_reservation_s_end(engine):
    """A session opened before 0014 knows no run (NULL); a reservation's end carries the
    NULL on. The reserved session ended just as the on-demand one began: the same run,
    not an earlier one, so its readings still count."""
    meter = SessionLedger(engine)
    reserved = meter.open("ada", "", "h200-1g", "user:ada", 0, T0, "reserved", None)
    on_demand = meter.continue_on_demand(reserved.id, T0 + dt.timedelta(hours=1), 3_600_000)
    assert fold(engine, [sample("ada", "", 20.0, 2**31, "nvml")]) == [on_demand.id]
    # a reading of a run before the reserved one is still kept nowhere
    meter.close(on_demand.id, T0 + dt.timedelta(hours=2), "user")
    again = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, T0 + dt.timedelta(hours=3))
    assert fold(engine, [sample("ada", "", 99.0, 2**36, "nvml")]) == [None]
    assert fold(engine, [sample("ada", "", 1.0, 1, "nvml",
                                started=T0 + dt.timedelta(hours=3) - dt.timedelta(seconds=2))]
                ) == [again.id]


def test_a_session_that_knows_its_run_takes_that_run_s_readings_only(engine):
    """A session opened by a start names the hub's start of its run; a reservation's end
    that carries the run on in an on-demand session keeps it, and so do its readings."""
    meter = SessionLedger(engine)
    run = T0 - dt.timedelta(seconds=3)  # the hub's `started` of this run
    reserved = meter.open("ada", "", "h200-1g", "user:ada", 0, T0, "reserved", None,
                          run_started=run)
    assert fold(engine, [sample("ada", "", 10.0, 2**30, "nvml", started=run)]) == [reserved.id]
    on_demand = meter.continue_on_demand(reserved.id, T0 + dt.timedelta(hours=1), 3_600_000)
    # The same run goes on: its readings count in the new session...
    assert fold(engine, [sample("ada", "", 20.0, 2**31, "nvml", started=run)]) == [on_demand.id]
    assert row(engine, on_demand.id).gpu_memory_peak_bytes == 2**31
    # ...and a reading that names another start is of another run, whatever the ends say.
    other = run - dt.timedelta(minutes=5)
    assert fold(engine, [sample("ada", "", 99.0, 2**36, "nvml", started=other)]) == [None]


def test_two_lines_for_one_server_in_one_push_are_judged_each(engine):
    meter = SessionLedger(engine)
    first = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, T0, run_started=STARTED)
    meter.close(first.id, T0 + dt.timedelta(minutes=10), "user")
    run = T0 + dt.timedelta(minutes=11)
    now = meter.open("ada", "", "h200-1g", "user:ada", 3_600_000, run, run_started=run)
    accepted = fold(engine, [sample("ada", "", 99.0, 140 * 2**30, "nvml", started=STARTED),
                             sample("ada", "", 10.0, 2**30, "nvml", started=run)])
    assert accepted == [None, now.id]
    assert row(engine, now.id).gpu_memory_peak_bytes == 2**30
