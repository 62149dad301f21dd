"""Admission holds (gpulease.core.billing.holds): the pure rule, and check_start with holds."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpulease.core.billing.holds import (
    AdmissionHolds,
    Held,
    Hold,
    OpenRun,
    credit_refusal,
    held_on,
    unused_minimum,
)
from gpulease.core.billing.rules import BillingError
from gpulease.store.ledger import Ledger
from gpulease.store.sessions import SessionLedger

CREDIT = 1_000_000
T0 = dt.datetime(2024, 3, 1, 12, 0)
RATE = 6 * CREDIT  # 6 credits/h: a 10-minute minimum run costs 1 credit
MIN_RUN = {"paid": 600, "free": 0}


def hold(user="ann", server="a", amount=CREDIT, created=T0, alive=True):
    return Hold((user, server), "user:ann", amount, created, alive=lambda: alive)


def run(user="ann", server="a", accrued=0, started=T0, profile="paid"):
    return OpenRun((user, server), profile, RATE, started, accrued)


def test_pending_starts_hold_their_minimum_run():
    held = held_on([hold(server="a"), hold(server="b")], [], MIN_RUN)
    assert held == Held(2 * CREDIT, starts=2, runs=0)


def test_running_session_holds_what_of_its_minimum_run_it_has_not_accrued():
    assert unused_minimum(600, RATE, 0) == CREDIT
    assert unused_minimum(600, RATE, 400_000) == 600_000
    assert unused_minimum(600, RATE, 5 * CREDIT) == 0  # past its minimum run: nothing held
    held = held_on([], [run(accrued=400_000), run(server="b", accrued=2 * CREDIT)], MIN_RUN)
    assert held == Held(600_000, starts=0, runs=1)


def test_a_hold_whose_session_opened_counts_as_the_session_only():
    opened_after = run(started=T0 + dt.timedelta(seconds=3), accrued=100_000)
    assert held_on([hold()], [opened_after], MIN_RUN) == Held(900_000, 0, 1)
    # a session older than the hold (left from before) does not replace it
    older = run(started=T0 - dt.timedelta(hours=1), accrued=10 * CREDIT)
    assert held_on([hold()], [older], MIN_RUN) == Held(CREDIT, 1, 0)


def test_member_part_of_what_is_held():
    holds = [hold(user="ann"), hold(user="bob", server="b")]
    assert held_on(holds, [run(user="bob", server="c")], MIN_RUN, user="ann") == Held(CREDIT, 1, 0)


def test_credit_refusal_subtracts_what_is_held_and_names_it():
    assert credit_refusal("user:ann", 2 * CREDIT, Held(CREDIT, 1), CREDIT, RATE) is None
    message = credit_refusal("user:ann", 2 * CREDIT, Held(2 * CREDIT, 2), CREDIT, RATE,
                             " for paid's minimum run of 10m")
    assert message == ("Not enough credit on user:ann: balance 2.000000, of which 2.000000 is "
                       "held for 2 starts in progress (0.000000 free), needs 1.000000 for "
                       "paid's minimum run of 10m")
    assert "1 running server within their minimum run" in credit_refusal(
        "user:ann", CREDIT, Held(CREDIT, 0, 1), CREDIT, RATE)


def test_paid_profile_with_no_minimum_run_needs_credit_above_zero():
    for balance in (0, -5):
        message = credit_refusal("user:ann", balance, Held(), 0, RATE)
        assert message is not None and "above zero" in message and "6.000000 credits/h" in message
    assert credit_refusal("user:ann", 1, Held(), 0, RATE) is None
    # what others hold counts here too: nothing free is nothing free
    assert credit_refusal("user:ann", CREDIT, Held(CREDIT, 1), 0, RATE) is not None
    # a free profile is never refused, even in debt
    assert credit_refusal("user:ann", -5, Held(CREDIT, 1), 0, 0) is None


def test_holds_of_ended_spawns_are_dropped():
    holds = AdmissionHolds()
    holds.add(hold(server="live"))
    holds.add(hold(server="ended", alive=False))
    assert [h.key for h in holds.on("user:ann")] == [("ann", "live")]
    holds.release("ann", "live")
    assert holds.on("user:ann") == []


def test_check_start_min_run_zero_on_paid_profile_is_402(engine):
    ledger = Ledger(engine)
    ledger.grant("ann", 1, note="", actor="admin")
    ledger.adjust("ann", -1, note="spent", actor="admin")
    with pytest.raises(BillingError) as err:
        ledger.check_start("user:ann", "ann", 0, rate_per_hour_ucr=RATE, what="paid0")
    assert err.value.status == 402 and "balance 0.000000" in err.value.message
    ledger.check_start("user:ann", "ann", 0)  # free: still allowed in debt
    ledger.grant("ann", 1, note="", actor="admin")
    ledger.check_start("user:ann", "ann", 0, rate_per_hour_ucr=RATE)


def test_check_start_counts_open_sessions_minimum_runs(engine):
    ledger, meter = Ledger(engine), SessionLedger(engine)
    ledger.grant("ann", 2 * CREDIT, note="", actor="admin", now=T0)
    session = meter.open("ann", "a", "paid", "user:ann", RATE, T0)
    meter.confirm([session.id], T0 + dt.timedelta(seconds=60))  # 0.1 credit accrued
    runs = ledger.open_runs("user:ann")
    assert runs == [OpenRun(("ann", "a"), "paid", RATE, T0, 100_000)]
    held = held_on([], runs, MIN_RUN)
    # balance 1.9, of which 0.9 still held for a's minimum run: 1.0 free, enough for one
    ledger.check_start("user:ann", "ann", CREDIT, rate_per_hour_ucr=RATE, held=held)
    with pytest.raises(BillingError) as err:
        ledger.check_start("user:ann", "ann", CREDIT, rate_per_hour_ucr=RATE,
                           held=Held(held.amount_ucr + CREDIT, 1, held.runs))
    assert "of which 1.900000 is held for 1 start in progress and 1 running server" \
        in err.value.message


def test_concurrent_checks_under_the_lock_admit_only_what_the_balance_covers(engine):
    """Six threads at once on a balance of two minimum runs: exactly two get a hold."""
    ledger, holds = Ledger(engine), AdmissionHolds()
    ledger.grant("ann", 2 * CREDIT, note="", actor="admin")
    barrier = threading.Barrier(6)

    def start(i: int) -> bool:
        barrier.wait()
        with holds.lock:
            held = held_on(holds.on("user:ann"), ledger.open_runs("user:ann"), MIN_RUN)
            try:
                ledger.check_start("user:ann", "ann", CREDIT, rate_per_hour_ucr=RATE, held=held)
            except BillingError:
                return False
            holds.add(Hold(("ann", f"s{i}"), "user:ann", CREDIT, T0))
            return True

    with ThreadPoolExecutor(6) as pool:
        admitted = list(pool.map(start, range(6)))
    assert admitted.count(True) == 2
