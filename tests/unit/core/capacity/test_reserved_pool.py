"""What reservations withhold (gpulease/core/capacity/reserved_pool.py), and how the queue and the
preemption plan honour it: pure, over a declared inventory."""

import datetime as dt

import pytest

from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, Hold
from gpulease.core.capacity.cluster_queue import AdmittedStart, cluster_withholding, plan_cluster
from gpulease.core.capacity.placement import place
from gpulease.core.capacity.preemption import SpotHolding, plan_preemptions
from gpulease.core.capacity.queue import Waiting, plan
from gpulease.core.capacity.reservation_rules import Reservation
from gpulease.core.capacity.reserved_pool import (
    NO_WITHHOLDING,
    HeldBy,
    SplitsUnits,
    place_keeping_units,
    units_fitting,
    units_free_now,
    withholding,
)
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory
from gpulease.spawners.kube.pod_spec import only_on

T0 = dt.datetime(2026, 12, 7, 9)
H = dt.timedelta(hours=1)
SLICE = DeviceRequest("H200", "1g.18gb")
KIND = ("H200", "1g.18gb")
INV = parse_declared_inventory(
    {"nodes": [{"name": "m", "gpus": [{"model": "H200", "mig": ["1g.18gb"] * 7}]}]}, "test")
SLICES = [f"MIG-declared-m-0-{s}-1g.18gb" for s in range(7)]


def _res(id_: int, units: int, account: str = "group:lab") -> Reservation:
    return Reservation(id_, account, "h200-1g", KIND, 1, units, T0, T0 + 4 * H, 800_000)


def _held(*entries: tuple[int, str, str, int | None]) -> dict[str, HeldBy]:
    """(slot, tier, user, reservation) of each held slice."""
    return {SLICES[slot]: HeldBy(tier, (user, ""), rid) for slot, tier, user, rid in entries}


def test_on_demand_gets_what_reservations_leave_and_a_holder_gets_its_units():
    w = withholding(INV, _held((0, "on-demand", "ann", None)), [_res(1, 4)])
    assert w.on_demand_room == {KIND: 2}  # 7 - 4 reserved - 1 on demand
    assert w.reservation_room == {1: 4}
    assert w.refusal(SLICE) is None
    w = w.take(SLICE).take(SLICE)
    assert "reserved: 4 held for reservations now, 0 left" in w.refusal(SLICE)
    # the holder's start on its reservation and a spot start are not limited by the room
    assert w.refusal(SLICE, reservation_id=1) is None
    assert w.refusal(SLICE, spot=True) is None
    for _ in range(4):
        w = w.take(SLICE, reservation_id=1)
    assert "every unit of reservation 1 is in use" in w.refusal(SLICE, reservation_id=1)


def test_spot_on_reserved_devices_does_not_narrow_on_demand_and_units_count_servers():
    held = _held((0, "spot", "sam", None), (1, "spot", "sam2", None),
                 (2, "reserved", "lee", 1), (3, "reserved", "lee", 1))
    w = withholding(INV, held, [_res(1, 3)])
    assert w.on_demand_room == {KIND: 4}
    assert w.reservation_room == {1: 2}  # a unit is a server, whatever it holds
    # no active reservation: nothing withheld
    assert withholding(INV, held, []) is NO_WITHHOLDING


def test_the_queue_keeps_reserved_capacity_from_on_demand_without_blocking_holders():
    # 6 slices taken by on-demand servers: 1 free; reservation 1 holds 2 units, none used
    held = _held(*((s, "on-demand", f"u{s}", None) for s in range(6)))
    w = withholding(INV, held, [_res(1, 2)])
    assert w.on_demand_room == {KIND: -1}
    queue = [Waiting("stranger", SLICE), Waiting("holder", SLICE, reservation=1),
             Waiting("spotty", SLICE, spot=True)]
    decided = plan(queue, INV, set(held), w)
    # the stranger waits without keeping the free slice from the holder behind it
    assert [k for k, _ in decided.start] == ["holder"]
    assert decided.waiting == ["stranger", "spotty"]
    # without reservations the stranger (first in line) would have had it
    assert [k for k, _ in plan(queue, INV, set(held)).start] == ["stranger"]


