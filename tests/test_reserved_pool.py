"""What reservations withhold (spawners/reserved_pool.py), and how the queue and the
preemption plan honour it: pure, over a declared inventory."""

import datetime as dt

from gpulease.hub.reservation_rules import Reservation
from gpulease.spawners.cluster_inventory import ClusterInventory, ClusterNode, Hold
from gpulease.spawners.cluster_queue import AdmittedStart, cluster_withholding, plan_cluster
from gpulease.spawners.inventory import parse_declared_inventory
from gpulease.spawners.placement import DeviceRequest
from gpulease.spawners.preemption import SpotHolding, plan_preemptions
from gpulease.spawners.queue import Waiting, plan
from gpulease.spawners.reserved_pool import NO_WITHHOLDING, HeldBy, withholding

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
