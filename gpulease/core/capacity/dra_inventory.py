"""The cluster inventory in DRA mode: from ResourceSlices and allocated ResourceClaims, pure.

Under Dynamic Resource Allocation a node's GPUs are not a count on its Node:
NVIDIA's driver publishes each device in ResourceSlices, and kube-scheduler
allocates devices to ResourceClaims, writing which ones in each claim's status.
So in DRA mode gpulease knows every device and who holds it.

This module turns those objects into the ClusterInventory that admission, the
fair queue, limits, reservations and the spawn page already decide on
(cluster_inventory.py). A node offers, per kind, the count of its devices,
under the names the device plugin's `mixed` strategy uses (DraDevice.resource);
each allocated claim of NVIDIA's driver is a Hold of its devices, named by the
gpulease server whose pod it is reserved for (or owned by), or by the pod, or
by the claim alone. The watch adapter (spawners/kube/cluster_watch.py) keeps
the objects current.

What counts, as kube-scheduler's allocator sees it:
- the slices of NVIDIA's driver only, and of each pool only its newest
  generation, and only once all its slices are there (a pool being rewritten
  keeps older slices a moment, and an incomplete one is skipped);
- devices of node-local slices (`nodeName`); a node without its Node object
  is not offered;
- a device whose productName is one of the NVML names a model's selector
  asks for (gpu_models.NVML_MODELS): any other is offered under its own
  name, which no profile asks for, never as a model a claim could not get;
- not a device with a NoSchedule or NoExecute taint (the driver's health
  check, an admin's DeviceTaintRule), nor a full GPU whose static MIG
  devices are published (while it is split its slices are what can be
  allocated);
- a partitionable device (DynamicMIG: shared counters) is not counted but
  carved: the node's `partitions` (dra_partitions.py) hold them, and what is
  free of each kind is what the fit rule could still carve (partitions.py);
- an allocated claim holds its devices until its allocation is cleared,
  whatever became of its pod (the scheduler counts them so too); a claim's
  results with adminAccess (monitoring) hold nothing.

A node with devices of more than one model takes the most common one's key
(kinds_offered reads one model per node); no NVIDIA node ships mixed boards.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import replace

from gpulease.core.capacity.cluster_inventory import (
    DRA_NODE,
    ClusterInventory,
    ClusterNode,
    Hold,
    node_from_object,
    pod_holder,
)
from gpulease.core.capacity.dra_device import DraDevice, attribute, device_from  # noqa: F401
from gpulease.core.capacity.dra_partitions import partitioned_nodes
from gpulease.core.capacity.partitions import PartitionedNode, free_counts
from gpulease.core.model import nvidia_dra as nv
from gpulease.core.tiers import ON_DEMAND

DeviceIndex = dict[tuple[str, str], tuple[str, DraDevice]]  # (pool, device) -> (node, device)
NOBODY = ("", "", False, ON_DEMAND, None)  # pod_holder's answer for no gpulease server


def _pool(slice_: dict) -> tuple[str, int, int]:
    pool = slice_["spec"].get("pool") or {}
    return (pool.get("name", ""), int(pool.get("generation", 0) or 0),
            int(pool.get("resourceSliceCount", 1) or 1))


def current_slices(slices: Iterable[dict], driver: str = nv.DRIVER) -> list[dict]:
    """The slices of `driver` that count: of each pool its newest generation, if complete."""
    mine = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    newest: dict[str, int] = {}
    for s in mine:
        name, generation, _count = _pool(s)
        newest[name] = max(newest.get(name, 0), generation)
    current = [s for s in mine if _pool(s)[1] == newest[_pool(s)[0]]]
    seen = Counter(_pool(s)[0] for s in current)
    return [s for s in current if seen[_pool(s)[0]] >= _pool(s)[2]]


def _usable(device: dict) -> bool:
    """Whether the scheduler may allocate it alone: no NoSchedule/NoExecute taint, and no
    shared counters (a partitionable device, counted by issue 46's rules)."""
    if device.get("consumesCounters"):
        return False
    return not any(t.get("effect") in ("NoSchedule", "NoExecute")
                   for t in device.get("taints") or [])


def device_index(slices: Iterable[dict]) -> DeviceIndex:
    """Every GPU and MIG device of NVIDIA's driver in the current slices, by (pool, name)."""
    index: dict[tuple[str, str], tuple[str, DraDevice, bool]] = {}
    for s in current_slices(slices):
        spec = s["spec"]
        node = spec.get("nodeName") or ""
        if not node:
            continue  # devices reachable from several nodes: not node-local GPUs
        pool = (spec.get("pool") or {}).get("name", "")
        for raw in spec.get("devices") or []:
            device = device_from(pool, raw)
            if device is not None:
                index[(pool, device.name)] = (node, device, _usable(raw))
    split = {d.parent_uuid for _, d, _ok in index.values() if d.type == nv.TYPE_MIG}
    return {k: (node, d) for k, (node, d, usable) in index.items()
            if usable and not (d.type == nv.TYPE_GPU and d.uuid in split)}


def _consumer(claim: dict, pods: dict[str, dict]) -> dict | None:
    """The pod a claim is reserved for, else the pod that owns it (a generated claim)."""
    for ref in (claim.get("status") or {}).get("reservedFor") or []:
        if ref.get("resource") == "pods" and ref.get("uid") in pods:
            return pods[ref["uid"]]
    for ref in claim["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Pod" and ref.get("uid") in pods:
            return pods[ref["uid"]]
    return None


def _ending(pod: dict) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp")) or (
        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))