def test_a_holder_preempts_spot_on_its_reserved_capacity_and_on_demand_does_not():
    # all 7 slices: 5 spot servers, 2 on-demand; reservation 1 (3 units) is idle
    held = _held(*((s, "spot", f"s{s}", None) for s in range(5)),
                 (5, "on-demand", "a", None), (6, "on-demand", "b", None))
    spot = [SpotHolding(f"s{s}", "m", frozenset({SLICES[s]}), float(s)) for s in range(5)]
    w = withholding(INV, held, [_res(1, 3)])
    assert w.on_demand_room == {KIND: 2}
    got = plan_preemptions([("holder", SLICE)], INV, set(held), spot, None, w,
                           {"holder": 1})
    assert [(k, p.victims) for k, p in got.chosen] == [("holder", ("s4",))]  # the latest
    # an on-demand stranger may still have the 2 unreserved: it preempts as before
    got = plan_preemptions([("x", SLICE), ("y", SLICE), ("z", SLICE)], INV, set(held), spot,
                           None, w, {})
    assert [k for k, _ in got.chosen] == ["x", "y"]  # z: the rest is reserved, no victim


# --- the cluster shape: counted capacity, pods and admitted starts ---------------------

def _cluster(holds=()):
    node = ClusterNode("m", "H200", "mixed", "570", {"nvidia.com/mig-1g.18gb": 3})
    return ClusterInventory((node,), tuple(holds))


def test_the_cluster_counts_pods_by_tier_and_admitted_starts_and_holds_reserved_capacity():
    mig = {"nvidia.com/mig-1g.18gb": 1}
    holds = [Hold("ns/jupyter-ann", "m", mig, "ann", ""),  # on demand
             Hold("ns/jupyter-sam", "m", mig, "sam", "", spot=True, tier="spot"),
             Hold("batch/job", "m", mig)]  # someone else's pod: on demand
    inventory = _cluster(holds)
    w = cluster_withholding(inventory, {}, [_res(1, 1, "user:lee")])
    assert w.on_demand_room == {KIND: 0} and w.reservation_room == {1: 1}
    # the holder starts (kube-scheduler preempts sam's spot pod); an on-demand one waits
    queue = [Waiting("x", SLICE), Waiting("lee", SLICE, reservation=1)]
    decided = plan_cluster(queue, inventory, (), spot_yields=True, withholding=w)
    assert decided.start == [("lee", "m")] and decided.waiting == ["x"]
    # lee's start admitted, its pod not bound yet: its unit is in use
    admitted = {("lee", ""): AdmittedStart(SLICE, "reserved", 1)}
    w = cluster_withholding(inventory, admitted, [_res(1, 1, "user:lee")])
    assert w.reservation_room == {1: 0}
    # bound, labelled with its reservation: the same; after the reservation, on demand
    lee = Hold("ns/jupyter-lee", "m", mig, "lee", "", tier="reserved", reservation=1)
    w = cluster_withholding(_cluster([*holds, lee]), {}, [_res(1, 1, "user:lee")])
    assert w.reservation_room == {1: 0} and w.on_demand_room == {KIND: 0}
    w = cluster_withholding(_cluster([*holds, lee]), {}, [_res(2, 1, "user:kim")])
    assert w.on_demand_room == {KIND: -1}  # ann, the batch pod and lee now on demand


# --- units of several cards: kept together on one node -----------------------------------

CARD = DeviceRequest("H200", None, 1)
PAIR = DeviceRequest("H200", None, 2)
CARDS = ("H200", None)


def _nodes(*names: str, cards: int = 2):
    return parse_declared_inventory({"nodes": [
        {"name": n, "gpus": [{"model": "H200"}] * cards} for n in names]}, "test")


def _card(node: str, index: int) -> str:
    return f"GPU-declared-{node}-{index}"


def _pairs(id_: int, units: int) -> Reservation:
    return Reservation(id_, "group:lab", "h200-x2", CARDS, 2, units, T0, T0 + 4 * H, 800_000)


