"""The pure fit rule for DynamicMIG (gpulease/core/capacity/partitions.py) against the real
kube-scheduler: every decision the same device, or the same "no room".

A bind-only node (kwok keeps it Ready, nothing runs its pods) of two H200s is
published by the driver's test double in DynamicMIG mode (tests/cluster/dra_driver.py
pool_slices: a counter set per GPU, the full GPU and every placement of every
MIG profile as devices consuming its counters). A seeded random sequence
creates pods each with a ResourceClaim (standalone, or from a template) of
gpulease's own claim spec for a MIG profile or a full GPU, and deletes running
ones. Before each creation the rule predicts, from the slices as the API server
lists them and the claims allocated then, the device the allocator takes
(`first_fit`) or none; the scheduler's decision (the claim's allocation, or the
pod Unschedulable) must be exactly that. A pod that found no room is deleted,
except up to KEEP of them, one at a time, kept until a deletion makes room, and
then it must get the device the rule names for that moment.

kube-scheduler 1.36 runs with DRAPartitionableDevices at its default (beta, on):
the harness sets no feature gates (tests/cluster/components.py); the test reads
the gate from the API server's and the scheduler's /metrics first.
"""

from __future__ import annotations

import random
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from gpulease.core.capacity import partitions
from gpulease.core.capacity.dra_inventory import current_slices
from gpulease.core.capacity.dra_partitions import partition_key, partitioned_nodes
from gpulease.core.capacity.dynamic_mig import GPU_RESOURCE, mig_resource, partitioned_node
from gpulease.core.capacity.partitions import PartitionedNode
from gpulease.core.model import mig_geometry as geo
from gpulease.core.model.profiles import GpuSpec
from gpulease.spawners.kube.dra_claims import claim_spec
from tests.cluster import dra_driver
from tests.cluster.conftest import POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode

RESOURCE = dra_driver.RESOURCE
GATE = "DRAPartitionableDevices"
NODE = GpuNode("dmig", gpus=2, dra=True, dynamic_mig=True, bind_only=True)
KINDS = ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", None)  # None: GPU
# Seeds whose sequences (found with the rule alone) allocate every kind, fill GPU 1 while
# GPU 0 is carved, refuse for fragmentation, and free room for both kept pods.
SEEDS, STEPS, KEEP = (84, 607), 40, 2
# How long an Unschedulable pod the rule says fits may take to be allocated: the scheduler
# may have tried it before its informer saw the deallocation we waited for; that event
# requeues it (and a kept pod waits out its backoff, at most 10 s).
CATCH_UP_S = 12.0


@dataclass
class Pod:
    name: str
    resource: str
    standalone: bool
    claim: str = ""  # its ResourceClaim's name, once known
    device: str = ""  # the partition key allocated to it


def resource_of(kind: str | None) -> str:
    return mig_resource(kind) if kind else GPU_RESOURCE


def spec_of(kind: str | None) -> dict:
    """gpulease's own claim spec (spawners/kube/dra_claims.py): the model by productName,
    a slice by `device.attributes['gpu.nvidia.com'].profile == '<profile>'`."""
    return claim_spec(GpuSpec("H200", mig=kind))


def metric_gate(text: str) -> str:
    """The value of kubernetes_feature_enabled for GATE in a /metrics text ("" if absent)."""
    for line in text.splitlines():
        if line.startswith("kubernetes_feature_enabled{") and f'name="{GATE}"' in line:
            return line.rsplit(" ", 1)[-1]
    return ""


