"""Partitionable devices from ResourceSlices (DynamicMIG): pure.

NVIDIA's driver in DynamicMIG mode publishes a node's pool as one slice of
counter sets (`sharedCounters`, one set per GPU) and one slice of devices per
GPU, each device consuming counters (gpulease/core/model/mig_geometry.py). This
module reads a node's PartitionedNode from them, in the allocator's order:
slices by name within the pool, devices as listed (partitions.py).

A device is offered as dra_device.device_from reads it (a GPU or a MIG
device with a profile) and only without a NoSchedule/NoExecute taint; one
that is not (tainted, of another type) is kept as never allocatable, since
once allocated it still consumes its counters. Devices without counters are
the static ones and stay dra_inventory's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from gpulease.core.capacity.dra_device import device_from
from gpulease.core.capacity.partitions import Partition, PartitionedNode
from gpulease.core.model import nvidia_dra as nv
from gpulease.core.units import parse_quantity


def partition_key(pool: str, device: str) -> str:
    """How gpulease names a partitionable device (it has no uuid until carved)."""
    return f"{pool}/{device}"


def _counters(values: dict) -> dict[str, int]:
    out = {}
    for name, counter in (values or {}).items():
        try:
            out[name] = parse_quantity(str((counter or {}).get("value", "0")))
        except ValueError:
            out[name] = 0  # a value no quantity: nothing to give
    return out


def _tainted(device: dict) -> bool:
    return any(t.get("effect") in ("NoSchedule", "NoExecute")
               for t in device.get("taints") or [])


def partitioned_nodes(current: Iterable[dict]) -> dict[str, PartitionedNode]:
    """node -> its partitionable devices and counter sets, from the current slices of
    NVIDIA's driver (dra_inventory.current_slices); nodes without any are left out."""
    by_pool: dict[str, list[dict]] = defaultdict(list)
    for s in current:
        by_pool[((s["spec"].get("pool") or {}).get("name", ""))].append(s)
    out: dict[str, PartitionedNode] = {}
    for pool, slices in sorted(by_pool.items()):
        node = next((s["spec"].get("nodeName") for s in slices if s["spec"].get("nodeName")), "")
        if not node:
            continue
        slices.sort(key=lambda s: s["metadata"].get("name", ""))
        sets = {f"{pool}/{c['name']}": _counters(c.get("counters"))
                for s in slices for c in s["spec"].get("sharedCounters") or []}
        devices, models, driver = [], [], ""
        for s in slices:
            for raw in s["spec"].get("devices") or []:
                if not raw.get("consumesCounters"):
                    continue
                device = device_from(pool, raw)
                consumes = tuple((f"{pool}/{use.get('counterSet', '')}", name, amount)
                                 for use in raw["consumesCounters"]
                                 for name, amount in _counters(use.get("counters")).items())
                key = partition_key(pool, raw["name"])
                first_set = consumes[0][0] if consumes else ""
                if device is None:  # of no kind sold: never handed out, still counted
                    devices.append(Partition(key, "", first_set, consumes, allocatable=False))
                    continue
                models.append(device.model)
                driver = driver or device.driver_version
                start = raw["name"].rsplit("-", 1)[-1] if device.type == nv.TYPE_MIG else ""
                # a tainted device is never handed out, but once allocated it still consumes
                # its counters (an admin's DeviceTaintRule may taint a device a pod holds)
                devices.append(Partition(key, device.resource, first_set, consumes,
                                         device.profile, int(start) if start.isdigit() else None,
                                         allocatable=not _tainted(raw)))
        if any(d.allocatable for d in devices):
            model = max(set(models), key=models.count) if models else None
            out[node] = PartitionedNode(sets, tuple(devices), model, driver)
    return out
