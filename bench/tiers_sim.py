"""bench/tiers.py's discrete-event simulation: a lab's week on a 64-GPU cluster, with or
without spot demand beside the same on-demand trace.

The cluster: 8 nodes of 8 H200s, the first four whole cards, the last four in
MIG mode in the balanced layout (per GPU 2 × 1g.18gb, 1 × 2g.35gb,
1 × 3g.71gb), as a declared inventory. Every decision is gpulease's own code:
the queue's pass (gpulease/core/capacity/queue.py `plan`: on-demand in arrival order, then
spot; a waiting request keeps what it could use from later ones) and, with
spot, the preemption pass after it (gpulease/core/capacity/preemption.py `plan_preemptions`
over the running spot servers, as spawners/queueing/spot_preemption.py runs it). A pass
runs at every arrival, end and give-up; a preempted server ends `grace_s` after
it is chosen (billed to then) and what it would still have used is counted as
preempted GPU-time.

The on-demand trace is a lab's: Poisson arrivals at `peak` times the cluster's
capacity on weekdays 08:00–20:00 UTC and `off_peak` times it otherwise, each
pool (whole cards, MIG) offered the same load in GPU compute (a GPU is 7
slices; 1g = 1, 2g = 2, 3g = 3, N cards = 7N); sizes 40 % 1g.18gb, 18 %
2g.35gb, 17 % 3g.71gb (each profile's share of the compute near its share of
the layout), 15 % one card, 5 % two, 3 % four, 2 % eight; durations
exponential, mean 2 h. Spot demand, when on: the same sizes at a steady
`spot_load`, mean 4 h (training runs that can be interrupted). Everyone gives
up after queue_max_wait (30 min, the hub's default). The trace is drawn before
either run, so both see the same on-demand requests.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from random import Random

from gpulease.core.capacity.preemption import SpotHolding, plan_preemptions
from gpulease.core.capacity.queue import Waiting, plan
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory, parse_declared_inventory

HOUR = 3600.0
DAY = 86400.0
QUEUE_MAX_WAIT_S = 30 * 60
SLICES_PER_GPU = 7
NODES, WHOLE_NODES, GPUS_PER_NODE = 8, 4, 8
BALANCED = ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]
# credits an hour: a card, and a slice its compute share of it; spot 40 % of that
CARD_PRICE_UCR, SPOT_SHARE = 3_500_000, 0.4


@dataclass(frozen=True)
class Kind:
    name: str
    mig_profile: str | None
    count: int
    slices: int
    share: float

    @property
    def pool(self) -> int:
        return 1 if self.mig_profile else 0

    @property
    def request(self) -> DeviceRequest:
        return DeviceRequest("H200", self.mig_profile, self.count)

    def price_ucr(self, spot: bool) -> int:
        """Credits an hour, in micro-credits (integer, as billing keeps them)."""
        on_demand = CARD_PRICE_UCR * self.slices // SLICES_PER_GPU
        return int(on_demand * SPOT_SHARE) if spot else on_demand


KINDS = (
    Kind("1g.18gb", "1g.18gb", 1, 1, 0.40), Kind("2g.35gb", "2g.35gb", 1, 2, 0.18),
    Kind("3g.71gb", "3g.71gb", 1, 3, 0.17), Kind("1 GPU", None, 1, 7, 0.15),
    Kind("2 GPUs", None, 2, 14, 0.05), Kind("4 GPUs", None, 4, 28, 0.03),
    Kind("8 GPUs", None, 8, 56, 0.02),
)


def cluster(nodes: int = NODES, whole: int = WHOLE_NODES) -> Inventory:
    """`nodes` nodes of 8 H200s, the first `whole` of them whole cards, the rest MIG."""
    gpu = {"model": "H200", "driver": "580.159"}
    return parse_declared_inventory({"nodes": [
        {"name": f"node-{n:04d}",
         "gpus": [gpu if n < whole else {**gpu, "mig": BALANCED}] * GPUS_PER_NODE}
        for n in range(nodes)]}, "bench/tiers.py")


@dataclass(eq=False)  # one request is itself only: queues remove it by identity
class Request:
    arrived: float
    kind: Kind
    duration: float
    spot: bool
    started: float | None = None
    ended: float | None = None
    devices: tuple[str, ...] = ()
    node: str = ""
    gave_up: bool = False
    deadline: float | None = None  # being preempted: ends then

    @property
    def gpus(self) -> float:
        return self.kind.slices / SLICES_PER_GPU


def _pool_rate(kinds: list[Kind], load: float, mean_duration_s: float) -> float:
    """Requests a second that offer `load` × a pool's compute (32 GPUs, 224 slices)."""
    mean_slices = sum(k.share * k.slices for k in kinds) / sum(k.share for k in kinds)
    return (load * (NODES - WHOLE_NODES) * GPUS_PER_NODE * SLICES_PER_GPU
            / (mean_slices * mean_duration_s))


def _working_hours(t: float) -> bool:
    day, hour = divmod(t, DAY)
    return int(day) % 7 < 5 and 8 * HOUR <= hour < 20 * HOUR


