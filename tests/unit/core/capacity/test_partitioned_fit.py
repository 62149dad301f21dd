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
from gpulease.core.capacity.partitioned_fit import keep_for, with_admitted
from gpulease.core.capacity.partitions import free_counts
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


def test_a_waiting_request_keeps_the_placement_nearest_to_free():
    # 1g's at slices 0, 4, 5 of GPU 0 and 1, 2, 5 of GPU 1: a 3g at 0-3 of GPU 0 or at
    # 4-7 of GPU 1 waits for one of them to end, the others for two; of the two nearest
    # the allocator's order keeps GPU 0's
    holds = (hold("a", "gpu-0-mig-1g18gb-19-0"), hold("b", "gpu-0-mig-1g18gb-19-4"),
             hold("c", "gpu-1-mig-1g18gb-19-1"), hold("d", "gpu-0-mig-1g18gb-19-5"),
             hold("e", "gpu-1-mig-1g18gb-19-2"), hold("f", "gpu-1-mig-1g18gb-19-5"))
    inventory = ClusterInventory((dynamic(gpus=2),), holds)
    with pytest.raises(NoFit):
        fit(slice_("3g.71gb"), inventory)
    assert keep_for(slice_("3g.71gb"), inventory) == ["n/gpu-0-mig-3g71gb-9-0"]


def test_a_later_request_may_fill_holes_but_not_carve_into_what_an_earlier_one_keeps():
    holds = (hold("a", "gpu-0-mig-1g18gb-19-0"), hold("b", "gpu-0-mig-1g18gb-19-4"))
    inventory = ClusterInventory((dynamic(),), holds)
    queue = [Waiting("big", slice_("3g.71gb")), Waiting("small", slice_("1g.18gb")),
             Waiting("small2", slice_("2g.35gb"))]
    plan = plan_cluster(queue, inventory)
    # the 3g keeps slices 0-3 (one blocker); the 1g's first fit is slice 1: inside
    # what is kept, so it waits; the 2g's is slices 2-3: kept too
    assert plan.start == [] and plan.waiting == ["big", "small", "small2"]
    freed = ClusterInventory((dynamic(),), holds[1:])
    plan = plan_cluster(queue, freed)
    # once the 3g is admitted its devices are taken first, the 1g fills the hole at
    # slice 5, and the 2g (at 0, 2 or 4 only) finds none
    assert plan.start == [("big", "n"), ("small", "n")] and plan.waiting == ["small2"]


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
