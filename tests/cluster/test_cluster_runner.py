"""The cluster shape's admission (spawners/kube/cluster_runner.py) on the real control plane.

What GPUKubeSpawner.start awaits before it makes a pod, driven as the spawner
drives it: admit, make the pod (here by the test, with the spawner's labels),
`done` once it is bound. Nodes of mixed MIG layouts fill up; starts queue with
their positions and are admitted in order as pods are deleted (the watch wakes
the queue); an 8-GPU start at the head keeps its node while 1-GPU starts wait,
and a slice still passes. The runner reads the API server as a ServiceAccount
holding only CLUSTER_RULES.
"""

from __future__ import annotations

import asyncio

import pytest

from gpulease.core.model.device_request import DeviceRequest
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.kube.cluster_runner import WATCH_READY_S, ClusterQueueRunner
from gpulease.spawners.kube.cluster_watch import CLUSTER_RULES
from gpulease.spawners.kube.pod_spec import DEFAULT_GPU_TOLERATIONS
from gpulease.spawners.kube.rbac import grants as grants_of
from gpulease.spawners.queueing.base import Refused
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.faults import Fault, FaultProxy
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_cluster_watch import api_as, eventually

SLICE = DeviceRequest("H200", "1g.18gb")
CARD = DeviceRequest("H200")
EIGHT = DeviceRequest("H200", count=8)
RESOURCE = {SLICE: "nvidia.com/mig-1g.18gb", CARD: "nvidia.com/gpu", EIGHT: "nvidia.com/gpu"}


@pytest.fixture
async def runner(control_plane: ControlPlane, kube: Kube, namespace: str, _sqlite_template,
                 tmp_path):
    api = await api_as(control_plane, kube, namespace, control_plane.state["server"],
                       grants_of(CLUSTER_RULES))
    ctx = GPULeaseContext(_sqlite_template.copy_to(tmp_path / "gpulease.sqlite"))
    # A slow poll: only the watch's events can wake the queue in time.
    r = ClusterQueueRunner(ctx, api, {POOL_LABEL: namespace}, DEFAULT_GPU_TOLERATIONS,
                           poll_s=60)
    yield r
    if r.watch is not None:
        await r.watch.stop()
    await api.api_client.close()
    ctx.engine.dispose()


class Spawns:
    """Starts as GPUKubeSpawner makes them: admit, then the pod, then `done` once bound."""

    def __init__(self, runner: ClusterQueueRunner, kube: Kube, namespace: str):
        self.runner, self.kube, self.namespace = runner, kube, namespace
        self.tasks: dict[str, asyncio.Task] = {}

    def admit(self, user: str, request: DeviceRequest, max_wait: float = 60) -> asyncio.Task:
        task = asyncio.ensure_future(self.runner.admit(user, "", "p", request,
                                                       max_wait=max_wait))
        self.tasks[user] = task
        return task

    async def run(self, user: str, request: DeviceRequest) -> str:
        """Admitted: make its pod where it fits, wait until it is bound, end the start."""
        admitted = await self.tasks[user]
        name = f"jupyter-{user}"
        self.kube.create(pods_path(self.namespace), gpu_pod(
            self.namespace, name, admitted.node, RESOURCE[request], request.count, user=user))
        await eventually(f"{name} bound", lambda: any(
            h.user == user and h.node for h in self.runner.watch.inventory().holds))
        self.runner.done(user, "")
        return admitted.node

    def stop(self, user: str) -> None:
        self.kube.delete(f"{pods_path(self.namespace)}/jupyter-{user}",
                         {"gracePeriodSeconds": 0})

    def waiting(self) -> list[str]:
        return [t.user for t in self.runner.waiting]


@pytest.fixture
def spawns(runner, kube: Kube, namespace: str) -> Spawns:
    return Spawns(runner, kube, namespace)


