"""bench/placement.py's discrete-event simulation: the cluster, gpulease's queue, one policy.

The cluster: NODES nodes of 8 H200s (224 CPUs, 2 TiB, 110 pods), the first
half whole cards (nvidia.com/gpu 8), the second half MIG in the balanced
layout under the mixed strategy (per GPU 2 × 1g.18gb, 1 × 2g.35gb,
1 × 3g.71gb: mig-1g.18gb 16, mig-2g.35gb 8, mig-3g.71gb 8 a node and no
nvidia.com/gpu); that order is the scheduler's node list (by name).

Where a pod goes is bench/scheduler_model.py's decision, computed from an
index instead of node by node: a node's state is its used count of each of
its pool's resources (cpu and memory follow, a GPU's share per pod), every
request kind scores a state the same way, so per kind the feasible nodes are
kept in sorted lists by score (their positions in the node list). A decision
is the highest score level with a node in the search window (kube-scheduler's
numFeasibleNodesToFind from nextStartNodeIndex, found by bisection), a tie
broken with the same random draw, over the same scan order, as
scheduler_model.schedule; tests/unit/spawners/kube/test_scheduler_model.py checks the two agree
decision by decision.

gpulease's queue in front, the same for every policy, as
gpulease/core/capacity/cluster_queue.py plan_cluster decides (with
gpulease/core/capacity/cluster_fit.py fit and cluster_offer.py nodes_for):
oldest first per kind (a MIG profile; whole cards of the model); a waiting
request keeps every node that could ever run it from later requests of its
kind, and for whole cards every node can run each size, so that queue is
strictly FIFO (an 8-GPU head is not overtaken); other kinds pass. A request
fits when some node has enough free of its resource (cpu and memory never run
out here: a full node's pods ask 192 of 224 CPUs), so an admitted pod is
always bound. The queue is served when a pod ends and when a waiting request
gives up (queue_max_wait, 30 min, the hub's default in
hub/config/app_options.py). No queue length cap (the hub's queue_max_length,
500 by default, is not modelled).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from random import Random

from bench.scheduler_model import (
    FIRST_FIT,
    NodeState,
    Policy,
    node_score,
    num_feasible_nodes_to_find,
)

GIB = 1 << 30
HOUR = 3600.0
SLICES_PER_GPU = 7  # compute slices: 2 × 1g + 2g + 3g
GPUS_PER_NODE = 8
NODE_ALLOCATABLE = {"cpu": 224_000, "memory": 2048 * GIB, "pods": 110}
CPU_PER_GPU_M = 24_000
MEMORY_PER_GPU = 224 * GIB
MIG_PER_NODE = {"nvidia.com/mig-1g.18gb": 16, "nvidia.com/mig-2g.35gb": 8,
                "nvidia.com/mig-3g.71gb": 8}
WHOLE = "nvidia.com/gpu"
QUEUE_MAX_WAIT_S = 30 * 60
MEAN_DURATION_S = 2 * HOUR
LOAD = 1.2


@dataclass(frozen=True)
class Kind:
    """A request size: what its pod asks for, and its share of requests."""

    name: str
    pool: int  # 0 whole cards, 1 MIG
    resource: str
    count: int
    slices: int  # GPU compute, 7 a GPU
    share: float
    queue: str  # plan_cluster's kind: the MIG profile, or whole cards

    @property
    def pod(self) -> dict[str, int]:
        """A GPU's share of cpu and memory per 7 slices (as bench/placement_real.py asks)."""
        return {"cpu": CPU_PER_GPU_M * self.slices // SLICES_PER_GPU,
                "memory": MEMORY_PER_GPU * self.slices // SLICES_PER_GPU,
                self.resource: self.count}


