"""The fit rule for partitionable devices (DynamicMIG), as kube-scheduler applies it: pure.

A GPU in NVIDIA's DynamicMIG mode is published as a counter set and a device for
the full GPU and for every placement of every MIG profile, each consuming
counters of that set (gpulease/core/model/mig_geometry.py). kube-scheduler's
allocator (k8s.io/dynamic-resource-allocation, structured/internal/incubating:
checkAvailableCounters) allocates a device when it is not allocated already and,
for every counter it consumes, what the allocated devices of its pool consume
plus its own is at most the counter set's value. It takes the first such
device that matches the request, in its order: pools by name, a pool's slices
by name, a slice's devices as listed. So a 1g lands on the lowest free memory
slice of the first GPU with one, and the GPUs fill (and fragment) in that order.

`PartitionedNode` is one node's counter sets and devices in that order;
`first_fit` is the allocator's choice, `free_counts` how many of each kind could
still be carved one after another, and `carve` a request of several devices.
Admission, the queue, preemption and the inventory page decide on these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

Counters = Mapping[str, int]


@dataclass(frozen=True)
class Partition:
    """A device that consumes shared counters: a MIG placement, or the full GPU."""

    key: str  # "<pool>/<device>": unique in the cluster
    resource: str  # what it is sold as: nvidia.com/gpu or nvidia.com/mig-<profile>
    gpu: str  # its (first) counter set's name, qualified by pool: "<pool>/<set>"
    consumes: tuple[tuple[str, str, int], ...]  # (counter set, counter, amount)
    profile: str | None = None
    start: int | None = None  # first memory slice, where the name says (for the page)
    # False: never handed out (tainted, or of no kind gpulease sells), yet counted when
    # allocated all the same, as the scheduler counts it
    allocatable: bool = True


@dataclass(frozen=True)
class PartitionedNode:
    counter_sets: Mapping[str, Counters]  # "<pool>/<set>" -> counter -> value
    devices: tuple[Partition, ...]  # in the allocator's order
    model: str | None = None  # gpulease's model key, from the devices' productName
    driver: str = ""  # the devices' driverVersion
    _by_key: dict = field(default_factory=dict, compare=False, repr=False)

    def device(self, key: str) -> Partition | None:
        if not self._by_key:
            self._by_key.update((d.key, d) for d in self.devices)
        return self._by_key.get(key)

    def resources(self) -> list[str]:
        return sorted({d.resource for d in self.devices if d.allocatable})

    def gpus(self) -> list[str]:
        return list(dict.fromkeys(d.gpu for d in self.devices))


def available(node: PartitionedNode, allocated: Iterable[str]) -> dict[str, Counter[str]]:
    """Per counter set, what is left once the `allocated` devices' consumption is taken
    (the scheduler's availableCounters; it may go below zero, which leaves nothing)."""
    left = {name: Counter(values) for name, values in node.counter_sets.items()}
    for key in allocated:
        device = node.device(key)
        if device is not None:
            _take(device, left)
    return left


def fits(device: Partition, left: Mapping[str, Counter[str]]) -> bool:
    """Whether every counter `device` consumes has that much left in its set."""
    return all(s in left and left[s][c] >= n for s, c, n in device.consumes)


def _take(device: Partition, left: dict[str, Counter[str]]) -> None:
    for counter_set, counter, amount in device.consumes:
        if counter_set in left:
            left[counter_set][counter] -= amount


def first_fit(node: PartitionedNode, resource: str, allocated: Collection[str],
              left: dict[str, Counter[str]] | None = None,
              gpus: Collection[str] | None = None) -> Partition | None:
    """The device the allocator takes for one `resource`: the first of that kind, in its
    order, not allocated and fitting; None when none fits. `gpus`: only on these."""
    left = available(node, allocated) if left is None else left
    for device in node.devices:
        if (device.allocatable and device.resource == resource and device.key not in allocated
                and (gpus is None or device.gpu in gpus) and fits(device, left)):
            return device
    return None


def carve(node: PartitionedNode, wanted: Iterable[str], allocated: Collection[str],
          gpus: Collection[str] | None = None) -> list[Partition] | None:
    """The devices a claim asking for `wanted` (resources, in its requests' order) gets,
    one after another by first fit; None if any does not fit. (The allocator backtracks
    across a claim's requests when one fails; for devices that differ only in
    placement, first fit finds a way whenever one exists for a single kind.)"""
    taken = set(allocated)
    left = available(node, taken)
    chosen = []
    for resource in wanted:
        device = first_fit(node, resource, taken, left, gpus)
        if device is None:
            return None
        _take(device, left)
        taken.add(device.key)
        chosen.append(device)
    return chosen


def overlap(a: Partition, b: Partition, node: PartitionedNode) -> bool:
    """Whether `a` and `b` could not both be allocated on an otherwise idle node (they
    share a memory slice, or together need more of a counter than its set has)."""
    if a.key == b.key:
        return True
    need: Counter[tuple[str, str]] = Counter()
    for counter_set, counter, amount in (*a.consumes, *b.consumes):
        need[(counter_set, counter)] += amount
    return any((node.counter_sets.get(s) or {}).get(c, 0) < n for (s, c), n in need.items())


def free_counts(node: PartitionedNode, allocated: Collection[str]) -> dict[str, int]:
    """Per kind, how many more could be carved now, one after another (each kind alone)."""
    base = available(node, allocated)
    out = {}
    for resource in node.resources():
        left = {name: Counter(c) for name, c in base.items()}
        taken = set(allocated)
        count = 0
        while (device := first_fit(node, resource, taken, left)) is not None:
            _take(device, left)
            taken.add(device.key)
            count += 1
        out[resource] = count
    return out


def carved_rows(node: PartitionedNode, allocated: Collection[str],
                holder_of: Mapping[str, dict]) -> list[dict]:
    """The inventory page's form: per GPU, the slices carved on it now (or the whole
    GPU) and who holds each, by first memory slice."""
    return [{"gpu": gpu.split("/", 1)[-1].removesuffix("-counter-set"),
             "carved": [{"device": d.key.split("/", 1)[-1], "profile": d.profile,
                         "first_memory_slice": d.start, "holder": holder_of.get(d.key)}
                        for d in devices]}
            for gpu, devices in carved(node, allocated).items()]


def carved(node: PartitionedNode, allocated: Collection[str]) -> dict[str, list[Partition]]:
    """Per GPU (counter set), the devices allocated on it now, by first memory slice."""
    out: dict[str, list[Partition]] = {gpu: [] for gpu in node.gpus()}
    for device in node.devices:
        if device.key in allocated:
            out.setdefault(device.gpu, []).append(device)
    for devices in out.values():
        devices.sort(key=lambda d: (d.start if d.start is not None else -1, d.key))
    return out
