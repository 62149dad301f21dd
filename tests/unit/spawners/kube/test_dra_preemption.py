"""DRA mode's spot preemption bookkeeping (spawners/kube/dra_preemption.py): one
preemption per waiting start, none for servers that cannot be stopped, and each taken
back when its start leaves the queue. The meter is a recorder of the calls the real one
(hub/billing/metering.py Meter) takes; the inventory is the DRA one of the driver's
test double."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

from gpulease.core.capacity.dra_inventory import dra_inventory
from gpulease.core.model.device_request import DeviceRequest
from gpulease.spawners.kube.dra_preemption import ClaimPreemptions
from gpulease.spawners.queueing.base import Ticket
from tests.cluster.dra_driver import node_slice
from tests.cluster.nodes import GpuNode, node_object

NS = "users"
CARDS = GpuNode("cards", gpus=2, dra=True)


@dataclass
class Live:
    tier: str
    profile: str = "one"
    rate_per_hour_ucr: int = 1_000_000
    session_id: int = 1


@dataclass
class RecordingMeter:
    live: dict = field(default_factory=dict)
    preempting: dict = field(default_factory=dict)
    stopping: dict = field(default_factory=dict)
    queue_resuming: bool = False
    told: list = field(default_factory=list)
    sessions: object = field(default_factory=lambda: SimpleNamespace(
        set_preemption=lambda *a: None))

    def preempt(self, key, deadline, why, on_demand=False) -> bool:
        if key not in self.live or key in self.preempting:
            return False
        self.preempting[key] = why
        return True

    def withdraw_preemption(self, key) -> bool:
        return self.preempting.pop(key, None) is not None

    async def announce(self, kind, user, server, *rest) -> None:
        self.told.append((kind, user))


def inventory(spot_users: list[str]):
    node = node_object(CARDS)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    devices = [d["name"] for d in node_slice(CARDS)["spec"]["devices"]]
    pods, claims = [], []
    for i, user in enumerate(spot_users):
        pods.append({"metadata": {"name": f"jupyter-{user}", "namespace": NS, "uid": user,
                                  "annotations": {"hub.jupyter.org/username": user},
                                  "labels": {"gpulease.io/tier": "spot"}},
                     "spec": {"nodeName": "cards"}, "status": {"phase": "Running"}})
        claims.append({"metadata": {"name": f"c-{user}", "namespace": NS}, "status": {
            "reservedFor": [{"resource": "pods", "uid": user}],
            "allocation": {"devices": {"results": [
                {"driver": "gpu.nvidia.com", "pool": "cards", "device": devices[i]}]}}}})
    return dra_inventory([node], [node_slice(CARDS)], claims, pods, NS)


def ticket(user: str) -> Ticket:
    return Ticket(user, "", "one", DeviceRequest("H200", count=1),
                  asyncio.get_running_loop().create_future())


def preemptions(meter: RecordingMeter) -> ClaimPreemptions:
    notices = SimpleNamespace(clear=lambda *a: None, post=lambda *a: None)
    return ClaimPreemptions(SimpleNamespace(meter=meter, notices=notices), grace_s=30)


async def test_a_waiting_on_demand_start_preempts_one_spot_server_once():
    meter = RecordingMeter(live={("sam", ""): Live("spot"), ("sue", ""): Live("spot")})
    claims = preemptions(meter)
    odin = ticket("odin")
    assert await claims.serve([odin], inventory(["sam", "sue"]), ())
    (victim,) = meter.preempting  # one of two, though both hold a card

    assert meter.told == [("preemption_warning", victim[0])]
    # the victim stopped (its session closed) while its claim still clears: no second one
    del meter.live[victim], meter.preempting[victim]
    await claims.serve([odin], inventory(["sam", "sue"]), ())
    assert meter.preempting == {}


async def test_a_start_that_leaves_the_queue_takes_its_preemption_back():
    meter = RecordingMeter(live={("sam", ""): Live("spot"), ("sue", ""): Live("spot")})
    claims = preemptions(meter)
    odin, bo = ticket("odin"), ticket("bo")
    bo.request = DeviceRequest("A100-80GB", count=1)  # waits for something no spot holds
    await claims.serve([odin, bo], inventory(["sam", "sue"]), ())
    assert len(meter.preempting) == 1
    await claims.withdraw_unneeded([bo])  # odin cancelled; bo still waits, on demand
    assert meter.preempting == {} and claims.chosen == {}


async def test_only_running_spot_servers_are_chosen_and_restored_ones_go_back():
    # sue's session is closed (a pod left over): she is never chosen; sam is
    meter = RecordingMeter(live={("sam", ""): Live("spot")})
    claims = preemptions(meter)
    await claims.serve([ticket("odin")], inventory(["sam", "sue"]), ())
    assert list(meter.preempting) == [("sam", "")]
    # after a restart: a preemption restored from the sessions that no start needs
    meter = RecordingMeter(live={("sam", ""): Live("spot")}, preempting={("sam", ""): "x"})
    await preemptions(meter).withdraw_unneeded([])
    assert meter.preempting == {}
    # an on-demand server is never a victim
    meter = RecordingMeter(live={("sam", ""): Live("on-demand"), ("sue", ""): Live("spot")})
    inv = inventory(["sam", "sue"])
    assert await preemptions(meter).serve([ticket("odin")], inv, ())
    assert list(meter.preempting) == [("sue", "")]


def test_a_refusal_on_a_cluster_where_the_driver_publishes_nothing_says_so():
    from gpulease.spawners.kube.cluster_runner import ClusterQueueRunner

    bare = dra_inventory([node_object(GpuNode("cpu", dra=True))], [], [], [], NS)
    runner = ClusterQueueRunner(SimpleNamespace(), None, dra=object())
    assert "NVIDIA's DRA driver publishes no GPU" in runner._no_driver(bare)
    assert runner._no_driver(inventory([])) == ""  # the driver publishes the cards node
    assert ClusterQueueRunner(SimpleNamespace(), None)._no_driver(bare) == ""  # device plugin