KINDS = (
    Kind("1g.18gb", 1, "nvidia.com/mig-1g.18gb", 1, 1, 0.50, "1g.18gb"),
    Kind("2g.35gb", 1, "nvidia.com/mig-2g.35gb", 1, 2, 0.15, "2g.35gb"),
    Kind("3g.71gb", 1, "nvidia.com/mig-3g.71gb", 1, 3, 0.10, "3g.71gb"),
    Kind("1 GPU", 0, WHOLE, 1, 7, 0.15, "whole"),
    Kind("2 GPUs", 0, WHOLE, 2, 14, 0.05, "whole"),
    Kind("4 GPUs", 0, WHOLE, 4, 28, 0.03, "whole"),
    Kind("8 GPUs", 0, WHOLE, 8, 56, 0.02, "whole"),
)
POOLS = ("whole cards", "MIG")
POOL_RESOURCES = ((WHOLE,), tuple(MIG_PER_NODE))
POOL_CAPACITY = ((GPUS_PER_NODE,), tuple(MIG_PER_NODE.values()))
MIG_PROFILES = [k.name for k in KINDS if k.pool == 1]


# What a pod asks per device of each resource (every size's pod is a multiple of it).
PER_DEVICE = {k.resource: (k.pod["cpu"], k.pod["memory"]) for k in KINDS if k.count == 1}


def state_node(pool: int, used: tuple, name: str = "node") -> NodeState:
    """A node of the pool with `used` of each of its resources in use, as scheduler_model
    sees it: allocatable, and its pods' requests (a GPU's share of cpu and memory each)."""
    requested = dict(zip(POOL_RESOURCES[pool], used, strict=True))
    devices = list(requested.items())
    requested["cpu"] = sum(PER_DEVICE[r][0] * u for r, u in devices)
    requested["memory"] = sum(PER_DEVICE[r][1] * u for r, u in devices)
    allocatable = {**NODE_ALLOCATABLE,
                   **dict(zip(POOL_RESOURCES[pool], POOL_CAPACITY[pool], strict=True))}
    return NodeState(name, allocatable, requested, sum(used))  # at most a pod per device


def pool_kinds(pool: int) -> list[int]:
    return [i for i, k in enumerate(KINDS) if k.pool == pool]


def arrival_rate(pool: int, pool_nodes: int, load: float = LOAD) -> float:
    """Requests a second: rate × mean duration × mean size = load × capacity (slices)."""
    kinds = [KINDS[i] for i in pool_kinds(pool)]
    mean_size = sum(k.share * k.slices for k in kinds) / sum(k.share for k in kinds)
    return load * pool_nodes * GPUS_PER_NODE * SLICES_PER_GPU / (MEAN_DURATION_S * mean_size)


