"""The audit log: store (SQLite and PostgreSQL), retention, query parsing, profile changes."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from sqlalchemy import func, select

from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file, servers_saving
from gpulease.core.policy.options import OptionsRefused, resolve_user_options
from gpulease.core.refusal import Refusal
from gpulease.hub.service.api.audit import MAX_LIMIT, parse_audit_query
from gpulease.images import shipped_catalog
from gpulease.store.audit import (
    AuditLog,
    RetentionError,
    entry_view,
    parse_retention,
)
from gpulease.store.db import audit_log
from gpulease.store.db import profiles as profiles_table
from gpulease.store.profiles import PROFILES_FILE_ACTOR, ProfileStore

CATALOG = shipped_catalog()
CPU, SLICE, FULL = load_profiles_file(SAMPLE_PROFILES, CATALOG)
T0 = dt.datetime(2025, 3, 1, 12, 0, 0)


@pytest.fixture
def audit(engine):
    return AuditLog(engine)


@pytest.fixture
def store(engine):
    return ProfileStore(engine, CATALOG)


def count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(audit_log)).scalar_one()


# --- the store ---------------------------------------------------------------------

def test_record_and_read_newest_first_with_filters_and_paging(audit):
    for i in range(5):
        audit.record("admin" if i % 2 == 0 else "olga", "credits.grant", f"user:u{i}",
                     {"balance": "0.000000"}, {"balance": f"{i}.000000"},
                     at=T0 + dt.timedelta(days=i))
    entries, total = audit.entries()
    assert total == 5 and [e.target for e in entries] == [f"user:u{i}" for i in range(4, -1, -1)]
    assert entries[0].after == {"balance": "4.000000"} and entries[0].at == T0 + dt.timedelta(4)
    entries, total = audit.entries(actor="olga")
    assert total == 2 and [e.target for e in entries] == ["user:u3", "user:u1"]
    entries, total = audit.entries(target="user:u2")
    assert total == 1 and entries[0].actor == "admin"
    # since inclusive, until exclusive
    entries, total = audit.entries(since=T0 + dt.timedelta(1), until=T0 + dt.timedelta(3))
    assert [e.target for e in entries] == ["user:u2", "user:u1"] and total == 2
    entries, total = audit.entries(limit=2, offset=1)
    assert total == 5 and [e.target for e in entries] == ["user:u3", "user:u2"]
    assert audit.entries(action="profile.delete") == ([], 0)


def test_same_instant_keeps_insertion_order_newest_first(audit):
    for name in ("a", "b", "c"):
        audit.record("admin", "profile.create", f"profile:{name}", None, {"slug": name}, at=T0)
    assert [e.target for e in audit.entries()[0]] == ["profile:c", "profile:b", "profile:a"]


def test_record_inside_a_rolled_back_transaction_is_gone(audit, engine):
    with pytest.raises(RuntimeError), engine.begin() as conn:
        audit.record("admin", "profile.update", "profile:x", {"a": 1}, {"a": 2}, conn=conn)
        raise RuntimeError("the change failed")
    assert count(engine) == 0


def test_entry_view_is_the_api_shape(audit):
    audit.record("admin", "user.create", "user:bob", None, {"name": "bob", "admin": False},
                 at=T0)
    view = entry_view(audit.entries()[0][0])
    assert view == {"id": view["id"], "at": "2025-03-01T12:00:00Z", "actor": "admin",
                    "action": "user.create", "target": "user:bob", "before": None,
                    "after": {"name": "bob", "admin": False}}


def test_prune_deletes_only_older_than_retention(audit, engine):
    now = T0 + dt.timedelta(days=200)
    for days in (0, 19, 20, 21, 199):  # T0 + days
        audit.record("admin", "cap.set", f"group:g{days}", None, {}, at=T0 + dt.timedelta(days))
    # older than 180 days: 0 and 19; exactly 180 days old (20) stays
    assert audit.prune(dt.timedelta(days=180), now=now) == 2
    assert sorted(e.target for e in audit.entries()[0]) == ["group:g199", "group:g20",
                                                            "group:g21"]
    assert audit.prune(dt.timedelta(days=180), now=now) == 0
    assert count(engine) == 3


@pytest.mark.parametrize("text, expected", [
    ("180d", dt.timedelta(days=180)), ("1d", dt.timedelta(days=1)),
    ("2h", dt.timedelta(hours=2)), ("1h30m", dt.timedelta(minutes=90)),
    ("90s", dt.timedelta(seconds=90)), ("0", None), ("0d", None), (" 30d ", dt.timedelta(30)),
])
def test_parse_retention(text, expected):
    assert parse_retention(text) == expected


@pytest.mark.parametrize("text", ["", "180", "-1d", "1.5d", "forever", "1w", "d"])
def test_bad_retention_names_the_option_and_the_forms(text):
    with pytest.raises(RetentionError) as info:
        parse_retention(text)
    assert "audit_retention" in str(info.value) and "180d" in str(info.value)


# --- profile changes are audited in their own transaction ------------------------------

def test_profile_upsert_update_delete_are_audited_with_before_and_after(store, audit):
    assert store.upsert(CPU, actor="admin") == "created"
    assert store.upsert(CPU, actor="admin") == "unchanged"  # no entry for no change
    dearer = dataclasses.replace(CPU, price_per_hour_ucr=2_000_000)
    assert store.upsert(dearer, actor="olga") == "updated"
    assert store.delete("cpu", actor="admin") is True
    assert store.delete("cpu", actor="admin") is False
    entries, total = audit.entries(target="profile:cpu")
    assert total == 3
    deleted, updated, created = entries
    assert (created.action, created.actor, created.before) == ("profile.create", "admin", None)
    assert created.after == CPU.to_spec()
    assert (updated.action, updated.actor) == ("profile.update", "olga")
    assert updated.before == CPU.to_spec()  # stored form read back, slug and enabled included
    assert updated.after["price_per_hour"] == "2"
    assert updated.before["enabled"] is True
    assert (deleted.action, deleted.after) == ("profile.delete", None)
    assert deleted.before == dearer.to_spec()
    assert store.deleted_slugs() == {"cpu"}
    store.upsert(CPU)  # back again: no longer "deleted"; no actor, no entry
    assert store.deleted_slugs() == set() and audit.entries()[1] == 3


def test_bulk_apply_records_one_entry_per_change(store, audit):
    store.apply([CPU, SLICE], actor="admin")
    cheaper = dataclasses.replace(SLICE, price_per_hour_ucr=1)
    result = store.apply([CPU, cheaper, FULL], prune=False, actor="admin")
    assert (result.created, result.updated, result.unchanged) == (["h200-full"], ["h200-1g"],
                                                                   ["cpu"])
    store.apply([FULL], prune=True, actor="gpulease-cli")
    actions = [(e.action, e.target, e.actor) for e in audit.entries()[0]]
    assert sorted(actions[:2]) == [("profile.delete", "profile:cpu", "gpulease-cli"),
                                   ("profile.delete", "profile:h200-1g", "gpulease-cli")]
    assert sorted(actions[2:4]) == [("profile.create", "profile:h200-full", "admin"),
                                    ("profile.update", "profile:h200-1g", "admin")]
    assert sorted(actions[4:]) == [("profile.create", "profile:cpu", "admin"),
                                   ("profile.create", "profile:h200-1g", "admin")]


def test_failed_apply_leaves_neither_change_nor_record(store, audit, engine):
    class Failing(ProfileStore):
        def _write(self, conn, profile):
            outcome = super()._write(conn, profile)
            if profile.slug == "h200-full":
                raise RuntimeError("database went away")
            return outcome

    with pytest.raises(RuntimeError):
        Failing(engine, CATALOG).apply([CPU, SLICE, FULL], actor="admin")
    assert count(engine) == 0 and store.list() == []


def test_profiles_file_changes_are_audited_as_profiles_file(store, audit, tmp_path):
    path = tmp_path / "profiles.yaml"
    path.write_text(SAMPLE_PROFILES.read_text())
    store.apply_file_if_changed(path)
    entries, total = audit.entries()
    assert total == 3 and {e.actor for e in entries} == {PROFILES_FILE_ACTOR}
    assert store.apply_file_if_changed(path) is None and audit.entries()[1] == 3
    path.write_text(SAMPLE_PROFILES.read_text().replace('"0.10"', '"0.25"'))
    store.apply_file_if_changed(path)
    latest = audit.entries()[0][0]
    assert (latest.action, latest.target, latest.actor) == ("profile.update", "profile:cpu",
                                                            PROFILES_FILE_ACTOR)
    assert (latest.before["price_per_hour"], latest.after["price_per_hour"]) == ("0.1", "0.25")


def test_deleting_a_broken_row_is_audited_with_its_text(store, audit, engine):
    from sqlalchemy import insert

    with engine.begin() as conn:
        conn.execute(insert(profiles_table).values(slug="odd", spec="not json", enabled=True,
                                                   created_at=T0, updated_at=T0))
    assert store.exists("odd") and store.get("odd") is None
    assert store.delete("odd", actor="admin")
    assert audit.entries()[0][0].before == {"slug": "odd", "unreadable_spec": "not json",
                                            "enabled": True}


# --- pure parts ---------------------------------------------------------------------

def test_parse_audit_query_defaults_and_bounds():
    q = parse_audit_query({})
    assert (q.limit, q.offset, q.since, q.actor) == (100, 0, None, None)
    q = parse_audit_query({"since": "2025-01-01", "until": "2025-01-02T00:00:00Z",
                           "actor": "admin", "target": "profile:cpu", "limit": "1000",
                           "offset": "5"})
    assert q.since == dt.datetime(2025, 1, 1) and q.until == dt.datetime(2025, 1, 2)
    assert (q.actor, q.target, q.limit, q.offset) == ("admin", "profile:cpu", MAX_LIMIT, 5)


@pytest.mark.parametrize("args, field", [
    ({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit"), ({"limit": "ten"}, "limit"),
    ({"offset": "-1"}, "offset"), ({"offset": "x"}, "offset"), ({"offset": "1" * 30}, "offset"),
    ({"since": "yesterday"}, "since"), ({"until": "2025-13-01"}, "until"),
    ({"since": "2025-02-01", "until": "2025-01-01"}, "until"),
])
def test_parse_audit_query_names_the_bad_field(args, field):
    with pytest.raises(Refusal) as info:
        parse_audit_query(args)
    assert info.value.status == 400 and info.value.errors[0].field == field


def test_servers_saving_a_profile():
    users = [
        {"name": "bob", "servers": {
            "": {"user_options": {"profile": "cpu"}, "stopped": True},
            "gpu": {"user_options": {"profile": "h200-1g"}, "stopped": False, "ready": True}}},
        {"name": "alice", "servers": {
            "x": {"user_options": {"profile": ["h200-1g"]}, "stopped": True},
            "y": {"user_options": {}, "stopped": True},
            "z": {"user_options": None, "stopped": True}}},
        {"name": "carol"},
    ]
    assert servers_saving(users, "h200-1g") == [
        {"user": "alice", "server": "x", "running": False},
        {"user": "bob", "server": "gpu", "running": True},
    ]
    assert servers_saving(users, "cpu") == [{"user": "bob", "server": "", "running": False}]
    assert servers_saving(users, "h200-full") == []


def test_start_on_a_deleted_saved_profile_says_so_and_lists_choices():
    def refused(deleted):
        with pytest.raises(OptionsRefused) as info:
            resolve_user_options({"profile": "gone"}, user="bob", user_groups=set(),
                                 profiles=[CPU, SLICE], catalog=CATALOG, default_profile=None,
                                 deleted_profiles=deleted)
        return info.value

    known = refused({"gone"})
    assert known.status == 400 and known.errors[0].field == "profile"
    assert "profile 'gone' was deleted by an admin" in known.message
    assert known.message.endswith("choose a new profile for this server: cpu, h200-1g (GPU)")
    unknown = refused(set())
    assert "does not exist (it may have been deleted by an admin)" in unknown.message
    assert unknown.message.endswith("choose one of: cpu, h200-1g (GPU)")
