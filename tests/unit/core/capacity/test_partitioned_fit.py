"""Admission, the queue and spot preemption on DynamicMIG nodes
(gpulease/core/capacity/partitioned_fit.py, cluster_queue.py, claim_preemption.py):
decided by the fit rule, as kube-scheduler would allocate."""

from __future__ import annotations

import pytest

from gpulease.core.capacity.claim_preemption import claim_victims
from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import DRA_NODE, ClusterInventory, ClusterNode, Hold
from gpulease.core.capacity.cluster_queue import plan_cluster
from gpulease.core.capacity.dynamic_mig import mig_resource, partitioned_node
from gpulease.core.capacity.partitioned_fit import keep_for, placed, with_admitted
from gpulease.core.capacity.partitions import free_counts, overlap
from gpulease.core.capacity.placement import NoFit
from gpulease.core.capacity.queue import Waiting
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.tiers import SPOT


def dynamic(name: str = "n", gpus: int = 1) -> ClusterNode:
    partitions = partitioned_node("H200", name, gpus, "580.95.5")
    return ClusterNode(name, "H200", DRA_NODE, "580.95.5", free_counts(partitions, ()),
                       partitions=partitions)


def slice_(profile: str) -> DeviceRequest:
    return DeviceRequest("H200", profile)


def hold(user: str, device: str, node: str = "n", tier: str = "on-demand",
         since: str = "2026-12-07T10:00:00Z") -> Hold:
    profile = device.split("-mig-", 1)[1].split("-", 1)[0] if "-mig-" in device else None
    resource = "nvidia.com/gpu"
    if profile:
        resource = mig_resource({"1g18gb": "1g.18gb", "2g35gb": "2g.35gb", "3g71gb": "3g.71gb",
                                 "7g141gb": "7g.141gb", "4g71gb": "4g.71gb"}[profile])
    return Hold(f"ns/{user}", node, {resource: 1}, user, "", tier == SPOT, tier,
                devices=(f"{node}/{device}",), since=since)


def test_free_counts_follow_the_slices_carved():
    inventory = ClusterInventory((dynamic(),), (hold("a", "gpu-0-mig-3g71gb-9-4"),))
    free = inventory.free()["n"]
    assert free[mig_resource("3g.71gb")] == 1 and free[mig_resource("1g.18gb")] == 4
    assert free["nvidia.com/gpu"] == 0 and free[mig_resource("7g.141gb")] == 0


def test_a_slice_fits_where_the_allocator_could_carve_it_after_the_admitted_ones():
    inventory = ClusterInventory((dynamic(),), (hold("a", "gpu-0-mig-3g71gb-9-0"),))
    assert fit(slice_("3g.71gb"), inventory) == "n"
    with pytest.raises(NoFit) as refused:
        fit(slice_("3g.71gb"), inventory, pending=(slice_("2g.35gb"),))
    assert refused.value.status == 503
    assert "carve" in refused.value.message and "1 x 3g.71gb" in refused.value.message
    assert fit(slice_("1g.18gb"), inventory, pending=(slice_("2g.35gb"),)) == "n"


def test_a_profile_no_node_can_carve_is_refused_for_good():
    with pytest.raises(NoFit) as refused:
        fit(DeviceRequest("A100-80GB", "1g.10gb"), ClusterInventory((dynamic(),)))
    assert refused.value.status == 422


def test_admitted_starts_take_the_devices_the_allocator_would_give_them():
    seen = with_admitted(ClusterInventory((dynamic(gpus=2),)),
                         [slice_("1g.18gb"), slice_("7g.141gb")])
    assert seen.allocated_on("n") == {"n/gpu-0-mig-1g18gb-19-0", "n/gpu-1-mig-7g141gb-0-0"}


def test_a_waiting_request_keeps_the_placement_nearest_to_free_the_last_of_equals():
    # 1g's at slices 0, 4, 5 of GPU 0 and 1, 2, 5 of GPU 1: a 3g at 0-3 of GPU 0 or at
    # 4-7 of GPU 1 waits for one of them to end, the others for two; of the two nearest
    # the last in the allocator's order is kept (later starts are carved from the front)
    holds = (hold("a", "gpu-0-mig-1g18gb-19-0"), hold("b", "gpu-0-mig-1g18gb-19-4"),
             hold("c", "gpu-1-mig-1g18gb-19-1"), hold("d", "gpu-0-mig-1g18gb-19-5"),
             hold("e", "gpu-1-mig-1g18gb-19-2"), hold("f", "gpu-1-mig-1g18gb-19-5"))
    inventory = ClusterInventory((dynamic(gpus=2),), holds)
    with pytest.raises(NoFit):
        fit(slice_("3g.71gb"), inventory)
    assert keep_for(slice_("3g.71gb"), inventory) == ["n/gpu-1-mig-3g71gb-9-4"]
    # a node the request's image cannot use is never kept on
    old = DeviceRequest("H200", "3g.71gb", min_driver="999.0")
    with pytest.raises(NoFit):
        fit(old, inventory)
    assert keep_for(old, inventory) == []