def claim_holds(claims: Iterable[dict], pods: Iterable[dict], index: DeviceIndex,
                servers_namespace: str | None = None) -> list[Hold]:
    """One Hold per allocated claim and node holding devices of NVIDIA's driver."""
    by_uid = {p["metadata"]["uid"]: p for p in pods if p["metadata"].get("uid")}
    holds = []
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        held = [index[(r.get("pool", ""), r.get("device", ""))] for r in results
                if r.get("driver") == nv.DRIVER and not r.get("adminAccess")
                and (r.get("pool", ""), r.get("device", "")) in index]
        if not held:
            continue
        meta = claim["metadata"]
        pod = _consumer(claim, by_uid)
        since, leaving = meta.get("creationTimestamp") or "", False
        if pod is not None and pod["metadata"].get("namespace") == meta.get("namespace"):
            name = f"{meta['namespace']}/{pod['metadata']['name']}"
            who = pod_holder(pod, servers_namespace)
            since = ((pod.get("status") or {}).get("startTime")
                     or pod["metadata"].get("creationTimestamp") or since)
            leaving = _ending(pod)
        else:
            name = f"{meta.get('namespace', '')}/claim {meta['name']}"
            who = NOBODY
        by_node: dict[str, list[DraDevice]] = defaultdict(list)
        for node, device in held:
            by_node[node].append(device)
        for node, devices in sorted(by_node.items()):
            holds.append(Hold(name, node, dict(Counter(d.resource for d in devices
                                                       if d.resource)), *who,
                              devices=tuple(d.uuid for d in devices), since=since,
                              leaving=leaving))
    return holds


def dra_node(base: ClusterNode, devices: list[DraDevice],
             partitions: PartitionedNode | None = None) -> ClusterNode:
    """A Node as DRA mode sees it: its labels, taints and readiness, and its devices (and
    its DynamicMIG GPUs: as many of each kind as an idle node could carve)."""
    devices = sorted(devices, key=lambda d: d.name)
    models = Counter(d.model for d in devices if d.model)
    allocatable = Counter(d.resource for d in devices)
    if partitions is not None:
        models.update({partitions.model: len(partitions.gpus())} if partitions.model else {})
        allocatable.update(free_counts(partitions, ()))
    driver = next((d.driver_version for d in devices if d.driver_version),
                  partitions.driver if partitions is not None else "")
    return replace(base, model=models.most_common(1)[0][0] if models else None,
                   mig_strategy=DRA_NODE, driver=driver, allocatable=dict(allocatable),
                   single_profile=None, devices=tuple(devices), partitions=partitions)


def _partition_index(parts: dict[str, PartitionedNode]) -> DeviceIndex:
    """The partitionable devices, as claim_holds looks results up (uuid: their key)."""
    index: DeviceIndex = {}
    for node, partitioned in parts.items():
        for p in partitioned.devices:
            # one of no kind sold is listed too, as no kind: its claim's counters count
            pool, name = p.key.rsplit("/", 1)  # a pool's name may hold "/", a device's not
            kind = "" if not p.resource else nv.TYPE_MIG if p.profile else nv.TYPE_GPU
            index[(pool, name)] = (node, DraDevice(name, pool, p.key, kind, partitioned.model,
                                                   p.profile, partitioned.driver))
    return index


def dra_inventory(nodes: Iterable[dict], slices: Iterable[dict], claims: Iterable[dict],
                  pods: Iterable[dict], servers_namespace: str | None = None
                  ) -> ClusterInventory:
    """The ClusterInventory of a DRA cluster: Node objects, NVIDIA's slices, every claim
    and every pod (to name a claim's holder)."""
    current = current_slices(slices)
    index = device_index(current)
    parts = partitioned_nodes(current)
    per_node: dict[str, list[DraDevice]] = defaultdict(list)
    for node, device in index.values():
        per_node[node].append(device)
    shown = tuple(dra_node(base, per_node.get(base.name, []), parts.get(base.name))
                  for base in map(node_from_object, nodes))
    return ClusterInventory(shown, tuple(claim_holds(
        claims, pods, {**index, **_partition_index(parts)}, servers_namespace)))
