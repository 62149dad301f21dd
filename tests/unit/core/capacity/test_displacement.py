"""Which on-demand servers a holder's start displaces (gpulease/core/capacity/displacement.py): the
rule over counts, then its readings of the embedded box and of the cluster."""

import datetime as dt

from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, Hold
from gpulease.core.capacity.cluster_queue import cluster_withholding
from gpulease.core.capacity.displacement import (
    Displacement,
    OnDemandServer,
    in_the_cluster,
    on_the_box,
    to_displace,
)
from gpulease.core.capacity.reservation_rules import Reservation
from gpulease.core.capacity.reserved_pool import HeldBy, withholding
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory

T0 = dt.datetime(2026, 12, 7, 9)
H = dt.timedelta(hours=1)
SLICE = DeviceRequest("H200", "1g.18gb")
KIND = ("H200", "1g.18gb")
INV = parse_declared_inventory(
    {"nodes": [{"name": "m", "gpus": [{"model": "H200", "mig": ["1g.18gb"] * 3}]}]}, "test")
SLICES = [f"MIG-declared-m-0-{s}-1g.18gb" for s in range(3)]


def _od(key: str, node: str, devices: int, started: int) -> OnDemandServer:
    return OnDemandServer((key, ""), node, devices, started)


def test_the_newest_on_demand_servers_within_the_overflow_are_displaced():
    servers = [_od("old", "a", 1, 1), _od("new", "a", 1, 5), _od("mid", "a", 1, 3)]
    assert to_displace(1, 2, {"a": 0}, servers) == Displacement("a", (("new", ""),), 1)
    assert to_displace(2, 2, {"a": 0}, servers) == Displacement(
        "a", (("new", ""), ("mid", "")), 2)
    # one device beyond on-demand's share: a second server is never stopped for it
    assert to_displace(2, 1, {"a": 0}, servers) is None
    # free room on the node counts first
    assert to_displace(2, 1, {"a": 1}, servers) == Displacement("a", (("new", ""),), 1)


def test_nothing_is_displaced_without_an_overflow_or_where_the_start_fits():
    servers = [_od("ann", "a", 1, 1)]
    assert to_displace(1, 0, {"a": 0}, servers) is None  # on demand within its share
    assert to_displace(1, 1, {"a": 0, "b": 1}, servers) is None  # b has room (or spot)
    # ...unless b is not a node the unit may go to
    assert to_displace(1, 1, {"a": 0, "b": 1}, servers, nodes={"a"}) == Displacement(
        "a", (("ann", ""),), 1)
    assert to_displace(1, 1, {"a": 0}, servers, nodes={"b"}) is None


def test_the_node_needing_the_fewest_servers_then_devices_then_the_newest():
    servers = [_od("a1", "a", 1, 9), _od("a2", "a", 1, 8), _od("b1", "b", 2, 1),
               _od("c1", "c", 2, 4)]
    # a pair: one server on b or c (fewest servers), c's the newer
    assert to_displace(2, 4, {"a": 0, "b": 0, "c": 0}, servers) == Displacement(
        "c", (("c1", ""),), 2)
    # a largest server last taken may round the displaced devices up
    assert to_displace(1, 1, {"b": 0}, servers) == Displacement("b", (("b1", ""),), 2)


def _res(units: int) -> Reservation:
    return Reservation(1, "user:lee", "slice", KIND, 1, units, T0, T0 + 4 * H, 800_000)


def test_on_the_box_reads_holders_tiers_and_sessions():
    # the period began with three on-demand servers on the three slices
    held = {SLICES[s]: HeldBy("on-demand", (f"u{s}", ""), None) for s in range(3)}
    w = withholding(INV, held, [_res(1)])
    started = {("u0", ""): 10, ("u1", ""): 12, ("u2", ""): 11}
    assert on_the_box(SLICE, 1, INV, held, started, w) == Displacement(
        "m", (("u1", ""),), 1)
    # a spot server's slice is room: spot preemption makes it, nobody is displaced
    spot = {**held, SLICES[1]: HeldBy("spot", ("sam", ""), None)}
    assert on_the_box(SLICE, 1, INV, spot, started, withholding(INV, spot, [_res(1)])) is None
    # a holder whose units are all in use displaces nobody
    used = {**held, SLICES[1]: HeldBy("reserved", ("lee", "a"), 1)}
    assert on_the_box(SLICE, 1, INV, used, started, withholding(INV, used, [_res(1)])) is None