def test_a_later_request_may_fill_holes_but_not_carve_into_what_an_earlier_one_keeps():
    # slices 0-3 full, a 1g at 4: the waiting 3g keeps 4-7 (one blocker)
    holds = tuple(hold(u, f"gpu-0-mig-1g18gb-19-{i}") for u, i in
                  (("a", 0), ("c", 1), ("d", 2), ("e", 3), ("b", 4)))
    inventory = ClusterInventory((dynamic(),), holds)
    queue = [Waiting("big", slice_("3g.71gb")), Waiting("small", slice_("1g.18gb"))]
    plan = plan_cluster(queue, inventory)
    # the 1g's first fit is slice 5: inside what is kept, so it waits
    assert plan.start == [] and plan.waiting == ["big", "small"]
    assert fit(slice_("1g.18gb"), inventory) == "n"  # alone it would have been carved
    plan = plan_cluster(queue, ClusterInventory((dynamic(),), holds[:-1]))
    # b gone: the 3g is carved at 4-7, and no 1g is left (a 1g never goes at 7)
    assert plan.start == [("big", "n")] and plan.pinned == {"big"}
    assert plan.waiting == ["small"]


def test_a_waiting_7g_keeps_one_gpu_and_later_slices_fill_the_others():
    holds = tuple(hold(f"u{g}", f"gpu-{g}-mig-1g18gb-19-3") for g in range(8))
    inventory = ClusterInventory((dynamic(gpus=8),), holds)
    queue = [Waiting("full", slice_("7g.141gb"))] + [
        Waiting(f"s{i}", slice_("1g.18gb")) for i in range(3)] + [
        Waiting("two", slice_("2g.35gb"))]
    plan = plan_cluster(queue, inventory)
    assert plan.waiting == ["full"] and len(plan.start) == 4
    assert keep_for(slice_("7g.141gb"), inventory) == ["n/gpu-7-mig-7g141gb-0-0"]


def test_a_waiting_7g_is_not_overtaken_forever_by_1gs():
    inventory = ClusterInventory((dynamic(),), (hold("a", "gpu-0-mig-1g18gb-19-3"),))
    queue = [Waiting("full", slice_("7g.141gb"))] + [
        Waiting(f"s{i}", slice_("1g.18gb")) for i in range(3)]
    plan = plan_cluster(queue, inventory)
    assert plan.start == []
    plan = plan_cluster(queue, ClusterInventory((dynamic(),)))
    assert plan.start[0] == ("full", "n") and len(plan.start) == 1


def test_spot_victims_are_the_fewest_whose_slices_make_room():
    holds = (hold("s1", "gpu-0-mig-1g18gb-19-0", tier=SPOT, since="2026-12-07T09:00:00Z"),
             hold("s2", "gpu-0-mig-1g18gb-19-5", tier=SPOT, since="2026-12-07T11:00:00Z"),
             hold("s3", "gpu-0-mig-2g35gb-14-2", tier=SPOT, since="2026-12-07T10:00:00Z"),
             hold("od", "gpu-0-mig-1g18gb-19-4"))
    inventory = ClusterInventory((dynamic(),), holds)
    chosen = claim_victims(slice_("3g.71gb"), "on-demand", inventory)
    # 4-7 is blocked by the on-demand 1g; 0-3 by s1 and s3: both, and only them
    assert chosen is not None and set(chosen.victims) == {("s1", ""), ("s3", "")}
    assert claim_victims(slice_("7g.141gb"), "on-demand", inventory) is None
    assert claim_victims(slice_("3g.71gb"), SPOT, inventory) is None


def test_the_inventory_page_shows_each_gpus_carved_slices_and_holders():
    inventory = ClusterInventory((dynamic(gpus=2),), (hold("ada", "gpu-1-mig-2g35gb-14-2"),))
    row = inventory.rows()[0]
    assert row["gpus"] == [
        {"gpu": "gpu-0", "carved": []},
        {"gpu": "gpu-1", "carved": [{"device": "gpu-1-mig-2g35gb-14-2", "profile": "2g.35gb",
                                     "first_memory_slice": 2,
                                     "holder": {"user": "ada", "server": "",
                                                "tier": "on-demand"}}]}]
    free = {r["resource"]: r["free"] for r in row["resources"]}
    assert free[mig_resource("3g.71gb")] == 3


def test_the_start_form_counts_what_could_still_be_carved_after_the_admitted_starts():
    from gpulease.core.capacity.cluster_availability import QUEUE, cluster_availability

    inventory = ClusterInventory((dynamic(),), (hold("a", "gpu-0-mig-3g71gb-9-0"),))
    shown = cluster_availability(slice_("1g.18gb"), inventory)
    assert (shown.free, shown.total) == (3, 7)
    # an admitted 3g (not bound yet) takes slices 4-7: no 1g is left to carve
    shown = cluster_availability(slice_("1g.18gb"), inventory, admitted=(slice_("3g.71gb"),))
    assert (shown.free, shown.state) == (0, QUEUE)