def test_units_fitting_counts_whole_units_per_node():
    assert units_fitting({"a": 2, "b": 2}, [2, 2]) == 2
    assert units_fitting({"a": 1, "b": 1}, [2]) == 0  # two cards free, not on one node
    assert units_fitting({"a": 3, "b": 1}, [2, 1, 1]) == 3  # largest first, best fit
    assert units_fitting({"a": 4}, [2, 2, 2]) == 2


def test_an_on_demand_card_goes_where_it_does_not_break_up_a_reserved_pair():
    # a: one card spot, one free (room for the pair: 2); b: one on demand, one free
    inv = _nodes("a", "b")
    held = {_card("a", 0): HeldBy("spot", ("sam", "")), _card("b", 0): HeldBy("on-demand",
                                                                            ("ann", ""))}
    w = withholding(inv, held, [_pairs(1, 1)])
    assert w.on_demand_room == {CARDS: 1} and w.node_room == {CARDS: {"a": 2, "b": 1}}
    assert w.splitting_nodes(CARD) == {"a"}
    assert w.keeps_units_together(CARD) and not w.keeps_units_together(CARD, spot=True)
    # best fit alone takes a's free card (a tie, by name): the pair could then run nowhere
    assert place(CARD, inv, set(held)).node == "a"
    assert place_keeping_units(CARD, inv, set(held), w).node == "b"
    decided = plan([Waiting("x", CARD)], inv, set(held), w)
    assert [(k, p.node) for k, p in decided.start] == [("x", "b")]
    # without the reservation, the queue's best fit as before
    assert [p.node for _, p in plan([Waiting("x", CARD)], inv, set(held)).start] == ["a"]


def test_a_start_that_would_break_up_every_idle_pair_waits_keeping_nothing():
    # a: on demand + spot; b and c free; two pairs reserved, idle
    inv = _nodes("a", "b", "c")
    held = {_card("a", 0): HeldBy("on-demand", ("ann", "")),
            _card("a", 1): HeldBy("spot", ("sam", ""))}
    w = withholding(inv, held, [_pairs(1, 2)])
    assert w.refusal(CARD) is None  # the count alone allows it: 6 - 4 - 1 = 1
    assert w.splitting_nodes(CARD) == {"b", "c"}
    with pytest.raises(SplitsUnits) as refused:
        place_keeping_units(CARD, inv, set(held), w)
    assert refused.value.status == 503
    assert "break up the cards that idle reserved units need together (2 H200" in str(
        refused.value.message)
    # in the queue it waits without keeping b or c from the holder behind it
    decided = plan([Waiting("x", CARD), Waiting("lee", PAIR, reservation=1)], inv,
                   set(held), w)
    assert decided.waiting == ["x"] and [k for k, _ in decided.start] == ["lee"]
    # the embedded preemption: sam's spot card on a is where it breaks up nothing
    spot = [SpotHolding(("sam", ""), "a", frozenset({_card("a", 1)}), 1.0)]
    got = plan_preemptions([("x", CARD)], inv, set(held), spot, None, w, {})
    assert [(k, p.victims) for k, p in got.chosen] == [("x", (("sam", ""),))]
    # a spot start takes a free card anywhere (the holder's start preempts it later)
    assert place_keeping_units(CARD, inv, set(held), w, spot=True).node in {"b", "c"}


def test_a_holders_start_may_use_its_own_unit_but_not_break_up_anothers():
    # a: one spot card (room 2), b: one on-demand card (room 1); reservation 1: one card,
    # reservation 2: a pair
    inv = _nodes("a", "b")
    held = {_card("a", 0): HeldBy("spot", ("sam", "")),
            _card("b", 0): HeldBy("on-demand", ("ann", ""))}
    one = Reservation(1, "user:lee", "h200", CARDS, 1, 1, T0, T0 + 4 * H, 800_000)
    w = withholding(inv, held, [one, _pairs(2, 1)])
    assert w.splitting_nodes(CARD, reservation_id=1) == {"a"}
    assert place_keeping_units(CARD, inv, set(held), w, 1).node == "b"
    # the pair's holder takes its own unit on a (sam's spot card is preempted for it)
    assert w.splitting_nodes(PAIR, reservation_id=2) == frozenset()


