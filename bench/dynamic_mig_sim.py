"""bench/dynamic_mig.py's simulation: gpulease's queue in front of a pool of MIG GPUs. Pure.

Event driven: at every arrival, end and give-up the queue is served by
gpulease/core/capacity/cluster_queue.py plan_cluster over the inventory of that
moment (ClusterInventory: the pool's nodes, a Hold per running request), and
what it says starts at once (no scheduling delay: both pools alike).

- A DynamicMIG node (`dynamic_node`) is a ClusterNode with its `partitions`
  (gpulease/core/capacity/dynamic_mig.py partitioned_node, as NVIDIA's driver
  publishes it); a start there gets its device from partitions.carve on the
  node plan_cluster named (the first fit kube-scheduler's allocator makes) and
  holds it until it ends. Where that node cannot carve it after all (admission
  and this step disagree), the next node by name that can is taken and the
  start counted in `misplaced`; where none can, it stays in the queue.
- A fixed layout's node (`fixed_node`) is the device plugin's `mixed`
  strategy: allocatable {nvidia.com/mig-<profile>: count}, the sum of its GPUs'
  configurations; a start holds one of its profile on the node named.

A profile a fixed layout has nowhere is refused at once (plan_cluster's
`never`, gpulease's 422). For the wait figures a request that never started
(gave up after its patience, or refused) counts its patience as its wait.

`gpu_configs` are the valid configurations of one GPU in the sold profiles,
read from the MIG geometry through the fit rule itself: every set of devices
one idle DynamicMIG GPU can hold at once (partitions.fits on its counters:
memory slices and compute), kept where no further sold slice fits (maximal),
as profile counts, less those another configuration holds all of and more
(a layout never gains by offering fewer slices). For an H200: nine.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from bench.dynamic_mig_trace import MODEL, SOLD, Request
from gpulease.core.capacity import partitioned_fit
from gpulease.core.capacity.cluster_inventory import DRA_NODE, ClusterInventory, ClusterNode, Hold
from gpulease.core.capacity.cluster_queue import plan_cluster
from gpulease.core.capacity.dynamic_mig import mig_resource, partitioned_node
from gpulease.core.capacity.partitions import (
    Partition,
    PartitionedNode,
    available,
    carve,
    fits,
    free_counts,
    overlap,
)
from gpulease.core.capacity.queue import Waiting

DRIVER = "580.95.5"
Config = tuple[tuple[str, int], ...]  # one GPU's slices: (profile, count), sold order


def dynamic_node(name: str, gpus: int) -> ClusterNode:
    partitions = partitioned_node(MODEL, name, gpus, DRIVER)
    return ClusterNode(name, MODEL, DRA_NODE, DRIVER, free_counts(partitions, ()),
                       partitions=partitions)


def fixed_node(name: str, configs: Sequence[Config]) -> ClusterNode:
    total: Counter[str] = Counter()
    for config in configs:
        total.update(dict(config))
    return ClusterNode(name, MODEL, "mixed", DRIVER,
                       {mig_resource(p): n for p, n in sorted(total.items()) if n})


def config_name(config: Config) -> str:
    return "+".join(f"{n}x{p}" if n > 1 else p for p, n in reversed(config))


def _sets(devices: list[Partition], node, chosen: list[Partition], start: int):
    """Every set of `devices` one GPU can hold at once, grown in list order (each once)."""
    left = available(node, [d.key for d in chosen])
    for i in range(start, len(devices)):
        if fits(devices[i], left):
            yield from _sets(devices, node, [*chosen, devices[i]], i + 1)
    if not any(fits(d, left) for d in devices if d not in chosen):
        yield chosen  # maximal: no sold slice fits beside them


def gpu_configs(model: str = MODEL) -> list[tuple[Config, tuple[str, ...]]]:
    """(configuration, a witness: the device names of one way to carve it) for each valid,
    undominated configuration of one GPU, the largest slices first."""
    node = partitioned_node(model, "g", 1)
    sold = [d for d in node.devices if d.profile in SOLD]
    found: dict[Config, tuple[str, ...]] = {}
    for chosen in _sets(sold, node, [], 0):
        counts = Counter(d.profile for d in chosen)
        config = tuple((p, counts[p]) for p in SOLD if counts[p])
        found.setdefault(config, tuple(d.key for d in chosen))

    def under(a: Config, b: Config) -> bool:  # b holds all of a, and more
        da, db = dict(a), dict(b)
        return a != b and all(db.get(p, 0) >= n for p, n in da.items())

    kept = [(c, w) for c, w in found.items() if not any(under(c, o) for o in found)]
    return sorted(kept, key=lambda cw: [-dict(cw[0]).get(p, 0) for p in reversed(SOLD)])


@dataclass
class Outcome:
    """One pool's run over the trace: per measured request its start (s) or None."""

    started: dict[int, float] = field(default_factory=dict)
    refused: set[int] = field(default_factory=set)  # never: no node could ever run it
    passes: int = 0
    misplaced: int = 0  # carved on another node than admission named

    def gpu_hours(self, measured: Sequence[Request]) -> float:
        return sum(r.gpus * r.duration for r in measured if r.id in self.started) / 3600

    def waits(self, measured: Sequence[Request], patience: float) -> list[float]:
        """Each measured request's wait, s: its start's, or `patience` if it never started."""
        return [self.started[r.id] - r.arrived if r.id in self.started else patience
                for r in measured]