def test_an_overdrawn_counter_stops_every_allocation_of_its_pool_as_the_scheduler_does():
    # a full GPU and a 1g of it allocated together (written by hand): kube-scheduler's
    # checkAvailableCounters then refuses every device of the pool, on either GPU
    from gpulease.core.capacity.partitions import first_fit

    partitions = partitioned_node("H200", "n", 2)
    overdrawn = {"n/gpu-0", "n/gpu-0-mig-1g18gb-19-0"}
    assert first_fit(partitions, mig_resource("1g.18gb"), overdrawn) is None
    assert free_counts(partitions, overdrawn)[mig_resource("1g.18gb")] == 0
    assert first_fit(partitions, mig_resource("1g.18gb"), {"n/gpu-0"}).key == (
        "n/gpu-1-mig-1g18gb-19-0")


def test_victims_for_a_full_gpu_over_fourteen_spot_slices_are_the_seven_newest_of_one_gpu():
    holds = tuple(hold(f"s{g}{i}", f"gpu-{g}-mig-1g18gb-19-{i}", tier=SPOT,
                       since=f"2026-12-07T{10 + g}:{i:02d}:00Z")
                  for g in (0, 1) for i in range(7))
    inventory = ClusterInventory((dynamic(gpus=2),), holds)
    chosen = claim_victims(DeviceRequest("H200", count=1), "on-demand", inventory)
    assert chosen is not None and set(chosen.victims) == {(f"s1{i}", "") for i in range(7)}


def test_victims_leave_alone_the_slices_admitted_starts_will_take():
    holds = (hold("v", "gpu-0-mig-3g71gb-9-0", tier=SPOT, since="2026-12-07T11:00:00Z"),
             hold("w", "gpu-0-mig-3g71gb-9-4", tier=SPOT, since="2026-12-07T10:00:00Z"))
    inventory = ClusterInventory((dynamic(),), holds)
    # a 1g admitted, not bound yet: the allocator gives it slice... none is free, so it
    # waits too; a 3g admitted before takes nothing. With v gone the admitted 1g takes
    # slice 0: the on-demand 3g must then have w's 4-7
    chosen = claim_victims(slice_("3g.71gb"), "on-demand", inventory,
                           pending=(slice_("1g.18gb"),))
    assert chosen is not None and chosen.victims == (("v", ""),)


def test_a_pool_name_with_a_slash_keeps_its_holds():
    from gpulease.core.capacity.dra_inventory import dra_inventory
    from tests.cluster.dra_driver import pool_slices
    from tests.cluster.nodes import GpuNode
    from tests.unit.core.capacity.test_dra_inventory import claim, node_object, pod

    spec = GpuNode("dyn", gpus=1, dra=True, dynamic_mig=True)
    slices = pool_slices(spec)
    for s in slices:
        s["spec"]["pool"]["name"] = "lab.example/dyn"
    inventory = dra_inventory([node_object(spec)], slices,
                              [claim("c", [("lab.example/dyn", "gpu-0-mig-3g71gb-9-0")], "u1")],
                              [pod("jupyter-ada", "u1", "ada", "dyn")])
    assert inventory.free()["dyn"][mig_resource("3g.71gb")] == 1
    assert inventory.rows()[0]["gpus"][0]["carved"][0]["holder"]["user"] == "ada"


def test_on_several_nodes_a_start_is_pinned_where_it_was_carved_and_the_pass_sees_it_there():
    a, b = dynamic("a"), dynamic("b")
    holds = (hold("x", "gpu-0-mig-1g18gb-19-0", node="a"),
             hold("y", "gpu-0-mig-1g18gb-19-4", node="a"),
             hold("p", "gpu-0-mig-1g18gb-19-0", node="b"),
             hold("q", "gpu-0-mig-1g18gb-19-4", node="b"),
             hold("r", "gpu-0-mig-1g18gb-19-5", node="b"))
    queue = [Waiting("big", slice_("3g.71gb"))] + [
        Waiting(f"s{i}", slice_("1g.18gb")) for i in range(4)]
    plan = plan_cluster(queue, ClusterInventory((a, b), holds))
    # the 3g keeps a placement of one blocker on a; a 1g is never admitted to carve into
    # it: each start is pinned to the node it was carved on, and those after it see it
    started = dict(plan.start)
    assert plan.waiting[0] == "big" and started and plan.pinned == set(started)
    (kept,) = keep_for(slice_("3g.71gb"), ClusterInventory((a, b), holds))
    kept_on = a if kept.startswith("a/") else b
    seen = ClusterInventory((a, b), holds)
    for _key, node in plan.start:
        seen = placed(seen, slice_("1g.18gb"), node)
        (new,) = seen.holds[-1].devices
        if node == kept_on.name:
            p = kept_on.partitions
            assert not overlap(p.device(new), p.device(kept), p), (new, kept)
