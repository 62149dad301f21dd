"""The DRA inventory (gpulease/core/capacity/dra_inventory.py): NVIDIA's slices and the
allocated claims make the same ClusterInventory that admission decides on, with each
device and its holder. The slices are the driver test double's (tests/cluster/dra_driver.py)."""

from __future__ import annotations

import copy

import pytest

from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import DRA_NODE
from gpulease.core.capacity.dra_inventory import (
    attribute,
    current_slices,
    device_index,
    dra_inventory,
)
from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.nvidia_dra import DRIVER
from tests.cluster.dra_driver import node_slice
from tests.cluster.nodes import GpuNode
from tests.cluster.nodes import node_object as unready_node

NS = "jhub-users"
MIG = GpuNode("dra-mig", mig={"1g.18gb": 7, "3g.71gb": 2}, dra=True)
CARDS = GpuNode("dra-cards", gpus=4, dra=True, driver="580.95.5")


def node_object(spec: GpuNode) -> dict:
    """The Node as kwok keeps it: Ready."""
    obj = unready_node(spec)
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return obj


def pod(name: str, uid: str, user: str = "", node: str = "", namespace: str = NS,
        tier: str = "") -> dict:
    annotations = {"hub.jupyter.org/username": user,
                   "hub.jupyter.org/servername": ""} if user else {}
    labels = {"gpulease.io/tier": tier} if tier else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "annotations": annotations, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "notebook"}]},
            "status": {"phase": "Running"}}


def claim(name: str, devices: list[tuple[str, str]], pod_uid: str = "",
          namespace: str = NS, reserved: bool = True, driver: str = DRIVER) -> dict:
    status: dict = {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": driver, "pool": pool, "device": device}
        for pool, device in devices]}}}
    owner = []
    if pod_uid:
        if reserved:
            status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod_uid}]
        owner = [{"kind": "Pod", "name": "p", "uid": pod_uid, "controller": True}]
    return {"metadata": {"name": name, "namespace": namespace, "ownerReferences": owner},
            "status": status}


def names(spec: GpuNode, kind: str) -> list[str]:
    return [d["name"] for d in node_slice(spec)["spec"]["devices"]
            if attribute(d, "type") == kind]


def test_a_nodes_devices_are_counted_by_kind_under_the_device_plugins_names():
    inventory = dra_inventory([node_object(MIG), node_object(CARDS)],
                              [node_slice(MIG), node_slice(CARDS)], [], [])
    nodes = {n.name: n for n in inventory.nodes}
    assert nodes["dra-mig"].allocatable == {"nvidia.com/mig-1g.18gb": 7,
                                            "nvidia.com/mig-3g.71gb": 2}
    assert nodes["dra-cards"].allocatable == {"nvidia.com/gpu": 4}
    assert {n.model for n in nodes.values()} == {"H200"}
    assert {n.mig_strategy for n in nodes.values()} == {DRA_NODE}
    assert nodes["dra-cards"].driver == "580.95.5"
    assert len(nodes["dra-mig"].devices) == 9
    # the decisions read it as they read a device plugin's node
    assert fit(DeviceRequest("H200", "1g.18gb"), inventory) == "dra-mig"
    assert fit(DeviceRequest("H200", count=4), inventory) == "dra-cards"
    with pytest.raises(NoFit) as never:
        fit(DeviceRequest("H200", count=5), inventory)
    assert never.value.status == 422 and "largest H200 node has 4" in never.value.message


