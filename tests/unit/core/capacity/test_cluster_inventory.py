"""The cluster shape's inventory and capacity decision (gpulease/core/capacity/
cluster_inventory.py, cluster_fit.py, cluster_offer.py): pure."""

from __future__ import annotations

import pytest

from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import (
    ClusterInventory,
    ClusterNode,
    Hold,
    hold_from_pod,
    node_from_object,
)
from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest
from tests.cluster.nodes import GpuNode, node_object

SLICE = DeviceRequest("H200", "1g.18gb")


def _node(name: str, model: str = "H200", strategy: str = "mixed", schedulable: bool = True,
          single: str | None = None, **allocatable: int) -> ClusterNode:
    resources = {k.replace("_", "-").replace("mig-1g-18gb", "mig-1g.18gb"): v
                 for k, v in allocatable.items()}
    return ClusterNode(name, model, strategy, "570.133.20",
                       {f"nvidia.com/{r}": v for r, v in resources.items()}, schedulable, single)


def _pod(name: str, node: str, resources: dict[str, str], user: str = "", phase: str = "Running",
         server: str = "") -> dict:
    meta = {"name": name, "namespace": "ns", "labels": {}, "annotations": {}}
    if user:
        meta["labels"]["hub.jupyter.org/username"] = user
        meta["annotations"]["hub.jupyter.org/servername"] = server
    return {"metadata": meta, "status": {"phase": phase},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": resources}}]}}


def test_a_gfd_labelled_node_reads_as_its_model_strategy_driver_and_gpu_resources():
    obj = node_object(GpuNode("n1", model="A100-80GB", product="NVIDIA-A100-80GB-PCIe",
                              mig={"1g.10gb": 7}, gpus=2))
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node = node_from_object(obj)
    assert (node.model, node.mig_strategy, node.driver) == ("A100-80GB", "mixed", "570.133.20")
    assert node.allocatable == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 7}
    assert node.schedulable
    obj["spec"]["unschedulable"] = True  # cordoned
    assert not node_from_object(obj).schedulable


def test_holds_come_from_live_gpu_pods_only():
    assert hold_from_pod(_pod("a", "n1", {"cpu": "2"})) is None
    assert hold_from_pod(_pod("b", "n1", {"nvidia.com/gpu": "2"}, phase="Succeeded")) is None
    hold = hold_from_pod(_pod("c", "n1", {"nvidia.com/gpu": "2"}, user="alice", server="big"))
    assert hold == Hold("ns/c", "n1", {"nvidia.com/gpu": 2}, "alice", "big")


def test_a_user_label_outside_the_servers_namespace_is_a_foreign_pod():
    """Attack: a tenant who may make pods in another namespace labels one as alice's server.
    It must count as their pod (namespace/name), not against alice's limits."""
    forged = _pod("x", "n1", {"nvidia.com/gpu": "1"}, user="alice")
    forged["metadata"]["namespace"] = "batch"
    assert hold_from_pod(forged, "ns") == Hold("batch/x", "n1", {"nvidia.com/gpu": 1})
    real = _pod("jupyter-alice", "n1", {"nvidia.com/gpu": "1"}, user="alice")
    assert hold_from_pod(real, "ns").user == "alice"


def test_the_user_is_the_annotations_name_not_the_escaped_label():
    """kubespawner writes `a--b` as `a-b---90827a2e` in the label: her pods are still hers."""
    pod = _pod("jupyter-a-b---90827a2e", "n1", {"nvidia.com/gpu": "1"}, user="a-b---90827a2e")
    pod["metadata"]["annotations"]["hub.jupyter.org/username"] = "a--b"
    assert hold_from_pod(pod, "ns").user == "a--b"


def test_rows_count_free_per_node_and_name_gpuleases_holders():
    inventory = ClusterInventory(
        (_node("n1", mig_1g_18gb=7),),
        (Hold("ns/jupyter-alice", "n1", {"nvidia.com/mig-1g.18gb": 1}, "alice", ""),
         Hold("other/job", "n1", {"nvidia.com/mig-1g.18gb": 2})))
    (row,) = inventory.rows()
    (resource,) = row["resources"]
    assert resource == {"resource": "nvidia.com/mig-1g.18gb", "allocatable": 7, "free": 4,
                        "holders": [{"user": "alice", "server": "", "tier": "on-demand",
                                     "count": 1},
                                    {"pod": "other/job", "count": 2}]}


