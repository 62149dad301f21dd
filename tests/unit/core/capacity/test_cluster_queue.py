"""The cluster shape's fair queue (gpulease/core/capacity/cluster_queue.py): pure, no cluster."""

from __future__ import annotations

from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, Hold
from gpulease.core.capacity.cluster_queue import plan_cluster
from gpulease.core.capacity.queue import Waiting
from gpulease.core.model.device_request import DeviceRequest

EIGHT = DeviceRequest("H200", None, 8)
ONE = DeviceRequest("H200", None, 1)
SLICE = DeviceRequest("H200", "1g.18gb")


def cluster(used: dict[str, int], mig_node: bool = False) -> ClusterInventory:
    """Two 8-GPU H200 nodes with `used` GPUs taken on each (by pods outside the queue)."""
    nodes = [ClusterNode(n, "H200", "mixed", "570", {"nvidia.com/gpu": 8}) for n in ("a", "b")]
    if mig_node:
        nodes.append(ClusterNode("m", "H200", "mixed", "570", {"nvidia.com/mig-1g.18gb": 7}))
    holds = [Hold(f"x/{n}", n, {"nvidia.com/gpu": k}) for n, k in used.items() if k]
    return ClusterInventory(tuple(nodes), tuple(holds))


def test_a_head_that_does_not_fit_keeps_its_nodes_from_later_requests_of_its_kind():
    queue = [Waiting("big", EIGHT), Waiting("small-1", ONE), Waiting("small-2", ONE),
             Waiting("slice", SLICE)]
    decision = plan_cluster(queue, cluster({"a": 1, "b": 1}, mig_node=True))
    assert decision.waiting == ["big", "small-1", "small-2"]  # 14 GPUs free, none taken
    assert decision.start == [("slice", "m")]  # another kind passes


def test_the_head_starts_once_a_node_drains_and_the_rest_follow():
    queue = [Waiting("big", EIGHT), Waiting("small-1", ONE), Waiting("small-2", ONE)]
    decision = plan_cluster(queue, cluster({"a": 0, "b": 3}))
    assert decision.start[0] == ("big", "a")
    assert [k for k, _ in decision.start[1:]] == ["small-1", "small-2"]
    assert {n for _, n in decision.start[1:]} == {"b"}  # packed beside the other pod


def test_never_repeated_starvation_by_one_gpu_requests():
    """Each pass, one GPU frees on the node the 1-GPU requests use; a stream of them
    never takes it while the 8-GPU request waits, so the node drains."""
    used = {"a": 8, "b": 8}
    for step in range(8):
        used["a"] -= 1  # a pod on a ends
        queue = [Waiting("big", EIGHT), Waiting(f"small-{step}", ONE)]
        decision = plan_cluster(queue, cluster(used))
        if used["a"] == 0:
            assert decision.start == [("big", "a")]
            return
        assert decision.start == []  # the freed GPU stays free for the head
    raise AssertionError("node a never drained")


def test_what_no_node_can_run_is_refused_and_blocks_no_one():
    queue = [Waiting("nine", DeviceRequest("H200", None, 9)),
             Waiting("a100", DeviceRequest("A100-80GB", None, 1)), Waiting("one", ONE)]
    decision = plan_cluster(queue, cluster({"a": 0, "b": 0}))
    assert [k for k, _ in decision.never] == ["nine", "a100"]
    assert "largest H200 node has 8" in decision.never[0][1]
    assert decision.start == [("one", "a")] or decision.start == [("one", "b")]


def test_admitted_pods_not_yet_bound_are_counted_first():
    decision = plan_cluster([Waiting("one", ONE)], cluster({"a": 0, "b": 0}),
                            admitted=[EIGHT, EIGHT])
    assert decision.waiting == ["one"]  # both nodes are promised to the admitted pods


def test_a_spot_request_waits_behind_an_on_demand_one_that_came_later():
    queue = [Waiting("spot", ONE, spot=True), Waiting("paying", EIGHT)]
    decision = plan_cluster(queue, cluster({"a": 0, "b": 8}))  # a is wholly free
    assert decision.start == [("paying", "a")] and decision.waiting == ["spot"]


def test_an_on_demand_start_counts_what_spot_pods_hold_where_they_yield():
    nodes = (ClusterNode("a", "H200", "mixed", "570", {"nvidia.com/gpu": 8}),)
    holds = (Hold("ns/spot-1", "a", {"nvidia.com/gpu": 4}, "sue", "", spot=True),
             Hold("ns/odin", "a", {"nvidia.com/gpu": 4}, "odin", ""))
    full = ClusterInventory(nodes, holds)
    queue = [Waiting("paying", ONE), Waiting("spot", ONE, spot=True)]
    # without PriorityClasses nothing is preempted: both wait
    assert plan_cluster(queue, full).waiting == ["paying", "spot"]
    decision = plan_cluster(queue, full, spot_yields=True)
    assert decision.start == [("paying", "a")]  # kube-scheduler preempts a spot pod for it
    assert decision.waiting == ["spot"]  # a spot start only ever takes what is free
    # what an on-demand pod holds is never counted as free
    assert plan_cluster([Waiting("big", EIGHT)], full, spot_yields=True).waiting == ["big"]
