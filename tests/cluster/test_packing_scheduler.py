"""gpulease's packing kube-scheduler, a real process on the real control plane, against the
control plane's default scheduler.

The scheduler (tests/cluster/packing_scheduler.py) runs the configuration
spawners/kube/scheduler_config.py generates for the sample profiles, with leader
election, as a ServiceAccount holding exactly spawners/kube/rbac.py
`scheduler_rbac_objects`. Pods here need only be bound: their nodes are
`bind_only` (kwok keeps them Ready, nothing runs their pods), so each pod is
deleted with grace 0 after its test.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config

from gpulease.core.model.profiles import SAMPLE_PROFILES
from gpulease.spawners.kube.scheduler_config import GPU_WEIGHT, gpu_resources, profiles_mig
from gpulease.spawners.kube.spawner import GPUKubeSpawner, pod_options
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.packing_scheduler import PackingScheduler, running_packing_scheduler
from tests.cluster.test_gpu_kube_spawner import slice_choice

SAMPLES = SAMPLE_PROFILES
SLICE = "nvidia.com/mig-1g.18gb"
DEFAULT = "default-scheduler"


@pytest.fixture(autouse=True)
def _pods_removed(kube: Kube, namespace: str) -> Iterator[None]:
    yield
    # No kubelet finishes a graceful delete of a bind-only node's pod.
    kube.request("DELETE", pods_path(namespace), {"gracePeriodSeconds": 0})


def pod(name: str, nodes: list[str], gpus: dict[str, int], *, scheduler: str = "",
        cpu: str = "1", memory: str = "4Gi", node: str = "") -> dict:
    """A pod asking for `gpus` on one of `nodes` (its scheduler's choice, or `node` itself)."""
    extended = {k: str(v) for k, v in gpus.items()}
    spec: dict = {
        "containers": [{"name": "c", "image": "never-run", "resources": {
            "requests": {"cpu": cpu, "memory": memory, **extended}, "limits": extended}}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}},
        "terminationGracePeriodSeconds": 0}
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def bound(kube: Kube, namespace: str, name: str, timeout: float = 20) -> str:
    """The node the pod was bound to."""
    return kube.wait_for(f"pod {name} bound", lambda: kube.get(
        pods_path(namespace, name))["spec"].get("nodeName"), timeout=timeout, every=0.05)


def place(kube: Kube, namespace: str, body: dict) -> str:
    kube.create(pods_path(namespace), body)
    return bound(kube, namespace, body["metadata"]["name"])


def pool(kube: Kube, gpu_nodes: Callable, prefix: str, count: int, **shape) -> list[str]:
    """Bind-only nodes of one shape, each Ready and untainted: the node controller removes the
    not-ready taint a moment after kwok made it Ready, and until then no pod goes there."""
    nodes = gpu_nodes(*(GpuNode(f"{prefix}{n}", bind_only=True, **shape) for n in range(count)))
    names = [n["metadata"]["name"] for n in nodes]
    for name in names:
        kube.wait_for(f"node {name} untainted", lambda n=name: not kube.get(
            f"/api/v1/nodes/{n}")["spec"].get("taints"))
    return names


def configz(plane: ControlPlane, scheduler: PackingScheduler) -> dict:
    """The configuration the running scheduler loaded, from its own /configz (as admin: the
    scheduler authenticates the client certificate by the cluster's client CA)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate
    context.load_cert_chain(str(plane.root / "pki" / "admin.crt"),
                            str(plane.root / "pki" / "admin.key"))

    def read() -> dict | None:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{scheduler.port}/configz",
                                        context=context, timeout=5) as answer:
                return json.loads(answer.read())["componentconfig"]
        except urllib.error.HTTPError:  # 403, as anonymous, until it read the client CA
            return None
    return plane.admin().wait_for("the packing scheduler's /configz", read, timeout=10)


def strategy(config: dict) -> dict:
    """NodeResourcesFit's scoringStrategy: {type, resources}."""
    (fit,) = [p for p in config["profiles"][0]["pluginConfig"] if p["name"] == "NodeResourcesFit"]
    return fit["args"]["scoringStrategy"]


def scoring(config: dict) -> list[dict]:
    return strategy(config)["resources"]


