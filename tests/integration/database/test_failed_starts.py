"""The rationing of failed starts (gpulease/store/failed_starts.py): the rule, then the table
on SQLite and PostgreSQL (the `engine` fixture runs each test on both)."""

from __future__ import annotations

import datetime as dt

from gpulease.store.audit import AuditLog
from gpulease.store.failed_starts import FailedStarts, Rationing, rationed_until, refusal

T0 = dt.datetime(2026, 12, 6, 12, 0, 0)
RULE = Rationing(limit=3, window_s=600)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_under_the_limit_a_start_may_go():
    assert rationed_until([at(0), at(10)], at(20), RULE) is None


def test_at_the_limit_starts_wait_until_the_oldest_leaves_the_window():
    failures = [at(0), at(10), at(20)]
    assert rationed_until(failures, at(30), RULE) == at(600)
    assert rationed_until(failures, at(599), RULE) == at(600)
    assert rationed_until(failures, at(600), RULE) is None  # the oldest is out


def test_failures_out_of_the_window_do_not_count_and_order_does_not_matter():
    failures = [at(500), at(-100), at(510), at(-50), at(520)]
    assert rationed_until(failures, at(530), RULE) == at(1100)


def test_more_than_the_limit_waits_for_enough_of_them_to_leave():
    failures = [at(0), at(10), at(20), at(30)]
    assert rationed_until(failures, at(40), RULE) == at(610)  # one left in room for one


def test_a_zero_limit_never_refuses():
    assert rationed_until([at(0)] * 10, at(1), Rationing(0, 600)) is None


def test_the_refusal_is_a_429_naming_when_why_and_what_to_do():
    r = refusal("h200-1g", [at(0), at(10), at(20)], "it exited before it answered", at(30),
                RULE)
    assert r is not None and r.status == 429
    assert r.headers["Retry-After"] == "570"
    assert "h200-1g" in r.message and "last 3 starts failed within 10m" in r.message
    assert "it exited before it answered" in r.message
    assert "12:10:00 UTC" in r.message and "in 9m30s" in r.message
    assert "Other profiles start as usual" in r.message
    assert [e.field for e in r.errors] == ["profile"]


def test_the_table_counts_per_user_and_profile_and_audits_the_rationing_once(engine):
    store = FailedStarts(engine, RULE)
    assert not store.record("ada", "", "p", "exited", at(0))
    assert not store.record("ada", "", "other", "exited", at(1))  # another profile
    assert not store.record("bob", "", "p", "exited", at(2))  # another user
    assert not store.record("ada", "x", "p", "exited", at(3))
    assert store.refusal("ada", "p", at(4)) is None
    assert store.record("ada", "", "p", "did not answer", at(5))  # the third: rationed now
    assert not store.record("ada", "", "p", "exited", at(6))  # rationed already
    refused = store.refusal("ada", "p", at(7))
    assert refused is not None and "exited" in refused.message  # the latest why
    assert store.refusal("ada", "other", at(7)) is None
    assert store.refusal("bob", "p", at(7)) is None
    entries, _ = AuditLog(engine).entries(action="failed_starts.rationed")
    assert [(e.actor, e.target, e.after["profile"]) for e in entries] == [
        ("gpulease", "user:ada", "p")]


def test_an_admins_clear_forgives_keeps_the_rows_and_is_audited(engine):
    store = FailedStarts(engine, RULE)
    for i in range(3):
        store.record("ada", "", "p", "exited", at(i))
    store.record("ada", "", "q", "exited", at(3))
    assert store.clear("ada", "root", "p") == 3
    assert store.refusal("ada", "p", at(10)) is None
    assert [f.profile for f in store.counted("ada", None, at(10))] == ["q"]
    assert store.clear("ada", "root") == 1
    entries, _ = AuditLog(engine).entries(action="failed_starts.clear")
    assert sorted((e.actor, e.before["failed_starts"], e.after["profile"]) for e in entries) \
        == [("root", 1, "every profile"), ("root", 3, "p")]


def test_each_servers_last_failed_start_keeps_its_tail_cleared_or_not(engine):
    store = FailedStarts(engine, RULE)
    store.record("ada", "", "p", "exited", at(0), log_tail="first try")
    store.record("ada", "", "p", "exited", at(1), log_tail="ImportError: no module x")
    store.record("ada", "big", "p", "did not answer", at(2))
    store.record("bob", "", "p", "exited", at(3), log_tail="bob's")
    store.clear("ada", "root")
    last = store.last_by_server("ada")
    assert sorted(last) == ["", "big"]
    assert (last[""].at, last[""].log_tail) == (at(1), "ImportError: no module x")
    assert (last["big"].why, last["big"].log_tail) == ("did not answer", "")
    assert store.last_by_server("carol") == {}
    # a tail longer than kept keeps its end: the last lines are what say why
    store.record("carol", "", "p", "exited", at(4), log_tail="x" * 9000 + "the end")
    assert store.last_by_server("carol")[""].log_tail.endswith("the end")
