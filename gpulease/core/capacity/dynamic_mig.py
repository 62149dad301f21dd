"""A DynamicMIG GPU as the allocator sees it, built from the MIG geometry: pure.

What NVIDIA's driver publishes for a node of `gpus` MIG-capable GPUs in DynamicMIG
mode (gpulease/core/model/mig_geometry.py), straight as a PartitionedNode: for
the benchmark's simulated pools and for tests that need no API server. The
cluster reads the same thing from the ResourceSlices (dra_partitions.py).
"""

from __future__ import annotations

from gpulease.core.capacity.partitions import Partition, PartitionedNode
from gpulease.core.model import mig_geometry as geo

GPU_RESOURCE = "nvidia.com/gpu"


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile}"


def gpu_partitions(model: str, pool: str, minor: int) -> tuple[dict[str, int],
                                                                list[Partition]]:
    """One GPU's counter set and its devices, in the driver's order (sorted by name)."""
    counter_set = f"{pool}/{geo.counter_set_name(minor)}"
    slices = {geo.memory_slice_counter(i): 1 for i in range(geo.MEMORY_SLICES)}
    full = {**geo.capacities(model, None), **slices}
    devices = [Partition(f"{pool}/gpu-{minor}", GPU_RESOURCE, counter_set,
                         tuple((counter_set, c, n) for c, n in full.items()))]
    for profile, places in geo.placements(model).items():
        for place in places:
            used = {**geo.capacities(model, profile),
                    **{geo.memory_slice_counter(i): 1 for i in place.memory_slices}}
            devices.append(Partition(f"{pool}/{geo.device_name(minor, place)}",
                                     mig_resource(profile), counter_set,
                                     tuple((counter_set, c, n) for c, n in used.items()),
                                     profile, place.start))
    devices.sort(key=lambda d: d.key)
    return full, devices


def partitioned_node(model: str, pool: str, gpus: int, driver: str = "") -> PartitionedNode:
    """A node of `gpus` DynamicMIG GPUs (its slices in GPU order)."""
    sets: dict[str, dict[str, int]] = {}
    devices: list[Partition] = []
    for minor in range(gpus):
        counters, gpu_devices = gpu_partitions(model, pool, minor)
        sets[gpu_devices[0].gpu] = counters
        devices += gpu_devices
    return PartitionedNode(sets, tuple(devices), model, driver)
