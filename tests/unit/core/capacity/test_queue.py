"""The queue's decision is pure: who may start now, never delaying an earlier request."""

from gpulease.core.capacity.placement import place
from gpulease.core.capacity.queue import Waiting, plan, position, restricted, usable_devices
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory

SLICE = DeviceRequest("H200", "1g.18gb")
CARD = DeviceRequest("H200")
TWO_CARDS = DeviceRequest("H200", count=2)
L40S = DeviceRequest("L40S")


def _inv(nodes: dict[str, list[dict]]):
    return parse_declared_inventory(
        {"nodes": [{"name": n, "gpus": gpus} for n, gpus in nodes.items()]}, "test")


def _card(node: str, index: int) -> str:
    return f"GPU-declared-{node}-{index}"


def _mig(node, gpu, slot, profile="1g.18gb"):
    return f"MIG-declared-{node}-{gpu}-{slot}-{profile}"


# two full H200s and an L40S on one node, a MIG H200 with two slices on another
INV = _inv({
    "a": [{"model": "H200"}, {"model": "H200"}, {"model": "L40S"}],
    "b": [{"model": "H200", "mig": ["1g.18gb", "1g.18gb"]}],
})


def _q(*requests) -> list[Waiting]:
    return [Waiting(f"w{i}", r) for i, r in enumerate(requests)]


def test_an_empty_queue_starts_nothing():
    result = plan([], INV, set())
    assert result.start == [] and result.waiting == [] and result.never == []


def test_everyone_who_fits_starts_in_order_each_on_their_own_devices():
    result = plan(_q(SLICE, SLICE, CARD), INV, set())
    assert [k for k, _ in result.start] == ["w0", "w1", "w2"]
    devices = [u for _, p in result.start for u in p.uuids]
    assert len(devices) == len(set(devices)) == 3
    assert result.waiting == []


def test_a_large_head_is_not_starved_by_small_requests_for_the_same_cards():
    # one card is held: the head (2 cards) waits, and the free card is kept for it
    held = {_card("a", 0)}
    result = plan(_q(TWO_CARDS, CARD, CARD), INV, held)
    assert result.start == []
    assert result.waiting == ["w0", "w1", "w2"]
    # once the held card is freed the head gets both
    result = plan(_q(TWO_CARDS, CARD), INV, set())
    assert [k for k, _ in result.start] == ["w0"]
    assert set(result.start[0][1].uuids) == {_card("a", 0), _card("a", 1)}
    assert result.waiting == ["w1"]


def test_a_request_that_cannot_delay_the_head_starts_ahead_of_it():
    held = {_card("a", 0)}
    # a slice or another model takes nothing the head could use
    result = plan(_q(TWO_CARDS, SLICE, L40S, CARD), INV, held)
    assert [k for k, _ in result.start] == ["w1", "w2"]
    assert result.waiting == ["w0", "w3"]


def test_a_blocked_request_only_reserves_what_it_could_ever_use():
    # node x has one card (never enough for 2), node y two cards, one held
    inv = _inv({"x": [{"model": "H200"}], "y": [{"model": "H200"}, {"model": "H200"}]})
    held = {_card("y", 0)}
    result = plan(_q(TWO_CARDS, CARD, CARD), inv, held)
    # the card on x is no use to the head: the first single-card request takes it
    assert [(k, p.uuids) for k, p in result.start] == [("w1", (_card("x", 0),))]
    # the free card on y is kept for the head
    assert result.waiting == ["w0", "w2"]
    assert usable_devices(TWO_CARDS, inv) == {_card("y", 0), _card("y", 1)}


def test_same_kind_requests_are_served_first_come_first_served():
    held = {_mig("b", 0, 0)}  # one slice left
    result = plan(_q(SLICE, SLICE), INV, held)
    assert [k for k, _ in result.start] == ["w0"]
    assert result.waiting == ["w1"]


def test_a_request_that_can_never_fit_any_more_is_reported_and_holds_nobody_back():
    result = plan(_q(DeviceRequest("A100-80GB"), SLICE), INV, set())
    assert [k for k, _ in result.never] == ["w0"]
    assert "A100-80GB" in result.never[0][1]
    assert [k for k, _ in result.start] == ["w1"]


def test_position_is_one_based():
    q = _q(SLICE, CARD)
    assert position(q, "w0") == 1 and position(q, "w1") == 2 and position(q, "zz") is None


def test_restricted_inventory_leaves_only_the_planned_devices():
    only = restricted(INV, {_mig("b", 0, 1), _card("a", 1)})
    assert only.device_uuids() == {_mig("b", 0, 1), _card("a", 1)}
    # placing on it can give nothing else
    assert place(SLICE, only, set()).uuids == (_mig("b", 0, 1),)
    assert place(CARD, only, set()).uuids == (_card("a", 1),)


def test_spot_requests_are_served_after_every_on_demand_one_whenever_they_came():
    # one H200 card free: a spot request that came first waits behind a later on-demand one
    held = {_card("a", 0)}
    queue = [Waiting("spot-early", CARD, spot=True), Waiting("paying", CARD),
             Waiting("spot-slice", SLICE, spot=True)]
    result = plan(queue, INV, held)
    assert [key for key, _ in result.start] == ["paying", "spot-slice"]  # a slice still passes
    assert result.waiting == ["spot-early"]
    assert [position(queue, k) for k in ("paying", "spot-early", "spot-slice")] == [1, 2, 3]
    # with nothing on demand waiting, spot takes what is free
    alone = plan([Waiting("spot", CARD, spot=True)], INV, held)
    assert [key for key, _ in alone.start] == ["spot"]
