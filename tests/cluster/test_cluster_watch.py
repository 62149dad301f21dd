"""ClusterWatch (spawners/kube/cluster_watch.py) on the real API server, through the fault proxy
with a ServiceAccount holding only CLUSTER_RULES: the inventory follows nodes appearing,
cordoned, losing a GPU and going away, counts every pod's GPUs, and a watch that is dropped,
expired (410) or refused is listed again and misses nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpulease.spawners.kube.cluster_watch import CLUSTER_RULES, ClusterWatch
from gpulease.spawners.kube.rbac import grants as grants_of
from gpulease.spawners.kube.rbac import rules_of
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.faults import Fault, FaultProxy
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.rbac import grant_cluster, service_account_token


async def eventually(what: str, check: Callable[[], Any], timeout: float = 20) -> Any:
    """Await until `check()` is truthy (the event loop runs the watches meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = None
    while loop.time() < deadline:
        last = check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what} (last: {last!r})")


async def api_as(control_plane: ControlPlane, kube: Kube, namespace: str, url: str,
                 grants: list[tuple[str, str]]) -> client.CoreV1Api:
    """The API at `url` as a ServiceAccount holding exactly `grants`, once they apply."""
    token = service_account_token(kube, namespace, "inventory", seconds=600)
    grant_cluster(kube, namespace, "inventory", rules_of(grants))
    config = client.Configuration(host=url)
    config.api_key = {"BearerToken": token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    config.ssl_ca_cert = str(control_plane.root / "pki" / "ca.crt")
    core = client.CoreV1Api(client.ApiClient(config))
    listed = next(r for r, v in grants if v == "list")
    probe = core.list_node if listed == "nodes" else core.list_pod_for_all_namespaces
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:  # until the binding applies (the authorizer's cache)
        try:
            await probe(limit=1)
            return core
        except client.ApiException:
            assert loop.time() < deadline, "the ClusterRole never applied"
            await asyncio.sleep(0.2)


@pytest.fixture
async def api(control_plane: ControlPlane, kube: Kube, namespace: str, proxy: FaultProxy):
    """The API through the fault proxy, as a ServiceAccount holding only CLUSTER_RULES."""
    core = await api_as(control_plane, kube, namespace, proxy.url, grants_of(CLUSTER_RULES))
    yield core
    await core.api_client.close()


@pytest.fixture
async def watch(api: client.CoreV1Api):
    w = ClusterWatch(api)
    await w.start()
    yield w
    await w.stop()


def node(w: ClusterWatch, name: str):
    return next((n for n in w.inventory().nodes if n.name == name), None)


async def test_nodes_appear_cordon_lose_a_gpu_and_go(kube: Kube, gpu_nodes, watch: ClusterWatch):
    (made,) = gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    name = made["metadata"]["name"]
    seen = await eventually(f"{name} in the inventory", lambda: node(watch, name))
    assert (seen.model, seen.allocatable, seen.schedulable) == (
        "H200", {"nvidia.com/mig-1g.18gb": 7}, True)

    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}})
    await eventually("cordoned", lambda: not node(watch, name).schedulable)

    kube.patch(f"/api/v1/nodes/{name}/status", {"status": {  # one slice turned unhealthy
        "allocatable": {"nvidia.com/mig-1g.18gb": "6"}}}, kind="strategic")
    await eventually("6 slices left", lambda: node(watch, name).allocatable.get(
        "nvidia.com/mig-1g.18gb") == 6)

    kube.delete(f"/api/v1/nodes/{name}")
    await eventually(f"{name} gone", lambda: node(watch, name) is None)


async def test_every_pods_gpus_are_held_and_gpulease_pods_name_their_server(
        kube: Kube, namespace: str, gpu_nodes, watch: ClusterWatch):
    (made,) = gpu_nodes(GpuNode("a100", model="A100-80GB", gpus=4))
    name = made["metadata"]["name"]

    def pod(pod_name: str, count: int, labels: dict, annotations: dict) -> dict:
        return {"metadata": {"name": pod_name, "labels": labels, "annotations": annotations},
                "spec": {"nodeSelector": {POOL_LABEL: namespace},
                         "containers": [{"name": "c", "image": "none", "resources": {
                             "limits": {"nvidia.com/gpu": str(count)}}}]}}
    kube.create(pods_path(namespace), pod("theirs", 1, {}, {}))  # not gpulease's: still taken
    kube.create(pods_path(namespace), pod("jupyter-ada--train", 2,
                                          {"hub.jupyter.org/username": "ada"},
                                          {"hub.jupyter.org/servername": "train"}))

    def holds():
        return {h.pod: h for h in watch.inventory().holds if h.node == name}
    held = await eventually("both pods bound and held", lambda: len(holds()) == 2 and holds())
    ours = held[f"{namespace}/jupyter-ada--train"]
    assert (ours.user, ours.server, ours.resources) == ("ada", "train", {"nvidia.com/gpu": 2})
    assert held[f"{namespace}/theirs"].user == ""
    assert watch.inventory().free()[name]["nvidia.com/gpu"] == 1