def p95(values: Sequence[float]) -> float:
    """The nearest-rank 95th percentile (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


@contextmanager
def remembered_overlaps() -> Iterator[None]:
    """partitioned_fit's `overlap`, remembered per pair of devices of a node while inside.

    keep_for asks whether two placements overlap some 10^5 times a simulated hour of
    this pool (every placement of a waiting request's kind against the carved ones
    and the kept ones, every pass), and each answer sums every counter the two
    consume: nine tenths of a run's time. The answer only depends on the two devices
    and their node's counter sets, which never change here, so the same function's
    answers are kept (tests/checks/test_bench_dynamic_mig.py checks them all equal)."""
    known: dict[tuple[str, str, int], bool] = {}
    nodes: list[PartitionedNode] = []  # kept alive, so that id() stays theirs

    def remembered(a: Partition, b: Partition, node: PartitionedNode) -> bool:
        key = (a.key, b.key, id(node))
        if key not in known:
            nodes.append(node)
            known[key] = overlap(a, b, node)
        return known[key]

    partitioned_fit.overlap = remembered  # type: ignore[assignment]
    try:
        yield
    finally:
        partitioned_fit.overlap = overlap  # type: ignore[assignment]


def simulate(nodes: Sequence[ClusterNode], requests: Sequence[Request],
             patience: float) -> Outcome:
    """Serve `requests` (sorted by arrival) on `nodes` through plan_cluster; every request
    counted, the caller picks the measured ones."""
    with remembered_overlaps():
        return _simulate(tuple(nodes), requests, patience)


def _simulate(nodes: tuple[ClusterNode, ...], requests: Sequence[Request],
              patience: float) -> Outcome:
    by_name = {n.name: n for n in nodes}
    out = Outcome()
    events: list[tuple[float, int, int, int]] = []  # (t, order, what, request id)
    for r in requests:
        heapq.heappush(events, (r.arrived, 2, 0, r.id))
    by_id = {r.id: r for r in requests}
    waiting: dict[int, Request] = {}  # arrival order
    holds: dict[int, Hold] = {}
    changed = False  # since the last pass
    while events:
        t, _, what, rid = heapq.heappop(events)
        if what == 0:  # arrives
            waiting[rid] = by_id[rid]
            heapq.heappush(events, (t + patience, 1, 1, rid))
            changed = True
        elif what == 1:  # its patience is up (nothing changes if it started)
            changed |= waiting.pop(rid, None) is not None
        else:  # it ends
            del holds[rid]
            changed = True
        if events and events[0][0] == t:
            continue  # serve once after every event of this instant
        if not (changed and waiting):
            continue
        changed = False
        inventory = ClusterInventory(nodes, tuple(holds.values()))
        plan = plan_cluster([Waiting(i, r.device_request()) for i, r in waiting.items()],
                            inventory)
        out.passes += 1
        for rid_never, _why in plan.never:
            waiting.pop(rid_never)
            out.refused.add(rid_never)
        for start_id, node_name in plan.start:
            request = waiting[start_id]
            hold = _start(request, by_name[node_name], nodes, holds, out)
            if hold is None:
                continue  # nowhere to carve it now: it waits on
            del waiting[start_id]
            holds[start_id] = hold
            out.started[start_id] = t
            heapq.heappush(events, (t + request.duration, 0, 2, start_id))
    return out


def _start(request: Request, node: ClusterNode, nodes: tuple[ClusterNode, ...],
           holds: dict[int, Hold], out: Outcome) -> Hold | None:
    pod = f"lab/r{request.id}"
    if node.partitions is None:
        return Hold(pod, node.name, {request.resource: 1})
    for n in (node, *sorted((m for m in nodes if m is not node), key=lambda m: m.name)):
        if n.partitions is None:
            continue
        allocated = {d for h in holds.values() if h.node == n.name for d in h.devices}
        got = carve(n.partitions, [request.resource], allocated)
        if got:
            if n is not node:
                out.misplaced += 1
            return Hold(pod, n.name, {request.resource: 1}, devices=(got[0].key,))
    return None