def test_an_allocated_claim_holds_its_devices_named_by_the_server_it_is_reserved_for():
    cards = names(CARDS, "gpu")
    pods = [pod("jupyter-ada", "u-ada", "ada", "dra-cards", tier="spot"),
            pod("trainer", "u-other", node="dra-cards", namespace="lab")]
    claims = [claim("jupyter-ada-gpus-x", [("dra-cards", cards[0]), ("dra-cards", cards[1])],
                    "u-ada"),
              claim("trainer-gpu", [("dra-cards", cards[2])], "u-other", namespace="lab")]
    inventory = dra_inventory([node_object(CARDS)], [node_slice(CARDS)], claims, pods, NS)
    assert inventory.free() == {"dra-cards": {"nvidia.com/gpu": 1}}
    ada, other = sorted(inventory.holds, key=lambda h: h.pod)
    assert (ada.user, ada.tier, ada.spot, ada.node, ada.resources) == (
        "ada", "spot", True, "dra-cards", {"nvidia.com/gpu": 2})
    assert (other.pod, other.user) == ("lab/trainer", "")
    with pytest.raises(NoFit) as busy:
        fit(DeviceRequest("H200", count=2), inventory)
    assert busy.value.status == 503
    # a spot claim yields to an on-demand start where spot pods yield
    assert fit(DeviceRequest("H200", count=3), inventory.without_spot()) == "dra-cards"
    (row,) = inventory.rows()
    shown = {d["name"]: d["holder"] for d in row["devices"]}
    assert shown[cards[0]] == {"user": "ada", "server": "", "tier": "spot"}
    assert shown[cards[2]] == {"pod": "lab/trainer"} and shown[cards[3]] is None
    assert all(d["uuid"].startswith("GPU-") and d["profile"] is None for d in row["devices"])


def test_a_user_label_outside_the_servers_namespace_is_nobodys_and_a_claim_without_pod_holds():
    cards = names(CARDS, "gpu")
    forged = pod("fake", "u-f", "ada", "dra-cards", namespace="elsewhere")
    claims = [claim("c1", [("dra-cards", cards[0])], "u-f", namespace="elsewhere"),
              claim("loose", [("dra-cards", cards[1])])]  # allocated, no pod (yet, or any more)
    inventory = dra_inventory([node_object(CARDS)], [node_slice(CARDS)], claims, [forged], NS)
    assert sorted((h.pod, h.user) for h in inventory.holds) == [
        ("elsewhere/fake", ""), (f"{NS}/claim loose", "")]
    assert inventory.free()["dra-cards"]["nvidia.com/gpu"] == 2


def test_a_claim_owned_by_a_pod_not_yet_reserved_counts_for_its_owner():
    mig = names(MIG, "mig")
    c = claim("jupyter-bo-gpus-y", [("dra-mig", mig[0])], "u-bo", reserved=False)
    inventory = dra_inventory([node_object(MIG)], [node_slice(MIG)], [c],
                              [pod("jupyter-bo", "u-bo", "bo")], NS)
    (hold,) = inventory.holds
    assert (hold.user, hold.resources) == ("bo", {"nvidia.com/mig-1g.18gb": 1})
    assert hold.devices and hold.devices[0].startswith("MIG-")


def test_only_each_pools_newest_generation_and_only_nvidias_driver_count():
    old = node_slice(CARDS, generation=1)
    new = node_slice(GpuNode("dra-cards", gpus=2, dra=True), generation=2)
    other = copy.deepcopy(node_slice(CARDS))
    other["spec"]["driver"] = "other.example.com"
    other["spec"]["pool"]["name"] = "elsewhere"
    assert current_slices([old, new, other]) == [new]
    inventory = dra_inventory([node_object(CARDS)], [old, new, other], [], [])
    assert inventory.nodes[0].allocatable == {"nvidia.com/gpu": 2}
    # a claim of another driver's devices is not a GPU hold
    c = claim("x", [("dra-cards", "gpu-0")], driver="other.example.com")
    assert dra_inventory([node_object(CARDS)], [new], [c], []).holds == ()


def test_a_split_gpu_is_offered_as_its_slices_only_and_odd_devices_are_skipped():
    s = node_slice(GpuNode("n", mig={"1g.18gb": 1}, dra=True))
    parent = s["spec"]["devices"][0]["attributes"]["parentUUID"]["string"]
    s["spec"]["devices"] += [
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"},
                                         "uuid": {"string": parent},
                                         "productName": {"string": "NVIDIA H200"}}},
        {"name": "vfio-0", "attributes": {"type": {"string": "vfio"}}},
        {"name": "gpu-0-mig-x", "attributes": {"type": {"string": "mig"}}},  # no profile
    ]
    index = device_index([s])
    assert sorted(d.resource for _, d in index.values()) == ["nvidia.com/mig-1g.18gb"]
    unbound = copy.deepcopy(s)
    del unbound["spec"]["nodeName"]
    unbound["spec"]["allNodes"] = True
    assert device_index([unbound]) == {}