def test_it_runs_the_generated_configuration_and_holds_its_lease(
        control_plane: ControlPlane, kube: Kube, packing_scheduler: PackingScheduler):
    lease = packing_scheduler.lease(kube)
    assert lease["spec"]["holderIdentity"]  # the leader: it binds (test below)
    assert lease["metadata"]["name"] == packing_scheduler.name
    config = configz(control_plane, packing_scheduler)
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == packing_scheduler.name
    samples = profiles_mig(yaml.safe_load(SAMPLES.read_text())["profiles"])
    wanted = gpu_resources(samples)
    assert SLICE in wanted  # every MIG profile of the sample profiles, by its exact name
    assert scoring(config) == [{"name": r, "weight": GPU_WEIGHT} for r in wanted] + [
        {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]
    assert strategy(config)["type"] == "MostAllocated"
    disabled = {p["name"] for p in profile["plugins"]["score"]["disabled"]}
    assert {"NodeResourcesBalancedAllocation", "ImageLocality"} <= disabled
    assert config["percentageOfNodesToScore"] == 100
    election = config["leaderElection"]
    assert (election["leaderElect"], election["resourceName"], election["resourceNamespace"]) == (
        True, packing_scheduler.name, packing_scheduler.namespace)


def test_whole_nodes_stay_free_and_an_8_gpu_pod_runs_only_under_packing(
        kube: Kube, namespace: str, gpu_nodes, packing_scheduler: PackingScheduler):
    packed = pool(kube, gpu_nodes, "packed-", 4, gpus=8)
    spread = pool(kube, gpu_nodes, "default-", 4, gpus=8)

    def gpu_pod(name: str, nodes: list[str], gpus: int, scheduler: str = "") -> dict:
        # A GPU's share of its node's cpu and memory (7 cpus, 56 GiB of 64 and 512 GiB), as
        # profiles give: cpu and memory are used in step, so the default scheduler's
        # BalancedAllocation (the balance a pod adds) is the same on every node and its
        # LeastAllocated decides, without ties.
        return pod(name, nodes, {"nvidia.com/gpu": gpus}, scheduler=scheduler,
                   cpu=str(7 * gpus), memory=f"{56 * gpus}Gi")
    used: dict[str, set[str]] = {"packed": set(), "default": set()}
    for n, gpus in enumerate([1, 2, 1, 1, 2, 1, 1, 2, 1]):  # the same pods, one at a time
        used["packed"].add(place(kube, namespace, gpu_pod(
            f"packed-{n}", packed, gpus, packing_scheduler.name)))
        used["default"].add(place(kube, namespace, gpu_pod(f"default-{n}", spread, gpus)))
    assert len(set(packed) - used["packed"]) == 2  # 12 GPUs on two nodes: 8 + 4
    assert set(spread) == used["default"]  # spread over all four: no whole node is left

    place(kube, namespace, gpu_pod("packed-whole", packed, 8, packing_scheduler.name))
    kube.create(pods_path(namespace), gpu_pod("default-whole", spread, 8))
    condition = kube.wait_for("default-whole Unschedulable", lambda: next((
        c for c in kube.get(pods_path(namespace, "default-whole"))["status"].get("conditions", [])
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"), None))
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    assert not kube.get(pods_path(namespace, "default-whole"))["spec"].get("nodeName")


def mig_pool(kube: Kube, namespace: str, gpu_nodes, prefix: str) -> dict[str, str]:
    """Three MIG nodes: one holding 3 slices (little cpu), one holding 40 cpus (no slice),
    one empty; the pods placed on them by hand (nodeName)."""
    names = pool(kube, gpu_nodes, prefix, 3, mig={"1g.18gb": 7})
    nodes = dict(zip(("slices", "cpu", "empty"), names, strict=True))
    for n in range(3):
        kube.create(pods_path(namespace), pod(f"{prefix}held-{n}", names, {SLICE: 1},
                                              node=nodes["slices"]))
    kube.create(pods_path(namespace), pod(f"{prefix}cpu", names, {}, cpu="40", memory="8Gi",
                                          node=nodes["cpu"]))
    return nodes


def test_slices_pack_onto_the_node_fullest_of_that_slice_by_its_exact_name(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
        packing_scheduler: PackingScheduler):
    exact = mig_pool(kube, namespace, gpu_nodes, "exact-")
    wild = mig_pool(kube, namespace, gpu_nodes, "wild-")

    def wildcard(config: dict) -> None:  # what a hand-written `nvidia.com/mig-*` would be
        for resource in scoring(config):
            if resource["name"].startswith("nvidia.com/mig-"):
                resource["name"] = "nvidia.com/mig-*"

    with running_packing_scheduler(control_plane.state, kube, ["1g.18gb"],
                                   control_plane.root / "packing-scheduler",
                                   edit=wildcard) as wildcarded:
        assert {"name": "nvidia.com/mig-*", "weight": GPU_WEIGHT} in scoring(
            configz(control_plane, wildcarded))  # kube-scheduler accepts it
        for n in range(3):
            assert place(kube, namespace, pod(f"exact-{n}", list(exact.values()), {SLICE: 1},
                                              scheduler=packing_scheduler.name)) == exact["slices"]
        # The wildcard names no resource a pod requests: slices are not scored, only cpu and
        # memory, and the slice goes where the cpus are taken.
        assert place(kube, namespace, pod("wild-0", list(wild.values()), {SLICE: 1},
                                          scheduler=wildcarded.name)) == wild["cpu"]


async def spawner_pod(namespace: str, packing: str) -> dict:
    """GPUKubeSpawner's pod for a slice (no home claim: scheduling only)."""
    spawner = GPUKubeSpawner(_mock=True, namespace=namespace, packing_scheduler=packing,
                             node_selector={POOL_LABEL: namespace}, volumes=[], volume_mounts=[])
    spawner.user.name = "ada"
    spawner.pod_name = f"jupyter-ada-{'packed' if packing else 'default'}"
    for option, value in pod_options(slice_choice(), spawner.cluster_gpus()).items():
        setattr(spawner, option, value)
    return ApiClient().sanitize_for_serialization(await spawner.get_pod_manifest())


async def test_gpukubespawner_pods_name_the_packing_scheduler_when_configured(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
        packing_scheduler: PackingScheduler, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", control_plane.kubeconfig)
    pool(kube, gpu_nodes, "h200-", 1, mig={"1g.18gb": 7})
    for packing, expected in ((packing_scheduler.name, packing_scheduler.name), ("", DEFAULT)):
        body = await spawner_pod(namespace, packing)
        assert body["spec"].get("schedulerName", DEFAULT) == expected
        name = body["metadata"]["name"]
        kube.create(pods_path(namespace), body)
        bound(kube, namespace, name)
        scheduled = kube.wait_for(f"{name}'s Scheduled event", lambda n=name: next((
            e for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["involvedObject"]["name"] == n and e["reason"] == "Scheduled"), None))
        assert (scheduled.get("reportingComponent") or scheduled["source"]["component"]) == expected