class Engine:
    """The cluster's nodes as one policy's scheduler sees them, indexed by score per kind."""

    def __init__(self, policy: Policy, nodes: int, rng: Random) -> None:
        self.policy, self.rng, self.n = policy, rng, nodes
        self.first_fit = policy.strategy == FIRST_FIT
        self.want = num_feasible_nodes_to_find(policy.percentage_of_nodes_to_score, nodes)
        self.whole_nodes = nodes // 2
        self.pool_of = [0 if p < self.whole_nodes else 1 for p in range(nodes)]
        self.state = [(0,) * len(POOL_RESOURCES[pool]) for pool in self.pool_of]
        self.slot = [POOL_RESOURCES[k.pool].index(k.resource) for k in KINDS]
        self.pool_kinds = [pool_kinds(0), pool_kinds(1)]
        self.values: list[dict[tuple, int | None]] = [{} for _ in KINDS]
        self.feasible: list[list[int]] = [[] for _ in KINDS]
        self.levels: list[dict[int, list[int]]] = [{} for _ in KINDS]
        self.nonempty: list[list[int]] = [[] for _ in KINDS]  # score levels with a node, ascending
        self.start = 0  # nextStartNodeIndex
        self.busy = [0, 0]  # slices in use per pool
        self.whole_free = [self.whole_nodes, nodes - self.whole_nodes]  # nodes with nothing in use
        for pos in range(nodes):
            self._enter(pos, self.state[pos])

    def node_state(self, pos: int) -> NodeState:
        return state_node(self.pool_of[pos], self.state[pos], f"node-{pos:04d}")

    def _value(self, k: int, state: tuple) -> int | None:
        """The kind's score on a node in this state, None where it does not fit."""
        cache = self.values[k]
        if state not in cache:
            kind = KINDS[k]
            free = POOL_CAPACITY[kind.pool][self.slot[k]] - state[self.slot[k]]
            if free < kind.count:
                cache[state] = None
            else:
                cache[state] = node_score(self.policy, kind.pod, state_node(kind.pool, state))
        return cache[state]

    def _enter(self, pos: int, state: tuple) -> None:
        for k in self.pool_kinds[self.pool_of[pos]]:
            value = self._value(k, state)
            if value is not None:
                self._add(k, pos, value)
                insort(self.feasible[k], pos)

    def _add(self, k: int, pos: int, value: int) -> None:
        level = self.levels[k].setdefault(value, [])
        if not level:
            insort(self.nonempty[k], value)
        insort(level, pos)

    def _drop(self, k: int, pos: int, value: int) -> None:
        level = self.levels[k][value]
        del level[bisect_left(level, pos)]
        if not level:
            del self.nonempty[k][bisect_left(self.nonempty[k], value)]

    def _move(self, pos: int, new: tuple) -> None:
        old, self.state[pos] = self.state[pos], new
        for k in self.pool_kinds[self.pool_of[pos]]:
            was, now = self._value(k, old), self._value(k, new)
            if was == now:
                continue
            feasible = self.feasible[k]
            if was is not None:
                self._drop(k, pos, was)
                if now is None:
                    del feasible[bisect_left(feasible, pos)]
            if now is not None:
                self._add(k, pos, now)
                if was is None:
                    insort(feasible, pos)

    def fits(self, k: int) -> bool:
        """gpulease's admission: some node has room for the kind (cluster_fit.fit)."""
        return bool(self.feasible[k])

    def choose(self, k: int) -> int | None:
        """The node this policy's scheduler binds a pod of kind k to (scheduler_model.schedule)."""
        feasible = self.feasible[k]
        count = len(feasible)
        if not count:
            return None
        if self.first_fit:
            return feasible[0]
        n, start = self.n, self.start
        span = n
        if count > self.want:  # the search stops at the (want + 1)th feasible node
            end = feasible[(bisect_left(feasible, start) + self.want) % count]
            span = (end - start) % n
            self.start = end
        if count == 1:
            return feasible[0]
        high = start + span
        levels = self.levels[k]
        for value in reversed(self.nonempty[k]):
            level = levels[value]
            first = bisect_left(level, start)
            before_end = len(level) - first if high >= n else bisect_left(level, high) - first
            wrapped = bisect_left(level, high - n) if high > n else 0
            found = before_end + wrapped
            if found:
                r = self.rng.randrange(found)  # in scan order, as schedule draws
                return level[first + r] if r < before_end else level[r - before_end]
        raise AssertionError("a feasible node with no score level")

    def bind(self, pos: int, k: int, sign: int = 1) -> None:
        kind = KINDS[k]
        used = list(self.state[pos])
        if not any(used):
            self.whole_free[kind.pool] -= 1
        used[self.slot[k]] += sign * kind.count
        self._move(pos, tuple(used))
        self.busy[kind.pool] += sign * kind.slices
        if not any(used):
            self.whole_free[kind.pool] += 1


@dataclass
class KindStats:
    requests: int = 0
    at_once: int = 0
    started: int = 0
    gave_up: int = 0
    waits: list[float] = field(default_factory=list)  # seconds, of those that queued and started
    offered_slice_s: float = 0.0
    served_slice_s: float = 0.0


@dataclass
class Result:
    policy: Policy
    nodes: int
    measured_s: float
    kinds: list[KindStats]
    busy_slice_s: list[float]  # per pool, over the measured time
    whole_free_node_s: list[float]
    decisions: int = 0
    overtaken: int = 0  # starts ahead of an earlier request of their kind still waiting: 0