def trace(seed: int, days: float, peak: float, off_peak: float, spot_load: float,
          warmup_s: float) -> tuple[list[Request], list[Request]]:
    """The on-demand and the spot requests arriving in warm-up plus `days` days."""
    end = warmup_s + days * DAY
    on_demand, spot = [], []
    for pool in (0, 1):
        kinds = [k for k in KINDS if k.pool == pool]
        weights = [k.share for k in kinds]
        rng = Random(seed * 1_000_003 + pool)
        top = _pool_rate(kinds, peak, 2 * HOUR)
        t = 0.0
        while (t := t + rng.expovariate(top)) < end:  # thinned to the hour's load
            accept = rng.random()
            if accept * peak < (peak if _working_hours(t) else off_peak):
                kind = rng.choices(kinds, weights)[0]
                on_demand.append(Request(t, kind, rng.expovariate(1 / (2 * HOUR)), False))
        rng = Random(seed * 1_000_003 + 10 + pool)
        rate, t = _pool_rate(kinds, spot_load, 4 * HOUR), 0.0
        while spot_load > 0 and (t := t + rng.expovariate(rate)) < end:
            kind = rng.choices(kinds, weights)[0]
            spot.append(Request(t, kind, rng.expovariate(1 / (4 * HOUR)), True))
    return sorted(on_demand, key=lambda r: r.arrived), sorted(spot, key=lambda r: r.arrived)


@dataclass
class Outcome:
    measured_s: float
    gpu_s: float = 0.0  # GPU-time in use over the measured window
    on_demand_waits: list[float] = field(default_factory=list)  # gave up: queue_max_wait
    on_demand_gave_up: int = 0
    spot_started: int = 0
    spot_gave_up: int = 0
    preempted: int = 0
    preempted_gpu_s: float = 0.0  # what preempted servers would still have used
    withdrawn: int = 0  # preemptions taken back: the start they were for gave up
    revenue_ucr: dict[str, int] = field(default_factory=lambda: {"on-demand": 0, "spot": 0})
    passes: int = 0


def simulate(inventory: Inventory, requests: list[Request], grace_s: float, warmup_s: float,
             days: float) -> Outcome:
    """Run the requests (both tiers, by arrival) through gpulease's queue and preemption."""
    measure_from, measure_to = warmup_s, warmup_s + days * DAY
    out = Outcome(measure_to - measure_from)
    events: list[tuple[float, int, str, Request]] = []
    seq = 0

    def push(t: float, what: str, request: Request) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, what, request))

    for request in requests:
        push(request.arrived, "arrive", request)
    waiting: list[Request] = []
    running: dict[int, Request] = {}
    held: set[str] = set()
    last, busy = 0.0, 0.0  # GPUs in use since `last`

    def measured(request: Request) -> bool:
        return measure_from <= request.arrived < measure_to

    def finish(request: Request, t: float) -> None:
        nonlocal busy
        del running[id(request)]
        held.difference_update(request.devices)
        busy -= request.gpus
        request.ended = t
        billed = request.kind.price_ucr(request.spot) * (t - request.started) / HOUR
        if measure_from <= request.started < measure_to:
            out.revenue_ucr["spot" if request.spot else "on-demand"] += int(billed)

    def serve(t: float) -> None:
        nonlocal busy
        out.passes += 1
        queue = [Waiting(r, r.kind.request, r.spot) for r in waiting]
        decision = plan(queue, inventory, held)
        for request, placement in decision.start:
            waiting.remove(request)
            request.started, request.devices = t, placement.uuids
            request.node = placement.node
            assert held.isdisjoint(placement.uuids), "a device handed out twice"
            held.update(placement.uuids)
            running[id(request)] = request
            busy += request.gpus
            push(t + request.duration, "end", request)
            if measured(request):
                if request.spot:
                    out.spot_started += 1
                else:
                    out.on_demand_waits.append(t - request.arrived)
        on_demand = [(r, r.kind.request) for r in decision.waiting if not r.spot]
        leaving = {id(r): frozenset(r.devices) for r in running.values()
                   if r.deadline is not None and r.deadline > t}
        if not on_demand and not leaving:
            return
        spot = [SpotHolding(id(r), r.node, frozenset(r.devices), r.started)
                for r in running.values() if r.spot and r.deadline is None]
        coming = set().union(*leaving.values()) if leaving else set()
        decided = plan_preemptions(on_demand, inventory, held - coming, spot, leaving)
        for key in decided.unneeded:  # the start it was for gave up: taken back
            running[key].deadline = None
            out.withdrawn += 1
        for _, chosen in decided.chosen:
            for key in chosen.victims:
                victim = running[key]
                assert victim.spot and victim.deadline is None, "preempted twice or on demand"
                victim.deadline = t + grace_s
                push(victim.deadline, "preempted", victim)

    while events:
        t, _, what, request = heapq.heappop(events)
        low, high = max(last, measure_from), min(t, measure_to)
        if high > low:
            out.gpu_s += busy * (high - low)
        last = t
        if what == "arrive":
            waiting.append(request)
            push(t + QUEUE_MAX_WAIT_S, "give up", request)
        elif what == "give up":
            if request.started is not None:
                continue
            waiting.remove(request)
            request.gave_up = True
            if measured(request):
                if request.spot:
                    out.spot_gave_up += 1
                else:
                    out.on_demand_gave_up += 1
                    out.on_demand_waits.append(QUEUE_MAX_WAIT_S)
        elif what == "end":
            if request.ended is not None:
                continue  # preempted before its end
            finish(request, t)
        else:  # a preempted server's grace period is up
            if request.ended is not None or request.deadline != t:
                continue  # it ended on its own within the grace period, or was taken back
            left = request.started + request.duration - t
            finish(request, t)
            if measure_from <= t < measure_to:
                out.preempted += 1
                out.preempted_gpu_s += left * request.gpus
        serve(t)
    return out