def test_the_cluster_admits_a_card_where_the_pair_keeps_its_node_and_pins_the_pod():
    nodes = tuple(ClusterNode(n, "H200", "none", "570", {"nvidia.com/gpu": 2}) for n in "ab")
    gpu = {"nvidia.com/gpu": 1}
    holds = (Hold("ns/jupyter-sam", "a", gpu, "sam", "", spot=True, tier="spot"),
             Hold("batch/job", "b", gpu))
    inventory = ClusterInventory(nodes, holds)
    w = cluster_withholding(inventory, {}, [_pairs(1, 1)])
    assert w.node_room == {CARDS: {"a": 2, "b": 1}}
    decided = plan_cluster([Waiting("x", CARD)], inventory, (), withholding=w)
    assert decided.start == [("x", "b")] and decided.pinned == {"x"}
    # admitted, its pod not bound: counted on the node it was admitted to
    w = cluster_withholding(inventory, {("x", ""): AdmittedStart(CARD, node="b")},
                            [_pairs(1, 1)])
    assert w.node_room == {CARDS: {"a": 2, "b": 0}} and w.on_demand_room == {CARDS: 0}
    # a full, b full, c free: a card could go only to c, where the pair needs both: it
    # waits, keeping no node from the holder's pair behind it
    full = ClusterInventory(nodes + (ClusterNode("c", "H200", "none", "570",
                                                 {"nvidia.com/gpu": 2}),),
                            (holds[0], Hold("ns/jupyter-ann", "a", gpu, "ann", ""),
                             Hold("batch/job", "b", {"nvidia.com/gpu": 2})))
    w = cluster_withholding(full, {}, [_pairs(1, 1)])
    assert w.refusal(CARD) is None and w.splitting_nodes(CARD) == {"c"}
    queue = [Waiting("y", CARD), Waiting("lee", PAIR, reservation=1)]
    decided = plan_cluster(queue, full, (), withholding=w)
    assert decided.waiting == ["y"] and decided.start == [("lee", "c")]
    # where spot pods yield, sam's card on a is room that breaks up nothing
    decided = plan_cluster(queue, full, (), spot_yields=True, withholding=w)
    assert decided.start == [("y", "a"), ("lee", "c")] and decided.pinned == {"y", "lee"}
    # no reservation of pairs: nothing pinned
    assert plan_cluster([Waiting("x", CARD)], inventory, ()).pinned == set()


def test_only_on_keeps_the_pod_to_its_node_within_each_term():
    terms = [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]
    on = {"key": "metadata.name", "operator": "In", "values": ["b"]}
    assert only_on(terms, "b") == [{**terms[0], "matchFields": [on]}]
    assert only_on([], "b") == [{"matchFields": [on]}]


def test_a_period_beginning_now_gets_only_what_running_servers_and_reservations_leave():
    total = {(KIND, "m"): 7}
    used = [(KIND, "m", HeldBy("on-demand", (f"u{s}", ""), None)) for s in range(3)]
    used += [(KIND, "m", HeldBy("spot", ("sam", ""), None))]  # spot yields: room
    used += [(KIND, "m", HeldBy("reserved", ("lee", ""), 1))]  # a unit of 1 in use
    # 7 - 3 on demand - 1 reserved in use = 3, less reservation 1's other idle unit
    assert units_free_now(total, used, [_res(1, 2)], KIND, 1, 10) == 2
    assert units_free_now(total, used, [_res(1, 2)], KIND, 1, 1) == 1  # up to `most`
    assert units_free_now(total, used, [], KIND, 1, 10) == 3
    # units of two cards: whole on one node
    cards = ("H200", None)
    pair = Reservation(2, "user:lee", "pair", cards, 2, 1, T0, T0 + H, 1)
    total = {(cards, "a"): 2, (cards, "b"): 2}
    busy = [(cards, "a", HeldBy("on-demand", ("ann", ""), None))]
    assert units_free_now(total, busy, [], cards, 2, 9) == 1  # b only: a has one card
    assert units_free_now(total, busy, [pair], cards, 2, 9) == 0  # b is promised
