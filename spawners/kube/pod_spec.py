"""What a profile asks of Kubernetes: the pod spec of the cluster shape, as plain data.

gpulease decides whether and when a request may run; Kubernetes decides where.
This module turns a profile into the parts of a pod that say what it needs —
extended resources as the NVIDIA device plugin names them, node affinity for
the GPU model as GPU feature discovery labels it, tolerations for GPU taints,
CPU and memory, the scheduler — and the security context every user's pod
gets, one that passes PodSecurity `restricted`. `kubespawner_traits` maps the
result onto kubespawner's own options, which is all GPUKubeSpawner sets.
Pure functions over dataclasses; no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulease.core.model.gpu_models import GFD_PRODUCTS
from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.core.tiers import (
    ON_DEMAND,
    RESERVATION_LABEL,
    SPOT,
    TIER_LABEL,
    Tier,
    registered,
    tier,
)
from gpulease.spawners.kube.dra_claims import ALLOCATIONS

PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGIES = ("mixed", "single")
# The taint GPU node pools commonly carry (and the NVIDIA GPU operator's docs use).
DEFAULT_GPU_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
# A spot pod's SIGTERM comes this long after its grace period, for the server to stop.
SPOT_STOP_S = 10
# jovyan in the Jupyter images; a user's pod never runs as root.
POD_UID = 1000
POD_GID = 100


@dataclass(frozen=True)
class ClusterGpus:
    """How this cluster's GPU nodes are set up (per cluster, from configuration)."""

    mig_strategy: str = "mixed"  # the device plugin's MIG strategy: mixed | single
    tolerations: tuple[dict[str, str], ...] = DEFAULT_GPU_TOLERATIONS
    scheduler_name: str = ""  # the GPU-packing scheduler; "" = the cluster's default
    # device-plugin | dra: under DRA a pod's GPUs are a ResourceClaim (dra_claims.py), so
    # its spec asks no extended resource and no product affinity here
    allocation: str = "device-plugin"

    def __post_init__(self) -> None:
        if self.mig_strategy not in MIG_STRATEGIES:
            raise ValueError(f"mig_strategy {self.mig_strategy!r}: allowed are "
                             f"{', '.join(MIG_STRATEGIES)}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"gpu_allocation {self.allocation!r}: allowed are "
                             f"{', '.join(ALLOCATIONS)}")


@dataclass(frozen=True)
class PodNeeds:
    """The parts of a pod a profile decides."""

    cpu: Decimal
    memory_bytes: int
    extended: dict[str, int] = field(default_factory=dict)  # limits = requests
    node_affinity: tuple[dict[str, Any], ...] = ()  # nodeSelectorTerms
    tolerations: tuple[dict[str, str], ...] = ()
    scheduler_name: str = ""


def gpu_resource(gpu: GpuSpec, strategy: str) -> tuple[str, int]:
    """(extended resource name, count) the device plugin advertises for this GPU spec."""
    if gpu.mig and strategy == "mixed":
        return f"nvidia.com/mig-{gpu.mig}", gpu.count
    return "nvidia.com/gpu", gpu.count  # whole cards, or MIG slices under `single`


def product_values(gpu: GpuSpec, strategy: str) -> list[str]:
    """Every `nvidia.com/gpu.product` value a node able to run this spec may carry."""
    products = GFD_PRODUCTS.get(gpu.model)
    if not products:
        raise ValueError(f"GPU model {gpu.model!r} has no GPU feature discovery product names: "
                         f"known are {', '.join(sorted(GFD_PRODUCTS))}")
    if gpu.mig and strategy == "single":
        return [f"{p}-MIG-{gpu.mig}" for p in products]
    return list(products)


def pod_needs(profile: Profile, cluster: ClusterGpus) -> PodNeeds:
    """What a server of `profile` asks of Kubernetes."""
    if profile.gpu is None:
        return PodNeeds(profile.cpu, profile.memory_bytes, scheduler_name=cluster.scheduler_name)
    if cluster.allocation == "dra":  # its devices: the claim's selectors say which
        return PodNeeds(profile.cpu, profile.memory_bytes, tolerations=tuple(cluster.tolerations),
                        scheduler_name=cluster.scheduler_name)
    resource, count = gpu_resource(profile.gpu, cluster.mig_strategy)
    term = {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In",
                                  "values": product_values(profile.gpu, cluster.mig_strategy)}]}
    return PodNeeds(profile.cpu, profile.memory_bytes, {resource: count}, (term,),
                    tuple(cluster.tolerations), cluster.scheduler_name)


@dataclass(frozen=True)
class TierPod:
    """What a server's tier sets on its pod."""

    priority_class: str  # "" leaves the cluster's default priority
    labels: dict[str, str]
    pre_stop_sleep_s: int = 0  # 0: none
    termination_grace_s: int | None = None  # None: kubespawner's (the pod's default)