def simulate(policy: Policy, nodes: int, days: float, seed: int, load: float = LOAD,
             warmup_s: float = 2 * MEAN_DURATION_S, engine_class: type[Engine] = Engine) -> Result:
    """One policy over the seeded request stream (the same stream for every policy)."""
    engine = engine_class(policy, nodes, Random(seed * 1_000_003 + 7))
    pool_nodes = [engine.whole_nodes, nodes - engine.whole_nodes]
    streams = [Random(seed * 1_000_003 + pool) for pool in (0, 1)]
    rates = [arrival_rate(pool, pool_nodes[pool], load) for pool in (0, 1)]
    choices = []
    for pool in (0, 1):
        kinds = pool_kinds(pool)
        total, acc = sum(KINDS[k].share for k in kinds), 0.0
        choices.append([(acc := acc + KINDS[k].share / total, k) for k in kinds])
    measure_from, measure_to = warmup_s, warmup_s + days * 86400
    horizon = measure_to + QUEUE_MAX_WAIT_S
    stats = [KindStats() for _ in KINDS]
    result = Result(policy, nodes, measure_to - measure_from, stats, [0.0, 0.0], [0.0, 0.0])
    queues: dict[str, deque] = {k.queue: deque() for k in KINDS}
    newest_started = dict.fromkeys(queues, 0.0)  # per kind, the latest arrival started
    events: list[tuple] = []
    seq = 0
    last = 0.0

    def arrive(pool: int, t: float) -> None:
        nonlocal seq
        rng = streams[pool]
        t += rng.expovariate(rates[pool])
        u = rng.random()
        k = next((k for edge, k in choices[pool] if u < edge), choices[pool][-1][1])
        seq += 1
        heapq.heappush(events, (t, seq, 2, [t, k, rng.expovariate(1 / MEAN_DURATION_S), 0]))

    def start(request: list, t: float) -> None:
        nonlocal seq
        arrived, k, duration, _ = request
        request[3] = 1
        queue = KINDS[k].queue
        if arrived < newest_started[queue]:
            result.overtaken += 1
        newest_started[queue] = max(newest_started[queue], arrived)
        pos = engine.choose(k)
        engine.bind(pos, k)
        result.decisions += 1
        seq += 1
        heapq.heappush(events, (t + duration, seq, 0, (pos, k)))
        if measure_from <= arrived < measure_to:
            s = stats[k]
            s.started += 1
            s.served_slice_s += KINDS[k].slices * duration
            if t > arrived:
                s.waits.append(t - arrived)
            else:
                s.at_once += 1

    def serve(queue: deque, t: float) -> None:
        while queue and engine.fits(queue[0][1]):
            start(queue.popleft(), t)

    for pool in (0, 1):
        arrive(pool, 0.0)
    while events:
        t, _, what, payload = heapq.heappop(events)
        if t > horizon:
            break
        low, high = max(last, measure_from), min(t, measure_to)
        if high > low:
            for pool in (0, 1):
                result.busy_slice_s[pool] += engine.busy[pool] * (high - low)
                result.whole_free_node_s[pool] += engine.whole_free[pool] * (high - low)
        last = t
        if what == 0:  # a pod ends
            pos, k = payload
            engine.bind(pos, k, -1)
            serve(queues[KINDS[k].queue], t)
        elif what == 1:  # a waiting request's queue_max_wait is up
            if payload[3] == 0:
                queue = queues[KINDS[payload[1]].queue]
                assert queue[0] is payload  # FIFO per kind, one max wait: the oldest goes first
                queue.popleft()
                payload[3] = 2
                if measure_from <= payload[0] < measure_to:
                    stats[payload[1]].gave_up += 1
                serve(queue, t)
        else:  # a request arrives
            k = payload[1]
            kind = KINDS[k]
            arrive(kind.pool, t)
            if measure_from <= t < measure_to:
                stats[k].requests += 1
                stats[k].offered_slice_s += kind.slices * payload[2]
            queue = queues[kind.queue]
            if not queue and engine.fits(k):
                start(payload, t)
            else:
                queue.append(payload)
                seq += 1
                heapq.heappush(events, (t + QUEUE_MAX_WAIT_S, seq, 1, payload))
    return result
