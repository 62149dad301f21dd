"""The notice store and notification prefs, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import func, inspect, select

from gpulease.core.clock import utcnow
from gpulease.store.db import notices
from gpulease.store.notices import Notice, NoticeError, NoticeStore, Prefs, banner_text


@pytest.fixture
def store(engine) -> NoticeStore:
    return NoticeStore(engine)


def soon(minutes: float = 5) -> dt.datetime:
    return utcnow().replace(microsecond=0) + dt.timedelta(minutes=minutes)


def test_migration_creates_the_tables(engine):
    names = set(inspect(engine).get_table_names())
    assert {"notices", "notification_prefs"} <= names


def test_post_and_active(store):
    deadline = soon()
    n = store.post("alice", "train", "idle_warning", "will be suspended", deadline)
    assert isinstance(n, Notice) and n.id > 0 and not n.replaced
    assert (n.user, n.server, n.kind, n.deadline) == ("alice", "train", "idle_warning", deadline)
    assert n.created <= utcnow() and n.cleared is None
    store.post("alice", "", "credit_low", "credit low")
    store.post("bob", "train", "idle_warning", "bob's", soon())
    assert [x.kind for x in store.active("alice")] == ["idle_warning", "credit_low"]
    assert [x.kind for x in store.active("alice", "train")] == ["idle_warning"]
    assert [x.message for x in store.active("bob")] == ["bob's"]
    assert store.active("carol") == []


def test_an_open_notice_of_the_same_kind_is_replaced(store, engine):
    store.post("alice", "train", "idle_warning", "first", soon(5))
    again = store.post("alice", "train", "idle_warning", "second", soon(4))
    assert again.replaced
    active = store.active("alice", "train")
    assert [x.message for x in active] == ["second"]
    assert active[0].id == again.id
    with engine.connect() as conn:  # replaced in place: re-posting adds no rows
        assert conn.execute(select(func.count()).select_from(notices)).scalar() == 1
    # another server or kind is a different notice
    other = store.post("alice", "eval", "idle_warning", "eval", soon())
    assert not other.replaced and len(store.active("alice")) == 2


def test_concurrent_posts_never_duplicate(store):
    errors: list[BaseException] = []

    def post(i: int) -> None:
        try:
            store.post("alice", "train", "idle_warning", f"n{i}", soon())
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(store.active("alice", "train")) == 1


def test_clear(store):
    store.post("alice", "train", "idle_warning", "w", soon())
    store.post("alice", "train", "credit_low", "c")
    store.post("alice", "eval", "idle_warning", "w2", soon())
    assert store.clear("alice", "train", ["idle_warning"]) == 1
    assert [x.kind for x in store.active("alice", "train")] == ["credit_low"]
    assert store.clear("alice", "train", ["idle_warning"]) == 0
    assert store.clear("alice", None) == 2  # every server
    assert store.active("alice") == []
    with pytest.raises(NoticeError) as e:
        store.clear("alice", "train", ["bogus"])
    assert e.value.field == "kind"


def test_suspended_replaces_warnings_and_stays_until_the_server_starts(store):
    store.post("alice", "train", "idle_warning", "warn", soon())
    store.post("alice", "train", "max_runtime_warning", "warn2", soon(3))
    store.post("alice", "eval", "idle_warning", "other server", soon())
    store.post("alice", "train", "suspended", "Suspended after 30 min idle")
    assert [x.kind for x in store.active("alice", "train")] == ["suspended"]
    assert [x.kind for x in store.active("alice", "eval")] == ["idle_warning"]
    # a suspended notice has no deadline and never goes stale
    later = utcnow() + dt.timedelta(days=3)
    assert [x.kind for x in store.active("alice", "train", now=later)] == ["suspended"]
    assert store.server_started("alice", "train") == 1
    assert store.active("alice", "train") == []


def test_purge_deletes_old_cleared_notices_only(store):
    store.post("alice", "train", "credit_low", "old")
    store.clear("alice", "train")
    store.post("alice", "train", "credit_low", "open")
    assert store.purge(utcnow() - dt.timedelta(days=1)) == 0
    assert store.purge(utcnow() + dt.timedelta(seconds=1)) == 1
    assert [x.message for x in store.active("alice")] == ["open"]


def test_stale_warnings_are_not_shown(store):
    store.post("alice", "train", "idle_warning", "old", utcnow() - dt.timedelta(minutes=30))
    store.post("alice", "eval", "idle_warning", "due now", utcnow() - dt.timedelta(minutes=1))
    assert [x.server for x in store.active("alice")] == ["eval"]


@pytest.mark.parametrize("args, field", [
    (("", "s", "idle_warning", "m", None), "user"),
    (("a", None, "idle_warning", "m", None), "server"),
    (("a", "s", "nap", "m", None), "kind"),
    (("a", "s", "credit_low", "  ", None), "message"),
    (("a", "s", "credit_low", "x" * 2001, None), "message"),
    (("a", "s", "idle_warning", "m", None), "deadline"),
])
def test_post_validation(store, args, field):
    with pytest.raises(NoticeError) as e:
        store.post(*args)
    assert e.value.field == field and e.value.message


def test_prefs_round_trip(store):
    assert store.get_prefs("alice") == Prefs("none", "")
    assert store.set_prefs("alice", "email", " alice@example.org ") == Prefs(
        "email", "alice@example.org")
    assert store.get_prefs("alice") == Prefs("email", "alice@example.org")
    assert store.set_prefs("alice", "webhook", "") == Prefs("webhook", "")
    assert store.set_prefs("alice", "webhook", "<@U024BE7LH>").address == "<@U024BE7LH>"
    assert store.set_prefs("alice", "webhook", "Alice Liddell").address == "Alice Liddell"
    assert store.set_prefs("alice", "none", "ignored") == Prefs("none", "")
    assert store.get_prefs("bob") == Prefs()


@pytest.mark.parametrize("channel, address, field", [
    ("sms", "", "channel"),
    (None, "", "channel"),
    ("email", "", "address"),
    ("email", "not-an-address", "address"),
    ("email", "a@b", "address"),
    ("email", "a@example.org\nBcc: x@y.org", "address"),
    ("email", "a b@example.org", "address"),
    ("email", 42, "address"),
    ("webhook", "<!channel>", "address"),
    ("webhook", "@here", "address"),
    ("webhook", "https://evil.example/hook", "address"),
    ("webhook", "x" * 65, "address"),
])
def test_prefs_validation(store, channel, address, field):
    with pytest.raises(NoticeError) as e:
        store.set_prefs("alice", channel, address)
    assert e.value.field == field
    assert store.get_prefs("alice") == Prefs()


def _n(kind: str, message: str, deadline=None, minutes_ago: int = 0) -> Notice:
    created = dt.datetime(2025, 1, 1, 12, 0) - dt.timedelta(minutes=minutes_ago)
    return Notice(1, "alice", "s", kind, message, deadline, created)


def test_banner_text():
    assert banner_text([]) == ""
    t = dt.datetime(2025, 1, 1, 14, 5)
    items = [
        _n("credit_low", "Credit low."),
        _n("suspended", "Suspended old.", minutes_ago=60),
        _n("idle_warning", "Later warning.", t + dt.timedelta(minutes=3)),
        _n("max_runtime_warning", "Sooner warning.", t),
        _n("suspended", "Suspended new.", minutes_ago=1),
    ]
    assert banner_text(items) == "Sooner warning. Later warning. (and 3 more notices)"
    assert banner_text(items, limit=3).startswith("Sooner warning. Later warning. Suspended new.")
    assert banner_text(items[:1]) == "Credit low."
    assert banner_text(items[:2], limit=1) == "Suspended old. (and 1 more notice)"