def scheduler_metrics(plane: ControlPlane) -> str:
    """The control plane's kube-scheduler's /metrics, as admin (client certificate)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate
    context.load_cert_chain(str(plane.root / "pki" / "admin.crt"),
                            str(plane.root / "pki" / "admin.key"))
    port = plane.state["ports"]["scheduler"]
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context,
                                timeout=10) as answer:
        return answer.read().decode()


def pool_node(kube: Kube, node: str) -> PartitionedNode:
    """The node as the rule reads it from the slices the API server lists."""
    listed = kube.get(f"{RESOURCE}/resourceslices")["items"]
    return partitioned_nodes(current_slices(listed))[node]


def allocated(kube: Kube, namespace: str, but: str = "") -> set[str]:
    """The partition keys of every allocated claim's devices (but claim `but`'s), from the
    API server."""
    keys = set()
    for claim in kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]:
        if claim["metadata"]["name"] == but:
            continue
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results") or []
        keys |= {partition_key(r["pool"], r["device"]) for r in results}
    return keys


def memory_slices_used(node: PartitionedNode, taken: set[str]) -> int:
    left = partitions.available(node, taken)
    return sum(1 for counters in left.values() for name, value in counters.items()
               if name.startswith("memory-slice-") and value <= 0)


class Sequence:
    """One namespace's pods on the node, made and deleted, and the scheduler's answers."""

    def __init__(self, kube: Kube, namespace: str, node: str):
        self.kube, self.namespace, self.node = kube, namespace, node
        self.made = 0
        self.caught_up = 0  # decisions first Unschedulable, then allocated
        self.templates: set[str] = set()

    def claims_path(self, name: str = "") -> str:
        return f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims" + (
            f"/{name}" if name else "")

    def create(self, kind: str | None, standalone: bool) -> Pod:
        self.made += 1
        pod = Pod(f"p{self.made:02d}", resource_of(kind), standalone)
        slug = (kind or "gpu").replace(".", "")
        if standalone:
            pod.claim = pod.name
            self.kube.create(self.claims_path(), {"metadata": {"name": pod.claim},
                                                  "spec": spec_of(kind)})
            entry = {"name": "gpus", "resourceClaimName": pod.claim}
        else:
            if slug not in self.templates:
                self.kube.create(f"{RESOURCE}/namespaces/{self.namespace}/"
                                 "resourceclaimtemplates", {"metadata": {"name": slug},
                                                            "spec": {"spec": spec_of(kind)}})
                self.templates.add(slug)
            entry = {"name": "gpus", "resourceClaimTemplateName": slug}
        self.kube.create(pods_path(self.namespace), {"metadata": {"name": pod.name}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": self.node},
            "resourceClaims": [entry],
            "containers": [{"name": "c", "image": "never-run",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "terminationGracePeriodSeconds": 0}})
        return pod

    def claim(self, pod: Pod) -> dict | None:
        if not pod.claim:  # a template's claim: named in the pod's status once made
            got = self.kube.get(pods_path(self.namespace, pod.name))
            names = {s["name"]: s.get("resourceClaimName")
                     for s in (got.get("status") or {}).get("resourceClaimStatuses") or []}
            pod.claim = names.get("gpus") or ""
            if not pod.claim:
                return None
        return self.kube.get(self.claims_path(pod.claim))

    def unschedulable(self, pod: Pod) -> str:
        """The PodScheduled=False/Unschedulable message, "" while there is none."""
        got = self.kube.get(pods_path(self.namespace, pod.name))
        for c in (got.get("status") or {}).get("conditions") or []:
            if (c["type"], c["status"], c.get("reason")) == (
                    "PodScheduled", "False", "Unschedulable"):
                return c.get("message") or "Unschedulable"
        return ""

    def decision(self, pod: Pod, expected: str | None, timeout: float = 30) -> str | None:
        """The scheduler's answer for `pod`: the key of its claim's device, or None once it
        is Unschedulable (then its claim must be unallocated, for want of devices). Where
        the rule expects a device, an Unschedulable pod is given CATCH_UP_S to be retried."""
        deadline, refused_at, message = time.monotonic() + timeout, 0.0, ""
        while time.monotonic() < deadline:
            claim = self.claim(pod)
            results = ((((claim or {}).get("status") or {}).get("allocation") or {}).get(
                "devices") or {}).get("results") or []
            if results:
                (result,) = results
                pod.device = partition_key(result["pool"], result["device"])
                self.caught_up += bool(refused_at)
                return pod.device
            message = self.unschedulable(pod)
            if message and claim is not None:
                refused_at = refused_at or time.monotonic()
                if expected is None or time.monotonic() - refused_at > CATCH_UP_S:
                    assert "cannot allocate all claims" in message, message
                    return None
            time.sleep(0.05)
        raise TimeoutError(f"{pod.name}: no decision in {timeout} s ({message!r})")

    def delete(self, pod: Pod) -> None:
        """The pod and its claim gone (bind-only: grace 0, no kubelet to finish it), and
        waited for: a standalone claim deleted by us, a template's by the controller."""
        self.kube.delete(pods_path(self.namespace, pod.name), {"gracePeriodSeconds": 0})
        if pod.standalone:
            self.kube.delete(self.claims_path(pod.claim))
        if pod.claim:
            self.kube.wait_for(f"claim {pod.claim} gone", lambda: self._gone(pod.claim))
        else:  # the controller never made one (or we never read it): none may stay
            self.kube.wait_for(f"{pod.name}'s claims gone", lambda: not [
                c for c in self.kube.get(self.claims_path())["items"]
                if any(o.get("name") == pod.name
                       for o in c["metadata"].get("ownerReferences") or [])])

    def _gone(self, claim: str) -> bool:
        try:
            self.kube.get(self.claims_path(claim))
        except KubeError as e:
            return e.status == 404
        return False


def untainted(kube: Kube, node: str) -> Callable[[], bool]:
    return lambda: not kube.get(f"/api/v1/nodes/{node}")["spec"].get("taints")