def test_in_the_cluster_counts_pods_per_node():
    node = ClusterNode("n1", "H200", "none", "570", {"nvidia.com/gpu": 2})
    inv = ClusterInventory((node,), (
        Hold("ns/p1", "n1", {"nvidia.com/gpu": 1}, "ann", ""),
        Hold("ns/p2", "n1", {"nvidia.com/gpu": 1}, "bo", ""),
    ))
    card = DeviceRequest("H200")
    res = Reservation(1, "user:lee", "full", ("H200", None), 1, 1, T0, T0 + H, 1)
    w = cluster_withholding(inv, {}, [res])
    started = {("ann", ""): 3, ("bo", ""): 2}
    assert in_the_cluster(card, 1, inv, started, w, False) == Displacement(
        "n1", (("ann", ""),), 1)
    # bo's pod is spot (not a session on demand): its card is room where spot yields
    spot = ClusterInventory((node,), (inv.holds[0], Hold("ns/p2", "n1", {"nvidia.com/gpu": 1},
                                                        "bo", "", spot=True, tier="spot")))
    w = cluster_withholding(spot, {}, [res])
    assert in_the_cluster(card, 1, spot, {("ann", ""): 3}, w, True) is None


def test_on_demand_singles_splitting_the_nodes_make_way_for_a_reserved_pair():
    # two nodes of two cards, a pair reserved, one on-demand card on each node: on
    # demand holds no more than its share, but no node has the pair's two cards
    servers = [_od("ann", "n1", 1, 1), _od("bob", "n2", 1, 2)]
    assert to_displace(2, 0, {"n1": 1, "n2": 1}, servers) == Displacement(
        "n2", (("bob", ""),), 1)
    # only where the cards would be enough on one node: not when they are missing
    assert to_displace(2, 0, {"n1": 1, "n2": 0}, servers) is None


def test_the_holders_own_on_demand_servers_make_way_first():
    servers = [_od("lee", "m", 1, 1), _od("ann", "m", 1, 4)]
    lee = OnDemandServer(("lee", ""), "m", 1, 1, own=True)
    assert to_displace(1, 1, {"m": 0}, [lee, servers[1]]) == Displacement(
        "m", (("lee", ""),), 1)
    assert to_displace(1, 1, {"m": 0}, servers) == Displacement("m", (("ann", ""),), 1)
    # across nodes: a node where only the holder's own servers go wins
    far = [OnDemandServer(("lee", "x"), "b", 2, 1, own=True), _od("ann", "a", 1, 9)]
    assert to_displace(1, 2, {"a": 0, "b": 0}, far) == Displacement(
        "b", (("lee", "x"),), 2)


def test_on_the_box_a_pair_split_by_singles_and_the_holders_own_server():
    cards = parse_declared_inventory({"nodes": [
        {"name": n, "gpus": [{"model": "H100-80GB", "memory": "80Gi"}] * 2}
        for n in ("n1", "n2")]}, "test")
    uuids = {n: [d.uuid for d in cards.allocatable() if d.node == n] for n in ("n1", "n2")}
    pair = Reservation(1, "user:lee", "pair", ("H100-80GB", None), 2, 1, T0, T0 + H, 1)
    held = {uuids["n1"][0]: HeldBy("on-demand", ("ann", ""), None),
            uuids["n2"][0]: HeldBy("on-demand", ("bob", ""), None)}
    started = {("ann", ""): 1, ("bob", ""): 2}
    w = withholding(cards, held, [pair])
    assert on_the_box(DeviceRequest("H100-80GB", None, 2), 1, cards, held, started, w) == (
        Displacement("n2", (("bob", ""),), 1))
    # the holder's own on-demand slice goes before a stranger's newer one
    held = {SLICES[0]: HeldBy("on-demand", ("lee", "x"), None),
            SLICES[1]: HeldBy("on-demand", ("ann", "a"), None),
            SLICES[2]: HeldBy("on-demand", ("ann", "c"), None)}
    started = {("lee", "x"): 1, ("ann", "a"): 2, ("ann", "c"): 3}
    w = withholding(INV, held, [_res(1)])
    assert on_the_box(SLICE, 1, INV, held, started, w, own={("lee", "x")}) == Displacement(
        "m", (("lee", "x"),), 1)
