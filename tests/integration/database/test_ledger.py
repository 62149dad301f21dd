"""The credit ledger on SQLite and PostgreSQL: validation, balances, concurrency, caps."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from gpulease.core.billing.rules import (
    BillingError,
    billed_ms,
    billed_seconds,
    minutes_left,
    month_start,
    parse_account,
    seconds_up,
    to_ms,
)
from gpulease.core.units import MAX_UCR
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger

T0 = dt.datetime(2024, 3, 10, 12, 0, 0)
CREDIT = 1_000_000


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# --- pure helpers -------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("user:alice", "user:alice"), ("group:lab-1", "group:lab-1"), ("alice", "user:alice"),
    ("  bob.smith ", "user:bob.smith"), ("Alice_2", "user:Alice_2"), ("group:ML", "group:ML"),
])
def test_parse_account_accepts(text, expected):
    assert parse_account(text) == expected


@pytest.mark.parametrize("text", [
    "", "team:x", "user:", "group:", "user:-x", "user:a b", "group:a/b", "user:" + "a" * 65,
    "user:alice:x", ":alice", None, 5,
])
def test_parse_account_refuses_naming_the_forms(text):
    with pytest.raises(BillingError) as err:
        parse_account(text)
    assert err.value.status == 400 and err.value.field == "account"
    assert "user:NAME or group:NAME" in err.value.message


def test_parse_account_default_user():
    assert parse_account("", default_user="carol") == "user:carol"
    assert parse_account("group:lab", default_user="carol") == "group:lab"


def test_billed_milliseconds_and_their_seconds_rounded_up():
    assert billed_ms(T0, at(61.2)) == 61_200 and billed_seconds(T0, at(61.2)) == 62
    assert billed_ms(T0, at(61)) == 61_000 and billed_seconds(T0, at(61)) == 61
    assert billed_ms(T0, at(0.001)) == 1 and billed_seconds(T0, at(0.001)) == 1
    assert billed_ms(T0, T0 + dt.timedelta(microseconds=999)) == 0  # whole milliseconds
    assert billed_ms(T0, T0) == 0 and billed_seconds(T0, T0) == 0
    assert billed_ms(at(10), T0) == 0 and billed_seconds(at(10), T0) == 0
    assert [seconds_up(ms) for ms in (0, 1, 999, 1000, 1001)] == [0, 1, 1, 1, 2]


def test_times_go_on_the_millisecond_a_start_up_the_rest_down():
    t = T0 + dt.timedelta(microseconds=1_234_567)
    assert to_ms(t) == T0 + dt.timedelta(milliseconds=1234)
    assert to_ms(t, up=True) == T0 + dt.timedelta(milliseconds=1235)
    on = T0 + dt.timedelta(milliseconds=7)
    assert to_ms(on) == to_ms(on, up=True) == on
    assert to_ms(dt.datetime(2024, 1, 1, 23, 59, 59, 999_001), up=True) == dt.datetime(2024, 1, 2)


def test_minutes_left_and_month_start():
    assert minutes_left(1_200_000, 1_200_000) == 60  # 1.2 credits at 1.2/h
    assert minutes_left(199_999, 1_200_000) == 9  # floor: 9.99 minutes
    assert minutes_left(-5, 1_200_000) == 0
    assert minutes_left(5, 0) is None
    assert month_start(dt.datetime(2024, 3, 31, 23, 59, 59, 999)) == dt.datetime(2024, 3, 1)


# --- grants and adjustments ----------------------------------------------------------
@pytest.mark.parametrize("amount, words", [
    (0, "more than 0"), (-1, "more than 0"), (MAX_UCR + 1, "64 bits"), (2**70, "64 bits"),
    (True, "not an integer"), (1.5, "not an integer"), ("5", "not an integer"),
])
def test_grant_refusals_write_nothing(engine, amount, words):
    ledger = Ledger(engine)
    with pytest.raises(BillingError) as err:
        ledger.grant("user:alice", amount, note="", actor="admin")
    assert err.value.status == 400 and err.value.field == "amount"
    assert words in err.value.message
    assert ledger.entries() == []


def test_grant_bad_account_writes_nothing(engine):
    ledger = Ledger(engine)
    with pytest.raises(BillingError) as err:
        ledger.grant("team:x", CREDIT, note="", actor="admin")
    assert err.value.status == 400 and err.value.field == "account"
    assert ledger.entries() == []


def test_adjust_refusals_write_nothing(engine):
    ledger = Ledger(engine)
    ledger.grant("group:lab", 5 * CREDIT, note="start", actor="admin", now=T0)
    cases = [
        (("user:alice", 0, "fix"), 400, "amount"),
        (("user:alice", -CREDIT, ""), 400, "note"),
        (("user:alice", -CREDIT, "   "), 400, "note"),
        (("user:alice", -(MAX_UCR + 2), "fix"), 400, "amount"),
        (("group:unknown", CREDIT, "fix"), 404, "account"),
        (("nope:x", CREDIT, "fix"), 400, "account"),
    ]
    for (account, amount, note), status, field in cases:
        with pytest.raises(BillingError) as err:
            ledger.adjust(account, amount, note=note, actor="admin")
        assert (err.value.status, err.value.field) == (status, field), err.value.message
    assert len(ledger.entries()) == 1


def test_adjust_unknown_group_message(engine):
    with pytest.raises(BillingError, match="unknown account group:ghost"):
        Ledger(engine).adjust("group:ghost", -5, note="x", actor="admin")


def test_grant_and_adjust_rows(engine):
    ledger = Ledger(engine)
    gid = ledger.grant("alice", 10 * CREDIT, note="welcome", actor="admin", now=T0)
    aid = ledger.adjust("user:alice", -3 * CREDIT, note="refund reversed", actor="root",
                        now=at(5))
    rows = ledger.entries("user:alice")
    assert [r["id"] for r in rows] == [gid, aid]
    assert rows[0] | {} == {"id": gid, "account": "user:alice", "kind": "grant",
                            "amount_ucr": 10 * CREDIT, "note": "welcome", "actor": "admin",
                            "user_name": None, "session_id": None, "created_at": T0,
                            "reservation_id": None}
    assert rows[1]["kind"] == "adjustment" and rows[1]["amount_ucr"] == -3 * CREDIT
    assert ledger.balance("user:alice") == 7 * CREDIT
    assert ledger.entries(since=at(5)) == rows[1:]
    assert ledger.entries(until=at(5)) == rows[:1]


def test_sum_beyond_64_bits_refused(engine):
    ledger = Ledger(engine)
    ledger.grant("user:rich", MAX_UCR, note="", actor="admin")
    with pytest.raises(BillingError, match="64 bits"):
        ledger.grant("user:rich", 1, note="", actor="admin")
    assert ledger.balance("user:rich") == MAX_UCR
    assert len(ledger.entries()) == 1


def test_accounts_listing(engine):
    ledger = Ledger(engine)
    assert not ledger.account_exists("group:lab")
    ledger.grant("group:lab", CREDIT, note="", actor="admin")
    ledger.grant("group:astro", CREDIT, note="", actor="admin")
    ledger.grant("alice", CREDIT, note="", actor="admin")
    assert ledger.account_exists("group:lab") and ledger.account_exists("alice")
    assert not ledger.account_exists("user:bob")
    assert ledger.group_accounts() == ["group:astro", "group:lab"]


# --- balances ----------------------------------------------------------------------
def test_balance_is_rows_minus_confirmed_accrual(engine):
    ledger, meter = Ledger(engine), SessionLedger(engine)
    ledger.grant("user:alice", 10 * CREDIT, note="", actor="admin", now=T0)
    ledger.adjust("user:alice", -CREDIT, note="correction", actor="admin", now=T0)
    # 3.6 credits/h = 1 µcr/ms: a closed run of 61.2 s costs 61,200 µcr.
    done = meter.open("alice", "a", "h200-1g", "user:alice", 3_600_000, T0)
    meter.close(done.id, at(61.2), "user")
    running = meter.open("alice", "b", "h200-1g", "user:alice", 3_600_000, at(100))
    assert ledger.balance("user:alice") == 9 * CREDIT - 61_200
    meter.confirm([running.id], at(130.5))  # 30.5 s confirmed: accrued by the millisecond
    assert ledger.balance("user:alice", now=at(500)) == 9 * CREDIT - 61_200 - 30_500
    assert ledger.balance("user:nobody") == 0
    rows = sum(r["amount_ucr"] for r in ledger.entries("user:alice"))
    assert rows == 9 * CREDIT - 61_200


def test_balances_many_accounts_match_balance(engine):
    ledger, meter = Ledger(engine), SessionLedger(engine)
    accounts = [f"user:u{i}" for i in range(30)] + ["group:lab"]
    for i, account in enumerate(accounts):
        ledger.grant(account, (i + 1) * CREDIT, note="", actor="admin", now=T0)
    sessions = [meter.open(f"u{i}", "", "p", accounts[i % 7], 7_200_000 + i, T0)
                for i in range(20)]
    sessions += [meter.open(f"u{i}", "", "p", "group:lab", 1_000_000, T0) for i in range(20, 25)]
    assert meter.confirm([s.id for s in sessions], at(3599.999)) == 25
    got = ledger.balances(accounts + ["user:ghost"])
    assert got == {a: ledger.balance(a) for a in accounts + ["user:ghost"]}
    assert got["user:ghost"] == 0
    assert got["group:lab"] == len(accounts) * CREDIT - 5 * CREDIT


def test_concurrent_grants_and_charges_on_one_account(engine):
    ledger, meter = Ledger(engine), SessionLedger(engine)
    ledger.grant("group:lab", 1_000 * CREDIT, note="start", actor="admin", now=T0)
    expected = 1_000 * CREDIT
    errors: list[BaseException] = []
    plans = []
    for i in range(50):
        if i % 2:
            plans.append(("grant", 1_000 + i))
            expected += 1_000 + i
        else:
            # i + 0.5 seconds at 3.6 credits/h (1 µcr a millisecond).
            plans.append(("charge", i))
            expected -= i * 1_000 + 500

    def work(i: int) -> None:
        try:
            kind, value = plans[i]
            if kind == "grant":
                ledger.grant("group:lab", value, note=f"g{i}", actor="admin")
            else:
                s = meter.open(f"m{i}", "", "cpu", "group:lab", 3_600_000, T0)
                meter.confirm([s.id], at(value / 2))
                meter.close(s.id, at(value + 0.5), "user")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = ledger.entries("group:lab")
    assert len(rows) == 51
    assert ledger.balance("group:lab") == sum(r["amount_ucr"] for r in rows) == expected


# --- caps and start checks ------------------------------------------------------------
def test_caps_only_on_group_accounts(engine):
    ledger = Ledger(engine)
    ledger.grant("alice", CREDIT, note="", actor="admin")
    with pytest.raises(BillingError) as err:
        ledger.set_cap("user:alice", "alice", CREDIT)
    assert err.value.status == 400 and "group accounts only" in err.value.message
    with pytest.raises(BillingError) as err:
        ledger.set_cap("group:ghost", "alice", CREDIT)
    assert err.value.status == 404
    ledger.grant("group:lab", CREDIT, note="", actor="admin")
    with pytest.raises(BillingError) as err:
        ledger.set_cap("group:lab", "alice", -1)
    assert err.value.status == 400
    assert ledger.cap_of("group:lab", "alice") is None
    ledger.set_cap("group:lab", "alice", 2 * CREDIT)
    ledger.set_cap("group:lab", "alice", 3 * CREDIT)
    assert ledger.cap_of("group:lab", "alice") == 3 * CREDIT
    ledger.set_cap("group:lab", "alice", None)
    assert ledger.cap_of("group:lab", "alice") is None


def test_member_over_cap_refused_under_cap_accepted(engine):
    ledger, meter = Ledger(engine), SessionLedger(engine)
    now = dt.datetime(2024, 3, 20, 12, 0)
    ledger.grant("group:lab", 100 * CREDIT, note="", actor="admin", now=dt.datetime(2024, 1, 1))
    ledger.set_cap("group:lab", "bob", CREDIT)
    # Last month's spend does not count; this month's charge and open accrual do.
    old = meter.open("bob", "old", "p", "group:lab", 3_600_000, dt.datetime(2024, 2, 28))
    meter.close(old.id, dt.datetime(2024, 2, 28, 1), "user")  # 3.6 credits, in February
    done = meter.open("bob", "a", "p", "group:lab", 3_600_000, now)
    meter.close(done.id, now + dt.timedelta(seconds=500), "user")  # 0.5 credits
    running = meter.open("bob", "b", "p", "group:lab", 3_600_000, now)
    meter.confirm([running.id], now + dt.timedelta(seconds=300))  # 0.3 credits accrued
    assert ledger.member_spend("group:lab", "bob", month_start(now)) == 800_000
    ledger.check_start("group:lab", "bob", 200_000, now=now)  # exactly at the cap
    with pytest.raises(BillingError) as err:
        ledger.check_start("group:lab", "bob", 200_001, now=now, what="cpu's minimum run of 1m")
    assert err.value.status == 402
    assert "monthly cap of 1.000000 on group:lab: spent 0.800000" in err.value.message
    ledger.check_start("group:lab", "alice", 50 * CREDIT, now=now)  # no cap for alice


def test_check_start_names_balance_and_need(engine):
    ledger = Ledger(engine)
    ledger.grant("alice", 100_000, note="", actor="admin")
    with pytest.raises(BillingError) as err:
        ledger.check_start("user:alice", "alice", 200_000,
                           what="h200-1g's minimum run of 10m")
    assert err.value.status == 402
    assert err.value.message == ("Not enough credit on user:alice: balance 0.100000, needs "
                                 "0.200000 for h200-1g's minimum run of 10m")
    ledger.check_start("user:alice", "alice", 100_000)
    with pytest.raises(BillingError) as err:
        ledger.check_start("group:ghost", "alice", 1)
    assert err.value.status == 404


def test_free_start_allowed_in_debt(engine):
    ledger = Ledger(engine)
    ledger.grant("alice", 1, note="", actor="admin")
    ledger.adjust("alice", -5, note="overdrawn", actor="admin")
    ledger.check_start("alice", "alice", 0)
    with pytest.raises(BillingError):
        ledger.check_start("alice", "alice", 1)
