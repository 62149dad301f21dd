"""The reservation rules (gpulease/core/capacity/reservation_rules.py), pure: periods, price, capacity with
overlapping reservations, refunds, and what is withheld from everyone else."""

import datetime as dt

import pytest

from gpulease.core.capacity.reservation_rules import (
    Reservation,
    capacity_refusal,
    devices_for_units,
    peak_promised,
    period_errors,
    refund_ucr,
    reservation_cost,
    withheld,
)

T0 = dt.datetime(2026, 12, 7, 9)
H = dt.timedelta(hours=1)
SLICE = ("H200", "1g.18gb")
CARD = ("H200", None)


def _r(id, start_h, end_h, units=1, kind=SLICE, per_unit=1, cancelled=None, rate=1_000_000):
    return Reservation(id, "group:lab", "p", kind, per_unit, units, T0 + start_h * H,
                       T0 + end_h * H, rate, cancelled)


def test_a_period_is_whole_hours_not_begun_and_ends_after_it_starts():
    now = T0 - dt.timedelta(minutes=20)
    assert period_errors(T0, T0 + 3 * H, now) == []
    fields = [e.field for e in period_errors(T0 + dt.timedelta(minutes=30), T0, now)]
    assert fields == ["start", "end"]
    # the hour under way may be reserved (it holds at once), not the one before it
    assert period_errors(T0 - H, T0 + H, now) == []
    assert [e.field for e in period_errors(T0 - 2 * H, T0 + H, now)] == ["start"]
    assert "the hour under way, 2026-12-07T08:00:00Z" in period_errors(
        T0 - 2 * H, T0 + H, now)[0].message


def test_the_price_is_rate_times_hours_times_units():
    assert reservation_cost(1_500_000, 3, T0, T0 + 10 * H) == 45_000_000


@pytest.mark.parametrize("cancel_at, refunded_hours", [
    (T0 - H, 10),  # before the start: all of it
    (T0, 10),  # at the start, nothing used yet
    (T0 + dt.timedelta(minutes=20), 9),  # the first hour has begun
    (T0 + 9 * H + dt.timedelta(minutes=59), 0),
    (T0 + 10 * H, 0),  # ended
    (T0 + 12 * H, 0),
])
def test_refunds_are_all_before_the_start_then_the_hours_not_begun(cancel_at, refunded_hours):
    r = _r(1, 0, 10, units=2, rate=1_000_000)
    assert refund_ucr(r, cancel_at) == refunded_hours * 2 * 1_000_000


def test_overlapping_reservations_count_at_their_busiest_moment():
    existing = [_r(1, 0, 4, units=3), _r(2, 2, 6, units=2), _r(3, 5, 8, units=4),
                _r(4, 0, 8, units=5, kind=CARD)]
    assert peak_promised(existing, SLICE, T0, T0 + 4 * H) == 5  # 2-4: 3 + 2
    assert peak_promised(existing, SLICE, T0, T0 + 8 * H) == 6  # 5-6: 2 + 4
    assert peak_promised(existing, SLICE, T0 + 6 * H, T0 + 8 * H) == 4
    assert peak_promised(existing, SLICE, T0 + 8 * H, T0 + 9 * H) == 0
    # one ending as another starts is not both at once
    assert peak_promised([_r(1, 0, 2, 3), _r(2, 2, 4, 3)], SLICE, T0, T0 + 4 * H) == 3


def test_capacity_refuses_more_than_exists_422_and_more_than_is_free_409():
    existing = [_r(1, 0, 4, units=3), _r(2, 2, 6, units=2)]
    assert capacity_refusal(SLICE, 1, 2, T0, T0 + 6 * H, existing, 7, "slices") is None
    refused = capacity_refusal(SLICE, 1, 3, T0, T0 + 6 * H, existing, 7, "slices")
    assert refused.status == 409 and "only 2 of 7 slices are free" in refused.message
    assert refused.field == "units"
    # later, after both, all 7 are free
    assert capacity_refusal(SLICE, 1, 7, T0 + 6 * H, T0 + 9 * H, existing, 7, "slices") is None
    refused = capacity_refusal(SLICE, 1, 8, T0 + 6 * H, T0 + 9 * H, existing, 7, "slices")
    assert refused.status == 422 and "7 slices in all" in refused.message


def test_a_unit_of_a_multi_card_profile_takes_its_cards():
    existing = [_r(1, 0, 4, units=1, kind=CARD, per_unit=4)]  # 4 of 8 cards
    assert capacity_refusal(CARD, 2, 2, T0, T0 + H, existing, 8, "2-card units") is None
    refused = capacity_refusal(CARD, 2, 3, T0, T0 + H, existing, 8, "2-card units")
    assert refused.status == 409 and "only 2 of 4" in refused.message


def test_a_cancelled_reservation_frees_the_hours_it_refunded():
    r = _r(1, 0, 10, units=7, cancelled=T0 + dt.timedelta(hours=3, minutes=10))
    assert r.holds_until() == T0 + 4 * H
    assert capacity_refusal(SLICE, 1, 7, T0 + 4 * H, T0 + 10 * H, [r], 7, "slices") is None
    assert capacity_refusal(SLICE, 1, 1, T0 + 3 * H, T0 + 4 * H, [r], 7, "slices") is not None
    before = _r(2, 0, 10, units=7, cancelled=T0 - H)
    assert before.holds_until() == T0 and not before.active(T0)


def test_what_holders_do_not_use_is_withheld_from_everyone_else():
    rs = [_r(1, 0, 4, units=3), _r(2, 0, 4, units=1, kind=CARD, per_unit=2), _r(3, 5, 8)]
    at = T0 + H
    assert withheld(rs, at, {}) == {SLICE: 3, CARD: 2}
    assert withheld(rs, at, {1: 2, 2: 1}) == {SLICE: 1}
    assert withheld(rs, at, {1: 5}) == {CARD: 2}  # never below nothing
    assert withheld(rs, T0 + 4 * H, {}) == {}  # ended; 3 not begun


def test_a_unit_of_several_cards_is_counted_on_one_node():
    # two nodes of 3 cards: three 2-card units would need 6 cards, but each node holds one
    assert devices_for_units([3, 3], 2) == 4
    assert devices_for_units([3, 3], 1) == 6 and devices_for_units([], 2) == 0
    assert capacity_refusal(("H200", None), 2, 3, T0, T0 + H, [],
                            devices_for_units([3, 3], 2), "H200 full cards").status == 422


def test_a_time_off_the_hour_at_the_end_of_time_is_named_not_a_crash():
    # attack pass: the hint used the next hour, past 9999-12-31T23:59 (a 500)
    late = dt.datetime(9999, 12, 31, 23, 30)
    (error,) = period_errors(T0, late, T0 - H)
    assert error.field == "end" and "like 9999-12-31T23:00:00Z" in error.message