async def test_starts_queue_with_their_positions_and_start_in_order_as_others_stop(
        spawns: Spawns, gpu_nodes):
    gpu_nodes(GpuNode("mig", mig={"1g.18gb": 2, "3g.71gb": 1}), GpuNode("cards", gpus=1))
    for user in ("u1", "u2"):
        spawns.admit(user, SLICE)
        await spawns.run(user, SLICE)
    for user in ("u3", "u4", "u5"):  # no slice is free: they wait, in arrival order
        spawns.admit(user, SLICE)
        await eventually(f"{user} waiting", lambda u=user: u in spawns.waiting())
    assert [spawns.runner.position(u, "") for u in ("u3", "u4", "u5")] == [1, 2, 3]

    spawns.admit("card", CARD)  # another kind passes the slices' queue at once
    await spawns.run("card", CARD)

    spawns.stop("u1")  # its slice goes to the head of the queue, within seconds
    await eventually("u3 admitted", lambda: spawns.tasks["u3"].done(), timeout=10)
    assert spawns.waiting() == ["u4", "u5"]
    assert spawns.runner.position("u5", "") == 2
    await spawns.run("u3", SLICE)
    spawns.stop("u2")
    await eventually("u4 admitted", lambda: spawns.tasks["u4"].done(), timeout=10)
    assert spawns.waiting() == ["u5"] and not spawns.tasks["u5"].done()


async def test_an_8_gpu_start_at_the_head_is_not_overtaken_by_1_gpu_starts(
        spawns: Spawns, gpu_nodes):
    gpu_nodes(GpuNode("eight", gpus=8), GpuNode("mig", mig={"1g.18gb": 1}))
    ones = [f"one{i}" for i in range(8)]
    for user in ones:
        spawns.admit(user, CARD)
        await spawns.run(user, CARD)
    spawns.admit("big", EIGHT)
    await eventually("big waiting", lambda: "big" in spawns.waiting())
    for user in ("late1", "late2"):  # 1-GPU starts behind it
        spawns.admit(user, CARD)
        await eventually(f"{user} waiting", lambda u=user: u in spawns.waiting())
    spawns.admit("slice", SLICE)  # a slice is another kind: it does not wait for the big one
    await spawns.run("slice", SLICE)

    for user in ones[:-1]:  # each GPU freed stays free for the head of the queue
        spawns.stop(user)
    await eventually("seven GPUs free", lambda: spawns.runner.watch.inventory().free()[
        f"{spawns.namespace}-eight"]["nvidia.com/gpu"] == 7)
    await spawns.runner.serve()
    assert spawns.waiting() == ["big", "late1", "late2"]
    spawns.stop(ones[-1])
    await eventually("big admitted", lambda: spawns.tasks["big"].done(), timeout=10)
    assert await spawns.run("big", EIGHT) == f"{spawns.namespace}-eight"
    assert spawns.waiting() == ["late1", "late2"]


async def test_what_no_node_can_run_is_refused_naming_what_exists_and_a_wait_ends(
        spawns: Spawns, gpu_nodes):
    gpu_nodes(GpuNode("mig", mig={"1g.18gb": 1}))
    with pytest.raises(Refused) as never:
        await spawns.admit("u", DeviceRequest("A100-80GB"))
    assert never.value.status == 422
    assert "offered: H200 slice 1g.18gb" in never.value.message
    with pytest.raises(Refused) as too_big:
        await spawns.admit("u", DeviceRequest("H200", "2g.35gb"))
    assert too_big.value.status == 422

    spawns.admit("first", SLICE)
    await spawns.run("first", SLICE)
    with pytest.raises(Refused) as at_once:  # no queueing: refused naming what is free
        await spawns.admit("now", SLICE, max_wait=0)
    assert at_once.value.status == 503 and "0 free across 1 node(s)" in at_once.value.message
    with pytest.raises(Refused) as waited:
        await spawns.admit("patient", SLICE, max_wait=1)
    assert waited.value.status == 503 and "Waited 1s in the queue" in waited.value.message
    assert spawns.waiting() == []


