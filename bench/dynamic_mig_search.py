"""bench/dynamic_mig.py's best fixed MIG layout in hindsight: the search. Pure.

A layout gives every GPU of the pool one valid configuration
(dynamic_mig_sim.gpu_configs: 9 for an H200 in the sold profiles). The search
runs the whole trace on each candidate (dynamic_mig_sim.simulate, gpulease's
queue, the device plugin's `mixed` strategy) and keeps the one that started
the most GPU-time (ties: the lower mean wait):

1. every uniform layout (all GPUs the same configuration), exhaustively;
2. then a hill-climb over mixed layouts from the best uniform one: each step
   runs every layout that changes one GPU's configuration (not run before),
   and moves to the best of them if it beats the current one; it stops where
   none does, or when `budget` runs of this step are spent.

A static node offers its GPUs' slices as one count per profile, so layouts
whose nodes have the same counts are the same to the scheduler and to the
queue: each is run once (`node_counts` is the key).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.dynamic_mig_sim import Config, Outcome, config_name, fixed_node, simulate
from bench.dynamic_mig_trace import Request

Layout = tuple[tuple[int, ...], ...]  # per node, each GPU's configuration (an index)


@dataclass
class Candidate:
    layout: Layout
    outcome: Outcome
    gpu_hours: float
    mean_wait_s: float

    @property
    def score(self) -> tuple[float, float]:
        return (round(self.gpu_hours, 6), -self.mean_wait_s)


@dataclass
class Search:
    best: Candidate
    uniform: list[Candidate]  # in configuration order
    evaluations: int  # runs of the hill-climb (the uniform ones not counted)
    steps: int  # moves it made

    @property
    def mixed(self) -> bool:
        return len({g for node in self.best.layout for g in node}) > 1


def node_counts(layout: Layout, configs: Sequence[Config]) -> tuple[tuple[tuple[str, int], ...],
                                                                    ...]:
    out = []
    for node in layout:
        total: Counter[str] = Counter()
        for g in node:
            total.update(dict(configs[g]))
        out.append(tuple(sorted(total.items())))
    return tuple(out)


def describe(layout: Layout, configs: Sequence[Config], names: Sequence[str]) -> str:
    """`uniform <config> on all N GPUs`, or per node its GPUs' configurations."""
    every = {g for node in layout for g in node}
    if len(every) == 1:
        return (f"uniform {config_name(configs[next(iter(every))])} on all "
                f"{sum(map(len, layout))} GPUs")
    parts = []
    for name, node in zip(names, layout, strict=True):
        counted = Counter(node)
        parts.append(f"{name}=[" + ", ".join(
            f"{n}x({config_name(configs[g])})" for g, n in sorted(counted.items())) + "]")
    return "mixed " + " ".join(parts)


def best_fixed(requests: Sequence[Request], measured: Sequence[Request], names: Sequence[str],
               gpus_per_node: int, configs: Sequence[Config], patience: float, budget: int,
               say: Callable[[str], None] = print) -> Search:
    """The best fixed layout of len(names) nodes × gpus_per_node GPUs for `requests`."""
    seen: dict[tuple, Candidate] = {}

    def run(layout: Layout) -> Candidate:
        key = node_counts(layout, configs)
        if key not in seen:
            nodes = [fixed_node(name, [configs[g] for g in node])
                     for name, node in zip(names, layout, strict=True)]
            outcome = simulate(nodes, requests, patience)
            waits = outcome.waits(measured, patience)
            seen[key] = Candidate(layout, outcome, outcome.gpu_hours(measured),
                                  sum(waits) / max(1, len(waits)))
        return seen[key]

    uniform = [run(tuple((c,) * gpus_per_node for _ in names)) for c in range(len(configs))]
    current = max(uniform, key=lambda c: c.score)
    evaluations = steps = 0
    while evaluations < budget:
        fresh: dict[tuple, Layout] = {}  # by node counts: each neighbour once
        for n, node in enumerate(current.layout):
            for g in sorted(set(node)):  # GPUs of one configuration on a node are alike
                for c in range(len(configs)):
                    changed = list(node)
                    changed[changed.index(g)] = c
                    layout = tuple(tuple(sorted(changed)) if m == n else other
                                   for m, other in enumerate(current.layout))
                    key = node_counts(layout, configs)
                    if key not in seen and key not in fresh and len(fresh) < budget - evaluations:
                        fresh[key] = layout
        if not fresh:
            break
        tried = [run(layout) for layout in fresh.values()]
        evaluations += len(tried)
        best = max(tried, key=lambda c: c.score)
        if best.score <= current.score:
            break
        current, steps = best, steps + 1
        say(f"  hill-climb step {steps}: {best.gpu_hours:.1f} GPU-h started, "
            f"{describe(best.layout, configs, names)} ({evaluations} runs)")
    return Search(current, uniform, evaluations, steps)
