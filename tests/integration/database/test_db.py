import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
from sqlalchemy import insert, inspect, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from gpulease.core.clock import utcnow
from gpulease.store.db import assignments, reading, settings


def test_migrations_create_every_table(engine):
    names = set(inspect(engine).get_table_names())
    assert {"profiles", "settings", "assignments", "local_accounts", "user_prefs",
            "ledger_entries", "sessions", "account_caps", "meter_lease"} <= names


def test_one_open_assignment_per_device(engine):
    row = dict(device_uuid="MIG-x", node="local", user_name="a", server_name="",
               profile_slug="p", claimed_at=utcnow())
    with engine.begin() as conn:
        conn.execute(insert(assignments).values(**row))
    with pytest.raises(IntegrityError):
        with engine.begin() as conn:
            conn.execute(insert(assignments).values(**{**row, "user_name": "b"}))
    with engine.begin() as conn:
        conn.execute(assignments.update().values(released_at=utcnow()))
        conn.execute(insert(assignments).values(**{**row, "user_name": "b"}))
        holders = conn.execute(select(assignments.c.user_name)).scalars().all()
    assert sorted(holders) == ["a", "b"]


# --- reads take no write lock (gpulease/store/db.py `reading`) -----------------------------------


def _hold_write(engine):
    """Another connection in a write transaction: on SQLite BEGIN IMMEDIATE (the write
    lock), on PostgreSQL an uncommitted UPDATE of the row the test then reads."""
    holder = engine.connect()
    holder.execute(update(settings).where(settings.c.key == "k").values(value="new"))
    return holder


def test_a_read_does_not_wait_for_a_writer_and_a_write_does(engine):
    with engine.begin() as conn:
        conn.execute(insert(settings).values(key="k", value="old"))
    holder = _hold_write(engine)
    try:
        started = time.monotonic()
        with reading(engine) as conn:  # busy_timeout is 30 s: a lock wait would show
            value = conn.execute(select(settings.c.value)).scalar_one()
        assert value == "old"  # the last committed value, at once
        assert time.monotonic() - started < 1.0

        def write() -> None:
            with engine.begin() as conn:
                conn.execute(update(settings).where(settings.c.key == "k").values(value="w"))

        with ThreadPoolExecutor(1) as pool:
            writing = pool.submit(write)
            with pytest.raises(FutureTimeout):  # a writer still waits for the lock
                writing.result(timeout=0.3)
            holder.commit()
            writing.result(timeout=10)  # and goes on once it is released
    finally:
        holder.close()
    with reading(engine) as conn:
        assert conn.execute(select(settings.c.value)).scalar_one() == "w"


def test_a_write_in_a_read_fails_at_once_on_sqlite(engine):
    if engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL readers never take a write lock: reading() is a plain "
                    "transaction there")
    with pytest.raises(OperationalError, match="readonly"):
        with reading(engine) as conn:
            conn.execute(insert(settings).values(key="k", value="v"))
    # the pooled connection writes again outside reading()
    with engine.begin() as conn:
        conn.execute(insert(settings).values(key="k", value="v"))
    with reading(engine) as conn:
        assert conn.execute(select(settings.c.value)).scalar_one() == "v"