WATCH = r"/api/v1/nodes\?.*watch="


@pytest.mark.parametrize("faults", [
    [Fault("GET", WATCH, drop_after=0.5, times=2)],
    [Fault("GET", WATCH, expire_watch=True, times=2)],
    [Fault("GET", r"/api/v1/nodes$", status=500, times=3)],
], ids=["dropped", "expired-410", "refused-500"])
async def test_a_failing_watch_is_listed_again_and_misses_nothing(
        gpu_nodes, api: client.CoreV1Api, proxy: FaultProxy, faults: list[Fault]):
    for fault in faults:  # met by the watch's first requests
        proxy.add(fault)
    watch = ClusterWatch(api)
    await watch.start()  # the 500s: listed once they stop
    try:
        await _misses_nothing(gpu_nodes, watch, faults)
    finally:
        await watch.stop()


async def _misses_nothing(gpu_nodes, watch: ClusterWatch, faults: list[Fault]) -> None:
    (first,) = gpu_nodes(GpuNode("during", gpus=8))  # while the watch is being cut
    await eventually("the faults met", lambda: all(f.fired == f.times for f in faults)
                     and watch.nodes.failures >= 1, timeout=30)
    (second,) = gpu_nodes(GpuNode("after", gpus=2))
    for made, count in ((first, 8), (second, 2)):
        name = made["metadata"]["name"]
        seen = await eventually(f"{name} seen", lambda n=name: node(watch, n), timeout=60)
        assert seen.allocatable == {"nvidia.com/gpu": count}
    await eventually("watching again", lambda: not watch.stale)


@pytest.mark.parametrize("missing", grants_of(CLUSTER_RULES), ids="-".join)
async def test_each_grant_of_the_cluster_role_is_needed(
        control_plane: ControlPlane, kube: Kube, namespace: str, missing: tuple[str, str]):
    grants = [g for g in grants_of(CLUSTER_RULES) if g != missing]
    core = await api_as(control_plane, kube, namespace, control_plane.state["server"], grants)
    watch = ClusterWatch(core)
    try:
        if missing[1] == "list":
            with pytest.raises(TimeoutError):  # the inventory never loads
                await watch.start(timeout=3)
        else:
            await watch.start(timeout=10)  # listed, but its watch is refused: stale
            await eventually("the watch refused", lambda: watch.stale and (
                watch.nodes if missing[0] == "nodes" else watch.pods).failures >= 1)
    finally:
        await watch.stop()
        await core.api_client.close()


async def test_a_pod_asking_gpus_in_any_quantity_form_is_counted_not_fatal(
        kube: Kube, namespace: str, gpu_nodes, watch: ClusterWatch):
    """Attack: anyone who may make a pod anywhere in the cluster asks `nvidia.com/gpu: 1k`
    (a whole number, so the API server takes it; it stays Pending). int('1k') raised in
    hold_from_pod, so every inventory() raised: no GPU start could be admitted, and the
    form and api/inventory failed, until that pod was deleted."""
    (made,) = gpu_nodes(GpuNode("a100", model="A100-80GB", gpus=4))
    name = made["metadata"]["name"]
    kube.create(pods_path(namespace), {
        "metadata": {"name": "thousand"},
        "spec": {"nodeSelector": {POOL_LABEL: namespace}, "containers": [{
            "name": "c", "image": "none",
            "resources": {"limits": {"nvidia.com/gpu": "1k"}}}]}})
    got = kube.get(pods_path(namespace, "thousand"))["spec"]["containers"][0]
    assert got["resources"]["limits"]["nvidia.com/gpu"] == "1k"  # as the API server keeps it
    await eventually(f"{name} seen", lambda: node(watch, name))
    await eventually("the pod seen", lambda: f"{namespace}/thousand" in watch.pods.objects)
    (held,) = [h for h in watch.inventory().holds if h.pod == f"{namespace}/thousand"]
    assert held.resources == {"nvidia.com/gpu": 1000}
    assert watch.inventory().free()[name]["nvidia.com/gpu"] == 4  # never bound
