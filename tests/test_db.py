import pytest
from sqlalchemy import insert, inspect, select
from sqlalchemy.exc import IntegrityError

from gpulease.hub.db import assignments, utcnow


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