def test_a_node_without_devices_offers_none_and_a_cordoned_one_is_unschedulable():
    cpu = node_object(GpuNode("cpu-only", dra=True))
    cordoned = node_object(CARDS)
    cordoned["spec"] = {"unschedulable": True}
    inventory = dra_inventory([cpu, cordoned], [node_slice(CARDS)], [], [])
    nodes = {n.name: n for n in inventory.nodes}
    assert nodes["cpu-only"].allocatable == {} and nodes["cpu-only"].model is None
    assert not nodes["dra-cards"].schedulable
    with pytest.raises(NoFit) as none:
        fit(DeviceRequest("H200", count=1), inventory)
    assert none.value.status == 503


def test_dra_preemption_stops_the_fewest_spot_servers_on_one_node_and_never_twice():
    from gpulease.core.capacity.claim_preemption import claim_victims

    cards = names(CARDS, "gpu")
    pods = [pod("jupyter-s1", "u1", "s1", "dra-cards", tier="spot"),
            pod("jupyter-s2", "u2", "s2", "dra-cards", tier="spot"),
            pod("jupyter-od", "u3", "od", "dra-cards")]
    claims = [claim("c1", [("dra-cards", cards[0])], "u1"),
              claim("c2", [("dra-cards", cards[1]), ("dra-cards", cards[2])], "u2"),
              claim("c3", [("dra-cards", cards[3])], "u3")]
    inventory = dra_inventory([node_object(CARDS)], [node_slice(CARDS)], claims, pods, NS)
    two = DeviceRequest("H200", count=2)
    chosen = claim_victims(two, "on-demand", inventory)
    assert (chosen.node, chosen.victims) == ("dra-cards", (("s2", ""),))  # one server, not two
    assert claim_victims(DeviceRequest("H200", count=3), "on-demand", inventory).victims == (
        ("s2", ""), ("s1", ""))
    # on-demand servers are never victims: four cards cannot be had
    assert claim_victims(DeviceRequest("H200", count=4), "on-demand", inventory) is None
    # a spot start preempts no one; nor does a start that fits once those leaving are gone
    assert claim_victims(two, "spot", inventory) is None
    assert claim_victims(two, "on-demand", inventory, leaving={("s2", "")}) is None
    assert claim_victims(DeviceRequest("H200", count=9), "on-demand", inventory) is None  # 422


def test_of_spot_servers_holding_as_much_the_most_recently_started_goes():
    from gpulease.core.capacity.claim_preemption import claim_victims

    cards = names(CARDS, "gpu")
    pods = [pod("jupyter-old", "u1", "zed", "dra-cards", tier="spot"),
            pod("jupyter-new", "u2", "amy", "dra-cards", tier="spot")]
    pods[0]["status"]["startTime"] = "2026-12-07T10:00:00Z"
    pods[1]["status"]["startTime"] = "2026-12-07T11:00:00Z"
    claims = [claim(f"c{i}", [("dra-cards", cards[i])], p["metadata"]["uid"])
              for i, p in enumerate(pods)] + [
        claim("c9", [("dra-cards", cards[2]), ("dra-cards", cards[3])], "u9")]
    inventory = dra_inventory([node_object(CARDS)], [node_slice(CARDS)], claims,
                              pods + [pod("jupyter-od", "u9", "od", "dra-cards")], NS)
    chosen = claim_victims(DeviceRequest("H200", count=1), "on-demand", inventory)
    assert chosen.victims == (("amy", ""),)  # started an hour after zed's


def test_what_the_scheduler_would_not_allocate_is_not_offered():
    s = node_slice(CARDS)
    devices = s["spec"]["devices"]
    devices[0]["taints"] = [{"key": "gpu.nvidia.com/unhealthy", "effect": "NoExecute"}]
    devices[1]["consumesCounters"] = [{"counterSet": "gpu-1", "counters": {}}]
    devices[2]["attributes"]["productName"] = {"string": "NVIDIA H100 SXM5 80GB"}  # unlisted
    inventory = dra_inventory([node_object(CARDS)], [s], [], [])
    # one H200 card left as H200; the unlisted board under its own name, which no profile
    # asks for (a claim's selector could never get it)
    (node,) = inventory.nodes
    assert sorted((d.model, d.resource) for d in node.devices) == [
        ("H200", "nvidia.com/gpu"), ("NVIDIA H100 SXM5 80GB", "nvidia.com/gpu")]
    with pytest.raises(NoFit):
        fit(DeviceRequest("H100-80GB", count=1), inventory)
    # a pool whose newest generation is not all there yet is skipped
    half = copy.deepcopy(node_slice(CARDS))
    half["spec"]["pool"]["resourceSliceCount"] = 2
    assert current_slices([half]) == []