async def test_an_admitted_start_without_a_pod_holds_nothing_once_it_ends(
        spawns: Spawns, gpu_nodes):
    gpu_nodes(GpuNode("mig", mig={"1g.18gb": 1}))
    await spawns.admit("made-no-pod", SLICE)  # admitted: the only slice is given room
    spawns.admit("next", SLICE)
    await eventually("next waiting", lambda: "next" in spawns.waiting())
    spawns.runner.done("made-no-pod", "")  # its pod was never made (the create failed)
    await eventually("next admitted", lambda: spawns.tasks["next"].done(), timeout=10)
    assert spawns.runner.admitted.keys() == {("next", "")}


async def test_a_node_tainted_for_maintenance_takes_no_start_until_the_taint_goes(
        spawns: Spawns, gpu_nodes, kube: Kube):
    (made,) = gpu_nodes(GpuNode("mig", mig={"1g.18gb": 2}))
    name = made["metadata"]["name"]
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": [gpu_taint]}})  # tolerated
    spawns.admit("first", SLICE)
    await spawns.run("first", SLICE)
    drained = {"key": "maintenance", "value": "true", "effect": "NoSchedule"}
    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": [gpu_taint, drained]}})
    await eventually("the taint seen", lambda: any(
        n.name == name and len(n.taints) == 2 for n in spawns.runner.watch.inventory().nodes))
    spawns.admit("second", SLICE)  # a slice is free, on a node its pod could not go to
    await eventually("second waiting", lambda: "second" in spawns.waiting())
    kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": [gpu_taint]}})
    await eventually("second admitted", lambda: spawns.tasks["second"].done(), timeout=10)
    assert (await spawns.tasks["second"]).node == name


async def test_starts_during_an_outage_are_refused_together_not_one_after_another(
        control_plane: ControlPlane, kube: Kube, namespace: str, _sqlite_template, tmp_path,
        proxy: FaultProxy):
    proxy.add(Fault("GET", r"^/api/v1/nodes$", status=500, times=0))
    api = await api_as(control_plane, kube, namespace, proxy.url, grants_of(CLUSTER_RULES))
    ctx = GPULeaseContext(_sqlite_template.copy_to(tmp_path / "gpulease.sqlite"))
    r = ClusterQueueRunner(ctx, api, {POOL_LABEL: namespace}, DEFAULT_GPU_TOLERATIONS)
    loop = asyncio.get_running_loop()
    began = loop.time()
    outcomes = await asyncio.gather(*(r.admit(u, "", "p", SLICE, max_wait=60)
                                      for u in ("a", "b", "c")), return_exceptions=True)
    took = loop.time() - began
    assert all(isinstance(o, Refused) and o.status == 503 and "nodes: HTTP 500" in o.message
               for o in outcomes), outcomes
    assert took < WATCH_READY_S * 1.5, f"{took:.1f} s: the starts waited one after another"
    await r.watch.stop()
    await api.api_client.close()
    ctx.engine.dispose()


async def test_a_running_start_stays_counted_until_the_watch_sees_its_pod(
        spawns: Spawns, gpu_nodes, kube: Kube, namespace: str):
    gpu_nodes(GpuNode("mig", mig={"1g.18gb": 1}))
    admitted = await spawns.admit("alice", SLICE)
    spawns.runner.done("alice", "", running=True)  # kubespawner saw it run; this watch not yet
    with pytest.raises(Refused) as refused:
        await spawns.admit("bob", SLICE, max_wait=0)
    assert refused.value.status == 503  # the slice is alice's, though no pod is seen
    kube.create(pods_path(namespace), gpu_pod(namespace, "jupyter-alice", admitted.node,
                                              RESOURCE[SLICE], 1, user="alice"))
    await eventually("alice's pod seen bound, her admission forgotten", lambda: (
        spawns.runner.unbound(spawns.runner.watch.inventory()) == {}
        and not spawns.runner.admitted))
    with pytest.raises(Refused):  # now her pod counts
        await spawns.admit("bob", SLICE, max_wait=0)
    spawns.stop("alice")
    spawns.admit("bob", SLICE)
    await eventually("bob admitted", lambda: spawns.tasks["bob"].done(), timeout=10)
