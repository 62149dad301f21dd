"""Making and cancelling reservations on a real database (SQLite and PostgreSQL): one
transaction each, the charge and the refund as ledger rows, nothing written on a refusal."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from gpulease.core.capacity.placement import NoFit
from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory
from gpulease.core.model.profiles import parse_profile
from gpulease.core.refusal import Refusal
from gpulease.images import shipped_catalog
from gpulease.store.assignments import AssignmentStore
from gpulease.store.ledger import Ledger
from gpulease.store.reservations import ReservationStore

CREDIT = 1_000_000
NOW = dt.datetime(2026, 12, 7, 8, 40)
T0 = dt.datetime(2026, 12, 7, 9)
H = dt.timedelta(hours=1)
CATALOG = shipped_catalog()
PROFILE = parse_profile({"slug": "h200-1g", "display_name": "H200 slice",
                         "gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 4,
                         "memory": "32Gi", "price_per_hour": "1.20",
                         "reserved_price_per_hour": "0.80"}, CATALOG)
SEVEN = {("H200", "1g.18gb"): 7}


def _add(store: ReservationStore, units: int = 2, start=T0, end=T0 + 5 * H,
         account: str = "group:lab", now=NOW, profile=PROFILE):
    return store.add(account=account, profile=profile, units=units, start=start, end=end,
                     on_end="continue", note="course", actor="admin",
                     devices_of_kind=lambda kind, per_unit: SEVEN.get(kind, 0), now=now)


def _rows(engine, account="group:lab"):
    return [(e["kind"], e["amount_ucr"], e["reservation_id"])
            for e in Ledger(engine).entries(account)]


def test_a_reservation_is_charged_once_and_refunded_by_the_rule(engine):
    Ledger(engine).grant("group:lab", 100 * CREDIT, note="", actor="admin", now=NOW)
    store = ReservationStore(engine)
    booked = _add(store)  # 2 units × 5 h × 0.80
    assert booked.cost_ucr == 8 * CREDIT and booked.reservation.devices == 2
    assert _rows(engine)[1:] == [("reservation", -8 * CREDIT, booked.id)]
    assert Ledger(engine).balance("group:lab") == 92 * CREDIT
    # cancelled 20 minutes into its second hour: hours 3 to 5 come back (3 × 2 × 0.80)
    cancelled, refund = store.cancel(booked.id, "admin", now=T0 + H + dt.timedelta(minutes=20))
    assert refund == 4_800_000 and cancelled.reservation.holds_until() == T0 + 2 * H
    assert _rows(engine)[-1] == ("refund", 4_800_000, booked.id)
    with pytest.raises(Refusal, match="was cancelled at") as twice:
        store.cancel(booked.id, "admin", now=T0 + 2 * H)
    assert twice.value.status == 409
    # one cancelled before its start: all of it
    other = _add(store, units=1, start=T0 + 24 * H, end=T0 + 26 * H)
    _, refund = store.cancel(other.id, "admin", now=NOW)
    assert refund == other.cost_ucr == 1_600_000
    assert Ledger(engine).balance("group:lab") == (100 - 8) * CREDIT + 4_800_000


@pytest.mark.parametrize("change, status, words", [
    ({"units": 8}, 422, "more than there are: 7"),
    ({"start": T0 - 2 * H}, 400, "the hour under way"),
    ({"end": T0}, 400, "end must be after start"),
    ({"start": T0 + dt.timedelta(minutes=30)}, 400, "whole hour"),
    ({"units": 0}, 400, "at least 1"),
    ({"units": 3, "account": "user:poor"}, 402, "has 0.000000 credits"),
])
def test_bad_input_is_refused_and_writes_nothing(engine, change, status, words):
    Ledger(engine).grant("group:lab", 100 * CREDIT, note="", actor="admin", now=NOW)
    store = ReservationStore(engine)
    with pytest.raises(Refusal, match=words) as refused:
        _add(store, **change)
    assert refused.value.status == status
    assert store.listed(now=NOW) == [] and len(_rows(engine)) == 1


def test_capacity_promised_to_others_is_refused_naming_what_is_free(engine):
    Ledger(engine).grant("group:lab", 100 * CREDIT, note="", actor="admin", now=NOW)
    store = ReservationStore(engine)
    _add(store, units=4, start=T0, end=T0 + 3 * H)
    _add(store, units=2, start=T0 + 2 * H, end=T0 + 6 * H)  # 6 of 7 at 11:00
    with pytest.raises(Refusal, match="only 1 of 7 H200 1g.18gb slices are free") as refused:
        _add(store, units=2, start=T0 + H, end=T0 + 4 * H)
    assert refused.value.status == 409
    _add(store, units=2, start=T0 + 3 * H, end=T0 + 4 * H)  # after the first one ends: fits
    no_offer = parse_profile({**PROFILE.to_spec(), "reserved_price_per_hour": None}, CATALOG)
    with pytest.raises(Refusal, match="offers no reservations") as refused:
        _add(store, profile=no_offer)
    assert refused.value.status == 422


def test_two_reservations_racing_for_the_last_units_one_wins(engine):
    Ledger(engine).grant("group:lab", 100 * CREDIT, note="", actor="admin", now=NOW)
    store = ReservationStore(engine)
    _add(store, units=3)
    results: list[object] = []
    barrier = threading.Barrier(2)

    def reserve():
        barrier.wait()
        try:
            results.append(_add(store, units=3))
        except Refusal as e:
            results.append(e.status)

    threads = [threading.Thread(target=reserve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r if isinstance(r, int) else 0 for r in results) == [0, 409]
    assert sum(b.reservation.units for b in store.listed(now=NOW)) == 6


def test_a_claim_keeps_a_reserved_pair_whole_on_a_node(engine):
    """The claim's own transaction: a card goes where the reserved pair still fits; when
    only nodes where it would break the pair up have a free card, the claim is a 503 that
    says so, and nothing is recorded."""
    pair = parse_profile({"slug": "h200-x2", "display_name": "Two H200",
                          "gpu": {"model": "H200", "count": 2}, "cpu": 4, "memory": "32Gi",
                          "price_per_hour": "16", "reserved_price_per_hour": "10"}, CATALOG)
    inventory = parse_declared_inventory({"nodes": [
        {"name": n, "gpus": [{"model": "H200"}] * 2} for n in ("a", "b", "c")]}, "test")
    now = utcnow()
    hour = now.replace(minute=0, second=0, microsecond=0)
    Ledger(engine).grant("group:lab", 100 * CREDIT, note="", actor="admin", now=now)
    booked = ReservationStore(engine).add(
        account="group:lab", profile=pair, units=2, start=hour, end=hour + 2 * H,
        on_end="continue", note="", actor="admin",
        devices_of_kind=lambda kind, per_unit: 6, now=now)
    claims = AssignmentStore(engine)
    card = DeviceRequest("H200", None, 1)
    assert claims.claim("ann", "", "one", card, inventory).node == "a"
    # by count one card is left for on demand (6 - 4 reserved - 1); a's last card keeps
    # b and c whole, where best fit alone would also go
    assert claims.claim("bob", "", "one", card, inventory).node == "a"
    with pytest.raises(NoFit) as refused:  # the count says no now
        claims.claim("cy", "", "one", card, inventory)
    assert refused.value.status == 503
    # a holder's pair takes b; a spot card may take c's idle reserved card
    assert claims.claim("lee", "", "h200-x2", DeviceRequest("H200", None, 2), inventory,
                        tier="reserved", reservation_id=booked.reservation.id).node == "b"
    claims.release("ann", "", "stop")
    assert claims.claim("sam", "", "one", card, inventory, tier="spot").node == "a"
    # now c is the only node with a free card, and the idle pair needs it whole: by count
    # dan's on-demand card may start (6 - 4 - 1), but it waits, saying why
    with pytest.raises(NoFit, match="break up the cards that idle reserved units need"):
        claims.claim("dan", "", "one", card, inventory)
    assert claims.devices_of("dan", "") == []


def test_a_period_beginning_soon_must_fit_beside_running_servers(engine):
    Ledger(engine).grant("group:lab", 100 * CREDIT, note="", actor="admin", now=NOW)
    store = ReservationStore(engine)
    asked: list = []

    def two_free(kind, per_unit, active):
        asked.append((kind, per_unit, len(active)))
        return 2

    def add(units, start, soon=True):
        return store.add(account="group:lab", profile=PROFILE, units=units, start=start,
                         end=T0 + 3 * H, on_end="continue", note="", actor="admin",
                         devices_of_kind=lambda kind, per_unit: 7, now=T0 + H / 2,
                         free_now=two_free if soon else None, soonest=T0 + 26 * H)
    with pytest.raises(Refusal, match="only 2 of 7 .* are free now") as refused:
        add(3, T0)  # within the lead time: running servers hold all but 2
    assert refused.value.status == 409 and _rows(engine)[1:] == []
    assert "from 2026-12-08T11:00:00Z on" in refused.value.message
    assert asked == [(("H200", "1g.18gb"), 1, 0)]
    assert add(2, T0).reservation.units == 2
    asked.clear()
    # made ahead of the lead time (the caller gives no free_now): running servers make way
    assert add(3, T0 + H, soon=False).reservation.units == 3
    assert asked == []