def test_a_request_no_node_could_ever_run_is_422_naming_what_exists():
    inventory = ClusterInventory((_node("n1", gpu=4), _node("m1", model="A100-80GB", gpu=8)))
    with pytest.raises(NoFit) as never:
        fit(DeviceRequest("H200", None, 8), inventory)
    assert never.value.status == 422
    assert "largest H200 node has 4" in never.value.message
    with pytest.raises(NoFit) as missing:
        fit(DeviceRequest("L40S"), inventory)
    assert missing.value.status == 422
    assert "offered: A100-80GB full cards, H200 full cards" in missing.value.message


def test_a_multi_gpu_request_needs_one_node_with_that_many_free():
    inventory = ClusterInventory((_node("a", gpu=4), _node("b", gpu=4)),
                                 (Hold("x/1", "a", {"nvidia.com/gpu": 2}),
                                  Hold("x/2", "b", {"nvidia.com/gpu": 2})))
    with pytest.raises(NoFit) as busy:  # 4 free in all, but no node has 3
        fit(DeviceRequest("H200", None, 3), inventory)
    assert busy.value.status == 503 and "4 free across 2 node(s)" in busy.value.message
    assert fit(DeviceRequest("H200", None, 2), inventory) in ("a", "b")


def test_the_fullest_node_is_filled_first_and_pending_requests_get_room_first():
    inventory = ClusterInventory((_node("empty", mig_1g_18gb=7), _node("busy", mig_1g_18gb=7)),
                                 (Hold("x/1", "busy", {"nvidia.com/mig-1g.18gb": 5}),))
    assert fit(SLICE, inventory) == "busy"
    assert fit(SLICE, inventory, pending=(SLICE, SLICE)) == "empty"


def test_cordoned_nodes_and_the_single_strategy():
    inventory = ClusterInventory((_node("cordoned", schedulable=False, mig_1g_18gb=7),
                                  _node("single", strategy="single", single="1g.18gb", gpu=7)))
    assert fit(SLICE, inventory) == "single"  # a slice is one nvidia.com/gpu there
    with pytest.raises(NoFit):  # its GPUs are all slices: no whole card there
        fit(DeviceRequest("H200"), ClusterInventory(inventory.nodes[1:]))
    with pytest.raises(NoFit) as none:
        fit(SLICE, ClusterInventory((_node("cordoned", schedulable=False, mig_1g_18gb=7),)))
    assert none.value.status == 503


def _reference_fit(request: DeviceRequest, inventory: ClusterInventory,
                   pending: tuple[DeviceRequest, ...]) -> str | None:
    """The decision by brute force: every node, the fewest left over, then by name."""
    from gpulease.core.capacity.cluster_inventory import kinds_offered
    free = {n.name: dict(r) for n, r in ((n, inventory.free()[n.name]) for n in inventory.nodes)}

    def pick(wanted: DeviceRequest):
        options = []
        for node in inventory.nodes:
            for kind, resource in kinds_offered(node):
                if node.schedulable and kind == (wanted.model, wanted.mig_profile):
                    left = max(free[node.name][resource], 0) - wanted.count
                    if left >= 0:
                        options.append((left, node.name, resource))
        return min(options) if options else None
    for earlier in pending:
        chosen = pick(earlier)
        if chosen:
            free[chosen[1]][chosen[2]] = max(free[chosen[1]][chosen[2]], 0) - earlier.count
    chosen = pick(request)
    return chosen[1] if chosen else None


def test_the_indexed_decision_is_the_brute_force_one():
    import random
    rng = random.Random(3)
    kinds = [DeviceRequest("H200", "1g.18gb"), DeviceRequest("H200", None, 1),
             DeviceRequest("H200", None, 4), DeviceRequest("A100-80GB", None, 2)]
    for case in range(300):
        nodes, holds = [], []
        for n in range(rng.randint(1, 12)):
            model = rng.choice(("H200", "A100-80GB"))
            allocatable = rng.choice(({"gpu": 8}, {"mig_1g_18gb": 7}, {"gpu": 4, "mig_1g_18gb": 7}))
            node = _node(f"n{n:02d}", model=model, schedulable=rng.random() > 0.1, **allocatable)
            nodes.append(node)
            for resource, count in node.allocatable.items():
                taken = rng.randint(0, count)
                if taken:
                    holds.append(Hold(f"x/{case}-{n}-{resource}", node.name, {resource: taken}))
        inventory = ClusterInventory(tuple(nodes), tuple(holds))
        pending = tuple(rng.choice(kinds) for _ in range(rng.randint(0, 4)))
        for request in kinds:
            expected = _reference_fit(request, inventory, pending)
            try:
                got = fit(request, inventory, pending)
            except NoFit:
                got = None
            assert got == expected, (case, request, pending)