def canonical(node: PartitionedNode) -> PartitionedNode:
    return PartitionedNode(dict(node.counter_sets), tuple(
        replace(d, consumes=tuple(sorted(d.consumes))) for d in node.devices))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_scheduler_decides_every_dynamic_mig_claim_as_the_fit_rule_predicts(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, seed: int):
    began = time.monotonic()
    apiserver = kube.request("GET", "/metrics")["message"]
    assert metric_gate(apiserver) == "1", "the API server has DRAPartitionableDevices off"
    assert metric_gate(scheduler_metrics(control_plane)) == "1", "kube-scheduler has it off"
    dra_driver.install(kube)
    (made,) = gpu_nodes(NODE)
    name = made["metadata"]["name"]
    kube.wait_for(f"node {name} untainted", untainted(kube, name))
    dra_driver.publish(kube, replace(NODE, name=name), owner=made["metadata"]["uid"])
    node = pool_node(kube, name)
    # the API server's round trip keeps every fact the rule reads
    assert canonical(node) == canonical(partitioned_node("H200", name, NODE.gpus))

    rng = random.Random(seed)
    seq = Sequence(kube, namespace, name)
    running: list[Pod] = []
    kept: Pod | None = None
    kept_count, decisions, refused, freed = 0, 0, 0, 0
    for step in range(STEPS):
        taken = allocated(kube, namespace)
        assert taken == {p.device for p in running}, f"step {step}: allocations drifted"
        if running and rng.random() < memory_slices_used(node, taken) / geo.MEMORY_SLICES / 2:
            victim = running.pop(rng.randrange(len(running)))
            seq.delete(victim)
            if kept is not None:  # room freed: the kept pod gets what the rule names, or stays
                # (the others' allocations: the scheduler may have given it its device already)
                others = allocated(kube, namespace, but=kept.claim)
                expected = partitions.first_fit(node, kept.resource, others)
                if expected is not None:
                    got = seq.decision(kept, expected.key)
                    decisions, freed = decisions + 1, freed + 1
                    assert got == expected.key, f"step {step}: kept {kept.name} {kept.resource}"
                    running.append(kept)
                    kept = None
            continue
        kind = rng.choice(KINDS)
        standalone = rng.random() < 0.5
        expected = partitions.first_fit(node, resource_of(kind), taken)
        pod = seq.create(kind, standalone)
        got = seq.decision(pod, expected.key if expected else None)
        decisions += 1
        assert got == (expected.key if expected else None), (
            f"step {step}: {pod.name} {pod.resource} with {sorted(taken)}")
        if got is not None:
            running.append(pod)
        elif kept is None and kept_count < KEEP:
            kept, kept_count = pod, kept_count + 1
            refused += 1
        else:
            seq.delete(pod)
            refused += 1

    # the driver's NodePrepareResources for two of them: the MIG device made for the
    # placement (no uuid before), the full GPU by its own
    for pod in running[:2]:
        got = kube.get(pods_path(namespace, pod.name))
        device = pod.device.split("/", 1)[1]
        want = (dra_driver.gpu_uuid(name, int(device.split("-")[1])) if "-mig-" not in device
                else dra_driver.dynamic_mig_uuid(name, device))
        assert dra_driver.prepare(kube, got) == [want]
    if kept is not None:  # still no room for it: still unallocated
        assert seq.claim(kept) is None or not (seq.claim(kept).get("status") or {}).get(
            "allocation")
    kube.request("DELETE", pods_path(namespace), {"gracePeriodSeconds": 0})
    elapsed = time.monotonic() - began
    print(f"\n{decisions} decisions compared ({refused} unschedulable, {freed} kept pods "
          f"allocated once room freed; {seq.caught_up} first Unschedulable), {elapsed:.1f} s")
    assert decisions >= 25 and refused >= 5 and freed >= 1


@pytest.fixture
def emulated_node(kube: Kube, gpu_nodes) -> str:
    """One DynamicMIG H200 node the kubelet emulator runs (not bind-only)."""
    spec = replace(NODE, name="dmig-run", gpus=1, bind_only=False)
    dra_driver.install(kube)
    (made,) = gpu_nodes(spec)
    name = made["metadata"]["name"]
    kube.wait_for(f"node {name} untainted", untainted(kube, name))
    dra_driver.publish(kube, replace(spec, name=name), owner=made["metadata"]["uid"])
    return name


def test_the_kubelet_emulator_hands_a_pod_the_mig_device_prepared_for_its_placement(
        kube: Kube, namespace: str, emulated_node: str):
    from tests.cluster.test_dra_cluster import devices_in_server

    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    kube.create(claims, {"metadata": {"name": "three"}, "spec": spec_of("3g.71gb")})
    kube.create(pods_path(namespace), {"metadata": {"name": "runs"}, "spec": {
        "nodeSelector": {POOL_LABEL: namespace, "kubernetes.io/hostname": emulated_node},
        "resourceClaims": [{"name": "gpus", "resourceClaimName": "three"}],
        "containers": [{"name": "work", "image": SINGLEUSER_IMAGE,
                        "command": ["python", "-c", "import time; time.sleep(600)"],
                        "resources": {"claims": [{"name": "gpus"}]}}],
        "terminationGracePeriodSeconds": 1}})
    pod = kube.wait_for("the pod Running", lambda: (lambda p: p if (p.get("status") or {}).get(
        "phase") == "Running" else None)(kube.get(pods_path(namespace, "runs"))), timeout=60)
    (result,) = kube.get(f"{claims}/three")["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-0-mig-3g71gb-9-0"  # the first fit: memory slices 0-3
    assert devices_in_server(kube, namespace, pod) == [
        dra_driver.dynamic_mig_uuid(emulated_node, result["device"])]
    kube.delete(pods_path(namespace, "runs"), {"gracePeriodSeconds": 1})
