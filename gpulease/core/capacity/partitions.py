"""The fit rule for partitionable devices (DynamicMIG), as kube-scheduler applies it: pure.

A GPU in NVIDIA's DynamicMIG mode is published as a counter set and a device for
the full GPU and for every placement of every MIG profile, each consuming
counters of that set (gpulease/core/model/mig_geometry.py). kube-scheduler's
allocator (k8s.io/dynamic-resource-allocation, structured/internal/incubating:
checkAvailableCounters) allocates a device when it is not allocated already,
no counter of its pool is overdrawn already, and, for every counter it
consumes, what the allocated devices of its pool consume plus its own is at
most the counter set's value. It takes the first such
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
from functools import cached_property

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

    @cached_property
    def sets(self) -> frozenset[str]:
        return frozenset(s for s, _c, _n in self.consumes)


@dataclass(frozen=True)
class PartitionedNode:
    counter_sets: Mapping[str, Counters]  # "<pool>/<set>" -> counter -> value
    devices: tuple[Partition, ...]  # in the allocator's order
    model: str | None = None  # gpulease's model key, from the devices' productName
    driver: str = ""  # the devices' driverVersion
    # Derived once (the node never changes): devices by key and by kind, and free counts
    # per GPU and its allocated devices.
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def device(self, key: str) -> Partition | None:
        if "by key" not in self._cache:
            self._cache["by key"] = {d.key: d for d in self.devices}
        return self._cache["by key"].get(key)

    def of_kind(self, resource: str) -> list[Partition]:
        """The devices handed out as `resource`, in the allocator's order."""
        if "by kind" not in self._cache:
            by_kind: dict[str, list[Partition]] = {}
            for d in self.devices:
                if d.allocatable:
                    by_kind.setdefault(d.resource, []).append(d)
            self._cache["by kind"] = by_kind
        return self._cache["by kind"].get(resource, [])

    def resources(self) -> list[str]:
        self.of_kind("")
        return sorted(self._cache["by kind"])

    def gpus(self) -> list[str]:
        return list(dict.fromkeys(d.gpu for d in self.devices))

    @property
    def gpu_local(self) -> bool:
        """Whether every device consumes only its own GPU's set (NVIDIA's driver)."""
        if "gpu local" not in self._cache:
            self._cache["gpu local"] = all(d.sets <= {d.gpu} for d in self.devices)
        return self._cache["gpu local"]


def _pool(counter_set: str) -> str:
    return counter_set.rsplit("/", 1)[0]


def available(node: PartitionedNode, allocated: Iterable[str]) -> dict[str, Counter[str]]:
    """Per counter set, what is left once the `allocated` devices' consumption is taken
    (the scheduler's availableCounters; it may go below zero: see `overdrawn`)."""
    left = {name: Counter(values) for name, values in node.counter_sets.items()}
    for key in allocated:
        device = node.device(key)
        if device is not None:
            _take(device, left)
    return left


def overdrawn(left: Mapping[str, Counter[str]]) -> set[str]:
    """The pools with a counter below zero (devices allocated that together need more than
    there is, e.g. written by hand): the allocator then allocates nothing more of that pool
    (allocator_incubating.go checkAvailableCounters refuses while any counter is short)."""
    return {_pool(name) for name, counters in left.items()
            if any(v < 0 for v in counters.values())}


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
    order, not allocated and fitting, in a pool none of whose counters is overdrawn; None
    when none fits. `gpus`: only on these."""
    left = available(node, allocated) if left is None else left
    broken = overdrawn(left)
    for device in node.of_kind(resource):
        if (device.key not in allocated and (gpus is None or device.gpu in gpus)
                and fits(device, left) and _pool(device.gpu) not in broken):
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
    if not a.sets & b.sets:
        return False
    pair = ("overlap", a.key, b.key) if a.key < b.key else ("overlap", b.key, a.key)
    if pair not in node._cache:  # asked again and again by the queue's keep rule
        need: Counter[tuple[str, str]] = Counter()
        for counter_set, counter, amount in (*a.consumes, *b.consumes):
            need[(counter_set, counter)] += amount
        node._cache[pair] = any((node.counter_sets.get(s) or {}).get(c, 0) < n
                                for (s, c), n in need.items())
    return node._cache[pair]


def free_counts(node: PartitionedNode, allocated: Collection[str]) -> dict[str, int]:
    """Per kind, how many more could be carved now, one after another (each kind alone).

    With every device on its own GPU's counters (NVIDIA's driver) a kind fills the GPUs
    one by one, so the count is the sum of each GPU's, worked out once per GPU and its
    allocated devices; otherwise the whole node is carved at once."""
    taken = [k for k in allocated if node.device(k) is not None]
    if not node.gpu_local or overdrawn(available(node, taken)):
        return _carve_counts(node, taken)
    by_gpu: dict[str, list[str]] = {gpu: [] for gpu in node.gpus()}
    for key in taken:
        by_gpu.setdefault(node.device(key).gpu, []).append(key)
    total: Counter[str] = Counter({r: 0 for r in node.resources()})
    for gpu, keys in by_gpu.items():
        cache_key = ("free", gpu, frozenset(keys))
        if cache_key not in node._cache:
            node._cache[cache_key] = _carve_counts(node, keys, {gpu})
        total.update(node._cache[cache_key])
    return dict(total)


def _carve_counts(node: PartitionedNode, allocated: Collection[str],
                  gpus: Collection[str] | None = None) -> dict[str, int]:
    base = available(node, allocated)
    out = {}
    for resource in node.resources():
        left = {name: Counter(c) for name, c in base.items()}
        taken = set(allocated)
        count = 0
        while (device := first_fit(node, resource, taken, left, gpus)) is not None:
            _take(device, left)
            taken.add(device.key)
            count += 1
        out[resource] = count
    return out


def carved_rows(node: PartitionedNode, allocated: Collection[str],
                holder_of: Mapping[str, dict]) -> list[dict]:
    """The inventory page's form: per GPU, the slices carved on it now (or the whole
    GPU) and who holds each, by first memory slice."""
    return [{"gpu": gpu.rsplit("/", 1)[-1].removesuffix("-counter-set"),
             "carved": [{"device": d.key.rsplit("/", 1)[-1], "profile": d.profile,
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