def test_monitoring_claims_hold_nothing_and_a_claim_is_booked_on_each_node_it_uses():
    other = GpuNode("dra-b", gpus=2, dra=True)
    cards, bs = names(CARDS, "gpu"), names(other, "gpu")
    admin = claim("mon", [("dra-cards", c) for c in cards], namespace="monitoring")
    for result in admin["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    spread = claim("spread", [("dra-cards", cards[0]), ("dra-b", bs[0])], "u1")
    inventory = dra_inventory([node_object(CARDS), node_object(other)],
                              [node_slice(CARDS), node_slice(other)], [admin, spread],
                              [pod("jupyter-ada", "u1", "ada")], NS)
    assert inventory.free() == {"dra-cards": {"nvidia.com/gpu": 3},
                                "dra-b": {"nvidia.com/gpu": 1}}
    assert sorted((h.node, h.user) for h in inventory.holds) == [
        ("dra-b", "ada"), ("dra-cards", "ada")]


def test_a_pod_being_deleted_or_ended_leaves_and_is_never_a_victim_twice():
    from gpulease.core.capacity.claim_preemption import claim_victims

    cards = names(CARDS, "gpu")
    going = pod("jupyter-s1", "u1", "s1", "dra-cards", tier="spot")
    going["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    ended = pod("jupyter-s2", "u2", "s2", "dra-cards", tier="spot")
    ended["status"]["phase"] = "Failed"
    running = pod("jupyter-s3", "u3", "s3", "dra-cards", tier="spot")
    claims = [claim(f"c{i}", [("dra-cards", cards[i])], f"u{i + 1}") for i in range(3)] + [
        claim("c9", [("dra-cards", cards[3])], "u9")]
    inventory = dra_inventory([node_object(CARDS)], [node_slice(CARDS)], claims,
                              [going, ended, running, pod("jupyter-od", "u9", "od")], NS)
    assert sorted(h.user for h in inventory.holds if h.leaving) == ["s1", "s2"]
    # two cards are coming free already: a 2-card start waits for them, preempting no one
    assert claim_victims(DeviceRequest("H200", count=2), "on-demand", inventory) is None
    assert claim_victims(DeviceRequest("H200", count=3), "on-demand", inventory).victims == (
        ("s3", ""),)
    # a server that cannot be stopped now (no running session) is never chosen
    assert claim_victims(DeviceRequest("H200", count=3), "on-demand", inventory,
                         may_stop=set()) is None


def test_no_server_is_preempted_on_a_node_whose_driver_is_too_old_for_the_image():
    from gpulease.core.capacity.claim_preemption import claim_victims

    new = GpuNode("dra-new", gpus=1, dra=True, driver="595.10.1")  # on demand holds its card
    cards, newer_card = names(CARDS, "gpu"), names(new, "gpu")[0]
    pods = [pod(f"jupyter-s{i}", f"u{i}", f"s{i}", "dra-cards", tier="spot") for i in range(4)]
    pods.append(pod("jupyter-od", "u9", "od", "dra-new"))
    claims = [claim(f"c{i}", [("dra-cards", cards[i])], f"u{i}") for i in range(4)] + [
        claim("c9", [("dra-new", newer_card)], "u9")]
    inventory = dra_inventory([node_object(CARDS), node_object(new)],
                              [node_slice(CARDS), node_slice(new)], claims, pods, NS)
    assert claim_victims(DeviceRequest("H200", count=1), "on-demand", inventory).node == (
        "dra-cards")
    # an image needing 590 runs only on dra-new (580.95.5 on dra-cards): no spot server
    # there to stop, and stopping one on dra-cards would make room it cannot use
    newer = DeviceRequest("H200", count=1, min_driver="590.1", image="cuda13")
    assert claim_victims(newer, "on-demand", inventory) is None

