"""Metering sessions and the meter lease on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import os

import pytest
from sqlalchemy import select

from gpulease.core.billing.rules import BillingError
from gpulease.core.billing.sessions import END_REASONS, MeterConflict, Session
from gpulease.store.db import sessions as sessions_table
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger, pid_alive

T0 = dt.datetime(2024, 3, 10, 12, 0, 0)
RATE = 3_600_000  # 3.6 credits per hour = 1,000 µcr per second


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def charges(engine) -> list[dict]:
    return [r for r in Ledger(engine).entries() if r["kind"] == "charge"]


def test_session_arithmetic_is_pure():
    s = Session(1, "a", "", "p", "user:a", RATE, T0, at(30), None, None, None)
    assert s.billed_ms() == 30_000 and s.billed_seconds() == 30 and s.cost() == 30_000
    assert s.billed_ms(now=at(45.1)) == 45_100 and s.billed_seconds(now=at(45.1)) == 46
    assert s.cost(now=at(45.1)) == 45_100  # accrued by the millisecond, not the second
    assert s.billed_ms(now=at(45.1009)) == 45_100  # a running session's now: on the ms, down
    assert s.billed_ms(now=at(10)) == 30_000  # never less than what was confirmed
    closed = Session(1, "a", "", "p", "user:a", 1_000_001, T0, at(30), at(61.2), "user", None)
    assert closed.billed_ms(now=at(999)) == 61_200 and closed.billed_seconds() == 62
    # One rounding, over the whole session: ceil(61,200 × 1,000,001 / 3,600,000).
    assert closed.cost() == -(-61_200 * 1_000_001 // 3_600_000) == 17_001
    # A closed session is what its row says it was billed (migrated rows: whole seconds).
    old = Session(1, "a", "", "p", "user:a", 1_000_001, T0, at(30), at(61.2), "user", None,
                  closed_ms=62_000)
    assert old.billed_ms() == 62_000 and old.cost() == -(-62 * 1_000_001 // 3600) == 17_223


def test_a_session_is_billed_to_the_millisecond_with_one_rounding(engine):
    # 1 µcr an hour less than 3.6 credits: per-second rounding would charge 1 µcr
    # for each of 3 sessions of 0.4 s; one rounding per session charges each once
    # for its 400 ms: ceil(400 × 3,599,999 / 3,600,000) = 400.
    meter = SessionLedger(engine)
    start = T0 + dt.timedelta(microseconds=123_456)  # between milliseconds: rounded up
    s = meter.open("alice", "", "p", "alice", RATE - 1, start)
    assert s.started == T0 + dt.timedelta(milliseconds=124)
    meter.confirm([s.id], start + dt.timedelta(microseconds=200_999))  # down: .324
    assert meter.get(s.id).last_confirmed == T0 + dt.timedelta(milliseconds=324)
    closed = meter.close(s.id, start + dt.timedelta(microseconds=400_999), "user")
    assert closed.ended == T0 + dt.timedelta(milliseconds=524)
    assert (closed.billed_ms(), closed.billed_seconds(), closed.cost()) == (400, 1, 400)
    (charge,) = charges(engine)
    assert charge["amount_ucr"] == -400 and charge["note"] == "p 0.400 s"
    with engine.connect() as conn:
        assert conn.execute(select(sessions_table.c.billed_ms)).scalar() == 400


def test_open_confirm_close_bills_exact_milliseconds(engine):
    meter = SessionLedger(engine)
    s = meter.open("alice", "gpu", "h200-1g", "alice", RATE, T0)
    assert (s.account, s.started, s.last_confirmed, s.ended) == ("user:alice", T0, T0, None)
    assert meter.open_for("alice", "gpu") == s
    assert meter.confirm([s.id], at(60)) == 1
    assert meter.get(s.id).last_confirmed == at(60)
    closed = meter.close(s.id, at(61.2), "user")
    assert closed.ended == at(61.2) and closed.end_reason == "user"
    assert closed.billed_ms() == 61_200 and closed.billed_seconds() == 62
    assert closed.cost() == 61_200
    assert meter.get(s.id) == closed
    (charge,) = charges(engine)
    assert charge["amount_ucr"] == -61_200 and charge["session_id"] == s.id
    assert (charge["account"], charge["user_name"], charge["actor"]) == ("user:alice", "alice",
                                                                         "metering")
    assert charge["note"] == "h200-1g 61.200 s" and charge["created_at"] == at(61.2)
    assert meter.open_for("alice", "gpu") is None and meter.open_sessions() == []


def test_free_session_still_gets_its_charge_row(engine):
    meter = SessionLedger(engine)
    s = meter.open("alice", "", "cpu", "user:alice", 0, T0)
    meter.close(s.id, at(3600), "idle")
    assert [c["amount_ucr"] for c in charges(engine)] == [0]


def test_open_refuses_bad_rate_and_account(engine):
    meter = SessionLedger(engine)
    for rate in (-1, 1.5, True, 2**63):
        with pytest.raises(BillingError):
            meter.open("alice", "", "p", "user:alice", rate, T0)
    with pytest.raises(BillingError):
        meter.open("alice", "", "p", "team:x", RATE, T0)
    assert meter.open_sessions() == []


def test_confirm_never_moves_backwards_and_skips_closed(engine):
    meter = SessionLedger(engine)
    a = meter.open("a", "", "p", "a", RATE, T0)
    b = meter.open("b", "", "p", "b", RATE, T0)
    c = meter.open("c", "", "p", "c", RATE, T0)
    meter.close(c.id, at(5), "user")
    assert meter.confirm([a.id, b.id, c.id, 999_999], at(30)) == 2
    assert meter.confirm([a.id], at(20)) == 1  # still open, but stays at 30
    assert meter.get(a.id).last_confirmed == at(30)
    assert meter.get(c.id).last_confirmed == T0 and meter.get(c.id).ended == at(5)
    assert meter.confirm([], at(40)) == 0


def test_confirm_a_thousand_sessions_in_one_call(engine):
    meter = SessionLedger(engine)
    ids = [meter.open(f"u{i}", "", "p", f"u{i}", RATE, T0).id for i in range(1000)]
    assert meter.confirm(ids, at(15)) == 1000
    assert {s.last_confirmed for s in meter.open_sessions()} == {at(15)}


def test_close_is_idempotent(engine):
    meter = SessionLedger(engine)
    s = meter.open("alice", "", "p", "alice", RATE, T0)
    first = meter.close(s.id, at(10), "user")
    again = meter.close(s.id, at(99), "admin")
    assert again == first and again.end_reason == "user" and again.ended == at(10)
    assert meter.close_server("alice", "", at(99), "admin") is None
    assert len(charges(engine)) == 1
    assert meter.close(123_456, at(1), "user") is None


def test_close_before_start_bills_nothing(engine):
    meter = SessionLedger(engine)
    s = meter.open("alice", "", "p", "alice", RATE, T0)
    closed = meter.close(s.id, at(-5), "server_died")
    assert closed.ended == T0 and closed.billed_seconds() == 0
    assert [c["amount_ucr"] for c in charges(engine)] == [0]


def test_close_refuses_unknown_reason(engine):
    meter = SessionLedger(engine)
    s = meter.open("alice", "", "p", "alice", RATE, T0)
    with pytest.raises(BillingError) as err:
        meter.close(s.id, at(1), "bored")
    assert err.value.status == 400 and "hub_lost" in err.value.message
    assert meter.get(s.id).ended is None and charges(engine) == []


def test_reopen_closes_stale_session_as_hub_lost(engine):
    meter = SessionLedger(engine)
    old = meter.open("alice", "gpu", "p", "alice", RATE, T0)
    meter.confirm([old.id], at(45))
    new = meter.open("alice", "gpu", "p2", "alice", RATE, at(600))
    stale = meter.get(old.id)
    assert stale.ended == at(45) and stale.end_reason == "hub_lost"
    assert meter.open_sessions() == [new]
    assert [c["amount_ucr"] for c in charges(engine)] == [-45_000]


def test_requested_end_reason_wins(engine):
    meter = SessionLedger(engine)
    meter.open("alice", "gpu", "p", "alice", RATE, T0)
    assert meter.request_end_reason("alice", "gpu", "idle") is True
    assert meter.request_end_reason("alice", "other", "idle") is False
    with pytest.raises(BillingError):
        meter.request_end_reason("alice", "gpu", "sleepy")
    closed = meter.close_server("alice", "gpu", at(1800), "user")
    assert closed.end_reason == "idle" and closed.requested_end_reason == "idle"
    assert set(END_REASONS) >= {"idle", "user", "hub_lost"}


def test_recover_carries_running_and_closes_dead_at_last_confirmation(engine):
    meter = SessionLedger(engine)
    alive = meter.open("alice", "gpu", "p", "alice", RATE, T0)
    dead = meter.open("bob", "gpu", "p", "bob", RATE, T0)
    meter.confirm([alive.id, dead.id], at(90.5017))
    carried, closed = meter.recover(lambda user, server: user == "alice")
    assert carried == [meter.get(alive.id)] and carried[0].started == T0
    assert carried[0].ended is None
    (gone,) = closed
    # Billed to its last confirmation, on the millisecond: nothing past it invented.
    assert gone.id == dead.id and gone.ended == at(90.501) and gone.end_reason == "hub_lost"
    assert gone.billed_ms() == 90_501 and gone.billed_seconds() == 91
    assert [c["amount_ucr"] for c in charges(engine)] == [-90_501]
    # The carried session continues with no gap: the next heartbeat confirms it.
    assert meter.confirm([alive.id], at(105)) == 1
    assert meter.close(alive.id, at(110), "user").billed_seconds() == 110


def test_open_index_allows_one_open_session_per_server(engine):
    meter = SessionLedger(engine)
    meter.open("alice", "gpu", "p", "alice", RATE, T0)
    meter.open("alice", "gpu", "p", "alice", RATE, at(10))
    with engine.connect() as conn:
        rows = conn.execute(select(sessions_table.c.ended_at)).all()
    assert sorted(r.ended_at is None for r in rows) == [False, True]


# --- meter lease ----------------------------------------------------------------------
def test_second_holder_refused_naming_host_and_pid(engine):
    meter = SessionLedger(engine)
    meter.acquire_lease("hub-a", "node1", 4242, 60, now=T0, pid_alive=lambda pid: True)
    meter.acquire_lease("hub-a", "node1", 4242, 60, now=at(10))  # re-acquire is a renewal
    with pytest.raises(MeterConflict) as err:
        meter.acquire_lease("hub-b", "node2", 77, 60, now=at(20), pid_alive=lambda pid: False)
    assert err.value.status == 409
    assert "node1" in err.value.message and "4242" in err.value.message
    with pytest.raises(BillingError):  # same host, live pid
        meter.acquire_lease("hub-b", "node1", 77, 60, now=at(20), pid_alive=lambda pid: True)


def test_dead_pid_on_same_host_taken_over_at_once(engine):
    meter = SessionLedger(engine)
    meter.acquire_lease("hub-a", "node1", 4242, 3600, now=T0)
    seen: list[int] = []
    meter.acquire_lease("hub-b", "node1", 77, 60, now=at(1),
                        pid_alive=lambda pid: seen.append(pid) or False)
    assert seen == [4242]
    assert meter.renew_lease("hub-a", 60, now=at(2)) is False
    assert meter.renew_lease("hub-b", 60, now=at(2)) is True


def test_expired_lease_taken_over_and_renew_fails_after(engine):
    meter = SessionLedger(engine)
    meter.acquire_lease("hub-a", "node1", 4242, 30, now=T0)
    assert meter.renew_lease("hub-a", 30, now=at(20)) is True  # now until at(50)
    with pytest.raises(MeterConflict):
        meter.acquire_lease("hub-b", "node2", 77, 30, now=at(49), pid_alive=lambda pid: True)
    meter.acquire_lease("hub-b", "node2", 77, 30, now=at(51), pid_alive=lambda pid: True)
    assert meter.renew_lease("hub-a", 30, now=at(52)) is False
    meter.release_lease("hub-a")  # not the holder: changes nothing
    with pytest.raises(MeterConflict):
        meter.acquire_lease("hub-a", "node1", 4242, 30, now=at(53))
    meter.release_lease("hub-b")
    meter.acquire_lease("hub-a", "node1", 4242, 30, now=at(54))


def test_pid_alive():
    assert pid_alive(os.getpid()) is True
    assert pid_alive(2**22 + 12345) is False


def test_a_servers_sessions_never_overlap(engine):
    # A session asked to start before its server's last one ended (the heartbeat's
    # repair of a server "ready" but gone, from the first answer the closed session
    # already billed) starts at that end: no millisecond is billed twice.
    meter = SessionLedger(engine)
    first = meter.open("ann", "", "p", "ann", RATE, T0)
    meter.close(first.id, at(10.5), "server_died")
    again = meter.open("ann", "", "p", "ann", RATE, T0)
    assert again.started == at(10.5)
    assert meter.close(again.id, at(15), "server_died").billed_ms() == 4_500
    other = meter.open("ann", "x", "p", "ann", RATE, at(1))  # another server: its own
    assert other.started == at(1)
    assert sum(-c["amount_ucr"] for c in charges(engine)) == 15_000