def test_a_taint_is_tolerated_by_kubernetes_rule():
    from gpulease.core.capacity.cluster_inventory import tolerated

    taint = ("nvidia.com/gpu", "present", "NoSchedule")
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists"}])  # any effect
    assert tolerated(taint, [{"operator": "Exists"}])  # every taint
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "value": "present"}])  # Equal
    assert not tolerated(taint, [{"key": "nvidia.com/gpu", "value": "absent"}])
    assert not tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoExecute"}])
    assert not tolerated(("maintenance", "true", "NoSchedule"), [
        {"key": "nvidia.com/gpu", "operator": "Exists"}])


@pytest.mark.parametrize("written, count", [("2", 2), ("1k", 1000), ("1e3", 1000),
                                            ("1Ki", 1024)])
def test_a_pods_gpus_in_any_whole_quantity_form_are_counted(written: str, count: int):
    """Attack: the API server takes any whole quantity for an extended resource and keeps
    the form it was given; int('1k') raised, and with it every inventory holding that pod
    (anyone's, in any namespace): no GPU start could be admitted."""
    hold = hold_from_pod(_pod("big", "", {"nvidia.com/gpu": written}))
    assert hold.resources == {"nvidia.com/gpu": count}


def test_gpus_an_init_container_or_sidecar_asks_for_are_held():
    """kube-scheduler holds max(containers + sidecars, the largest init container's need)
    for the pod's whole life: a pod asking its GPUs in an init container held 4 unseen,
    so gpulease admitted starts to GPUs the scheduler counted as taken."""
    def c(n: str, **more) -> dict:
        return {"resources": {"limits": {"nvidia.com/gpu": n}}, **more}
    pod = _pod("job", "n1", {"nvidia.com/gpu": "1"})
    pod["spec"]["initContainers"] = [c("4")]
    assert hold_from_pod(pod).resources == {"nvidia.com/gpu": 4}
    pod["spec"]["initContainers"] = [c("1", restartPolicy="Always"), c("2")]  # sidecar first
    assert hold_from_pod(pod).resources == {"nvidia.com/gpu": 3}  # 1+2 during init; 1+1 after
    pod["spec"]["initContainers"] = [c("2", restartPolicy="Always")]
    assert hold_from_pod(pod).resources == {"nvidia.com/gpu": 3}  # sidecar runs beside
    only_init = _pod("prep", "n1", {"cpu": "1"})
    only_init["spec"]["initContainers"] = [c("1")]
    assert hold_from_pod(only_init).resources == {"nvidia.com/gpu": 1}


def test_a_nodes_allocatable_in_a_quantity_form_is_read():
    obj = node_object(GpuNode("n1", gpus=8))
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "8e0"
    assert node_from_object(obj).allocatable["nvidia.com/gpu"] == 8


def test_a_spot_server_is_known_by_its_tier_label_in_the_servers_namespace_only():
    """Attack: a pod labelled spot elsewhere must not read as a spot server's (an on-demand
    start would count its GPUs as free, and kube-scheduler would never give them)."""
    pod = _pod("jupyter-sue", "n1", {"nvidia.com/gpu": "1"}, user="sue")
    pod["metadata"]["labels"]["gpulease.io/tier"] = "spot"
    assert hold_from_pod(pod, "ns").spot is True
    pod["metadata"]["namespace"] = "batch"
    assert hold_from_pod(pod, "ns").spot is False
    inventory = ClusterInventory(
        (_node("n1", gpu=2),),
        (Hold("ns/jupyter-sue", "n1", {"nvidia.com/gpu": 1}, "sue", "", spot=True),
         Hold("ns/jupyter-odin", "n1", {"nvidia.com/gpu": 1}, "odin", "")))
    assert inventory.free()["n1"]["nvidia.com/gpu"] == 0
    assert inventory.without_spot().free()["n1"]["nvidia.com/gpu"] == 1
    (row,) = inventory.rows()
    assert [h["tier"] for h in row["resources"][0]["holders"]] == ["spot", "on-demand"]