def unmapped_priority_classes(on_demand_class: str, spot_class: str,
                              priority_classes: Mapping[str, str] | None = None,
                              tiers: tuple[Tier, ...] | None = None) -> list[str]:
    """A warning for each registered tier whose record names a PriorityClass that no
    option maps to a name, where the cluster's servers take PriorityClasses at all
    (`on_demand_class` set): its GPU pods would take the cluster's default priority,
    neither preempting nor preempted as its rank says (tier_pod)."""
    if not on_demand_class:
        return []
    classes = {ON_DEMAND: on_demand_class, SPOT: spot_class, **(priority_classes or {})}
    return [f"tier {record.name}'s pods take the cluster's default priority: "
            f"GPUKubeSpawner.tier_priority_classes names no PriorityClass for "
            f"{record.priority_class!r} (its record's priority_class)"
            for record in (registered() if tiers is None else tiers)
            if record.priority_class and not classes.get(record.priority_class)]


def tier_pod(tier_name: str, on_demand_class: str, spot_class: str, grace_s: float,
             gpu: bool = True, cpu_only_class: str = "",
             reservation_id: int | None = None,
             priority_classes: Mapping[str, str] | None = None) -> TierPod:
    """The pod of a server on tier `tier_name`: its label, its PriorityClass, and for a
    preemptible tier the time to save.

    The PriorityClass is the one configured for the tier record's `priority_class`
    (gpulease/core/tiers.py): `on_demand_class` for "on-demand" (on demand's and
    reserved's), `spot_class` for "spot", and `priority_classes` names those of further
    tiers; "" (none configured, or the record names none) leaves the cluster's default.

    kube-scheduler preempts a lower-priority pod for a higher one by deleting it
    with the pod's own termination grace period; the kubelet then runs the preStop
    hook and sends SIGTERM when it ends. A preemptible tier's pod (spot's) sleeps in
    preStop for the spot grace period, so a preempted server keeps running, and its
    researcher saving, until the deadline they were told; SPOT_STOP_S then lets it stop.
    The hub's own stops (the user's, the culler's, credit's) delete with kubespawner's
    short delete_grace_period, which cuts the sleep: they are as quick as on demand.

    A CPU-only server (`gpu` False, always on demand) takes `cpu_only_class`: as high
    as on demand but never preempting, so that it neither takes a node's CPU from a
    spot or other pod by preemption nor is preempted by a GPU start.

    A server on a reservation's unit (tier reserved) runs at on-demand priority: its
    start preempts spot pods on the reserved capacity as an on-demand start does."""
    labels = {TIER_LABEL: tier_name}
    if not gpu:
        return TierPod(cpu_only_class, labels)
    record = tier(tier_name)
    classes = {ON_DEMAND: on_demand_class, SPOT: spot_class, **(priority_classes or {})}
    priority_class = classes.get(record.priority_class, "") if record.priority_class else ""
    if reservation_id is not None:
        labels[RESERVATION_LABEL] = str(reservation_id)
    if not record.preemptible:
        return TierPod(priority_class, labels)
    seconds = max(1, int(-(-grace_s // 1)))
    return TierPod(priority_class, labels, seconds, seconds + SPOT_STOP_S)


def avoiding(terms: list[dict[str, Any]], nodes: frozenset[str]) -> list[dict[str, Any]]:
    """nodeSelectorTerms that also keep the pod off `nodes` (those whose NVIDIA driver is
    too old for its image): the terms are ORed, so each one gets the exclusion."""
    if not nodes:
        return terms
    off = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    return [{**t, "matchFields": [*t.get("matchFields", []), off]} for t in terms] or [
        {"matchFields": [off]}]


def only_on(terms: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """nodeSelectorTerms that also keep the pod to `node` (the one admitted, where that
    matters to reserved units: gpulease/core/capacity/reserved_pool.py)."""
    on = {"key": "metadata.name", "operator": "In", "values": [node]}
    return [{**t, "matchFields": [*t.get("matchFields", []), on]} for t in terms] or [
        {"matchFields": [on]}]


# The notebook container's: a container that fails with nothing in its termination message
# file gets the tail of its log as its status's `state.terminated.message` (the kubelet's
# last 80 lines, at most 2 KiB: gpulease.core.server_log's TAIL_*), which a failed start
# shows its owner. The full log stays with Kubernetes (kubectl logs).
TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"


def restricted_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod, container) security contexts that pass PodSecurity `restricted`."""
    pod = {"runAsNonRoot": True, "runAsUser": POD_UID, "runAsGroup": POD_GID,
           "fsGroup": POD_GID, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                 "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    return pod, container


def kubespawner_traits(needs: PodNeeds, image: str) -> dict[str, Any]:
    """kubespawner's options for a server with these needs, of this image."""
    pod_security, container_security = restricted_security()
    extended = {name: str(count) for name, count in needs.extended.items()}
    return {
        "image": image,
        "cpu_limit": float(needs.cpu), "cpu_guarantee": float(needs.cpu),
        "mem_limit": needs.memory_bytes, "mem_guarantee": needs.memory_bytes,
        # An extended resource's request must equal its limit (the API server checks).
        "extra_resource_limits": extended, "extra_resource_guarantees": dict(extended),
        "node_affinity_required": [dict(t) for t in needs.node_affinity],
        "tolerations": [dict(t) for t in needs.tolerations],
        "scheduler_name": needs.scheduler_name,
        "uid": POD_UID, "gid": POD_GID, "fs_gid": POD_GID,
        "allow_privilege_escalation": False,
        "pod_security_context": pod_security,
        "container_security_context": container_security,
        # A user's pod is user code: no credential of the cluster's in it.
        "automount_service_account_token": False,
    }
