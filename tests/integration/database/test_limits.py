"""Limits: the body and subject rules, the pure check, and the store (SQLite and PostgreSQL)."""

import pytest
from sqlalchemy import select

from gpulease.core.policy.limits import (
    Holding,
    Limit,
    LimitError,
    check_limits,
    parse_limit_body,
    parse_subject,
)
from gpulease.store.audit import AuditLog
from gpulease.store.db import audit_log
from gpulease.store.limits import LimitStore


def test_subjects():
    assert parse_subject("user:alice") == "user:alice"
    assert parse_subject("group:vision-lab") == "group:vision-lab"
    for bad in ("alice", "team:x", "user:", "user:a/b", "", None, 3):
        with pytest.raises(LimitError) as e:
            parse_subject(bad)
        assert e.value.errors[0][0] == "subject"


def test_body_is_checked_field_by_field():
    assert parse_limit_body({"max_gpus": 2, "max_slices": None}) == {"max_gpus": 2,
                                                                     "max_slices": None}
    assert parse_limit_body({"max_slices": 0}) == {"max_slices": 0}
    assert parse_limit_body({}) == {}
    with pytest.raises(LimitError) as e:
        parse_limit_body({"max_gpus": -1, "max_slices": "2", "gpus": 1})
    fields = [f for f, _ in e.value.errors]
    assert fields == ["gpus", "max_gpus", "max_slices"]
    assert "allowed: max_gpus, max_slices" in e.value.errors[0][1]
    for bad in (True, 1.5, "1", [1]):
        with pytest.raises(LimitError):
            parse_limit_body({"max_gpus": bad})
    with pytest.raises(LimitError):
        parse_limit_body([1, 2])


HOLD = [
    Holding("alice", "a", slices=1),
    Holding("alice", "b", gpus=2),
    Holding("bob", "", slices=1),
    Holding("carol", "q", slices=1, queued=True),
]


def _check(user="alice", server="new", gpus=0, slices=0, groups=(), members=None, table=None):
    return check_limits(user, server, gpus, slices, groups, members or {}, table or {}, HOLD)


def test_no_limit_no_refusal():
    assert _check(slices=1) is None
    assert _check(gpus=8) is None


def test_a_user_limit_counts_the_users_own_servers_of_that_kind():
    table = {"user:alice": Limit("user:alice", max_slices=1)}
    refusal = _check(slices=1, table=table)
    assert refusal is not None
    assert (refusal.subject, refusal.field, refusal.limit, refusal.held) == (
        "user:alice", "max_slices", 1, 1)
    assert refusal.servers == ("alice/a",)
    assert "max_slices 1" in refusal.message and "alice/a" in refusal.message
    # full GPUs are another limit; a CPU-only start is never limited
    assert _check(gpus=1, table=table) is None
    assert _check(table=table) is None
    # a restart of the server that holds the slice gives it up first
    assert _check(server="a", slices=1, table=table) is None


def test_gpus_count_the_cards_asked():
    table = {"user:alice": Limit("user:alice", max_gpus=3)}
    assert _check(gpus=1, table=table) is None
    refusal = _check(gpus=2, table=table)
    assert refusal.held == 2 and refusal.requested == 2 and "alice/b" in refusal.message


def test_a_group_limit_counts_all_members_queued_ones_too():
    table = {"group:lab": Limit("group:lab", max_slices=3)}
    members = {"lab": {"alice", "bob", "carol"}}
    refusal = _check(slices=1, groups=["lab"], members=members, table=table)
    assert refusal.subject == "group:lab" and refusal.held == 3
    assert set(refusal.servers) == {"alice/a", "bob/(default)", "carol/q (queued)"}
    assert "all its members together" in refusal.message
    # a group the user is not in does not limit them
    assert _check(slices=1, groups=[], members=members, table=table) is None


def test_zero_forbids():
    table = {"user:dan": Limit("user:dan", max_gpus=0)}
    assert check_limits("dan", "", 1, 0, (), {}, table, []).held == 0


def test_store_set_get_list_and_audit(engine):
    store, audit = LimitStore(engine), AuditLog(engine)
    assert store.all() == {} and store.get("user:alice") is None
    before, after = store.set("user:alice", {"max_slices": 2}, actor="admin", audit=audit)
    assert before is None and after == Limit("user:alice", None, 2)
    before, after = store.set("user:alice", {"max_gpus": 1}, actor="admin", audit=audit)
    assert before == Limit("user:alice", None, 2) and after == Limit("user:alice", 1, 2)
    store.set("group:lab", {"max_gpus": 4})
    assert list(store.all()) == ["group:lab", "user:alice"]
    # both null: no limit, no row
    _, after = store.set("user:alice", {"max_gpus": None, "max_slices": None},
                         actor="admin", audit=audit)
    assert after.empty and store.get("user:alice") is None
    with engine.connect() as conn:
        entries = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    assert [(e.actor, e.action, e.target) for e in entries] == [
        ("admin", "limits.set", "user:alice")] * 3
    assert entries[0].before is None and entries[-1].after is None
    with pytest.raises(LimitError):
        store.set("nobody", {"max_gpus": 1})
