"""placement_acceptance_ratio: GPU packing by kube-scheduler, simulated on a large cluster.

    .venv/bin/python bench/placement.py [--nodes 1000] [--days 7] [--seed 42] [--quick]

A seeded discrete-event simulation (bench/placement_sim.py) of 1,000 nodes of
8 H200s, 500 whole cards and 500 in MIG mode (per GPU 2 × 1g.18gb,
1 × 2g.35gb, 1 × 3g.71gb), offered the same requests under three policies:

- gpulease: the packing scheduler gpulease configures, read from
  spawners/kube/scheduler_config.py `scheduler_configuration` for the three MIG
  profiles (MostAllocated over nvidia.com/gpu and each MIG resource at weight
  10, cpu and memory 1; BalancedAllocation off; every feasible node scored);
- default: kube-scheduler's default profile (LeastAllocated over cpu and
  memory, plus BalancedAllocation; GPUs are not among its scored resources;
  the adaptive share of nodes searched, 420 of 1,000, from a rotating index);
- first-fit: the first feasible node in the node list's order.

Scores are bench/scheduler_model.py's, which follows kube-scheduler v1.36.3's
source (cited there). Requests: 50 % 1g.18gb, 15 % 2g.35gb, 10 % 3g.71gb,
15 % one GPU, 5 % two, 3 % four, 2 % eight, each pod asking a GPU's share of
cpu and memory (24 CPUs and 224 GiB a card, 1/7 of that a compute slice);
Poisson arrivals per pool at 1.2 × the pool's capacity in GPU compute (a GPU
is 7 slices; 1g = 1, 2g = 2, 3g = 3, N cards = 7N); exponential durations of
mean 2 h; gpulease's queue in front, the same for every policy (plan_cluster:
oldest first per kind, a waiting request keeps every node that could run it
from later ones of its kind, so whole cards are strictly FIFO), giving up after
queue_max_wait (30 min), no length cap. Warm-up of 4 h (twice the mean
duration), then the requests arriving in the next DAYS days are measured.

Acceptance, the headline: the share of offered GPU-time (GPUs × duration,
a slice 1/7 GPU, over the measured requests) whose request started (left the
queue within queue_max_wait). It is what the cluster's capacity delivers and
what the capacity bound is in: served GPU-time ≤ capacity × time, so per pool
the share is at most min(1, capacity / offered); summed over pools, that is
the bound. `placement_acceptance_ratio` = gpulease's acceptance / default's
(target ≥ 1.10), `placement_vs_bound` = gpulease's / the bound. Also printed:
the share of requests started without queueing (never waited), per size the
share started, mean and p95 wait of those started, GPU-hours served, and per
pool the utilisation and the mean number of nodes wholly free.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from bench.placement_sim import (  # noqa: E402
    GPUS_PER_NODE,
    HOUR,
    KINDS,
    LOAD,
    MEAN_DURATION_S,
    MIG_PER_NODE,
    MIG_PROFILES,
    NODE_ALLOCATABLE,
    POOLS,
    QUEUE_MAX_WAIT_S,
    SLICES_PER_GPU,
    Result,
    arrival_rate,
    simulate,
)
from bench.scheduler_model import (  # noqa: E402
    FIRST_FIT,
    Policy,
    default_policy,
    first_fit_policy,
    num_feasible_nodes_to_find,
    policy_from_config,
)
from gpulease.spawners.kube.scheduler_config import scheduler_configuration  # noqa: E402

GIB = 1 << 30
TARGET_RATIO = 1.10


def gpu_h(slice_s: float) -> float:
    return slice_s / SLICES_PER_GPU / HOUR


def describe(policy: Policy, nodes: int) -> str:
    if policy.strategy == FIRST_FIT:
        return "the first feasible node in the node list's order"
    fit = " ".join(f"{r.name}:{r.weight}" for r in policy.fit_resources)
    text = f"NodeResourcesFit {policy.strategy} {fit} (plugin weight {policy.fit_weight})"
    if policy.balanced_resources:
        text += " + BalancedAllocation " + " ".join(
            f"{r.name}:{r.weight}" for r in policy.balanced_resources)
    else:
        text += "; BalancedAllocation off"
    want = num_feasible_nodes_to_find(policy.percentage_of_nodes_to_score, nodes)
    share = policy.percentage_of_nodes_to_score or "adaptive"
    return f"{text}; percentageOfNodesToScore {share}: {want} of {nodes} nodes searched"


def p95(waits: list[float], zeros: int) -> float:
    """Nearest-rank p95 of the waits of the started requests (`zeros` started at once)."""
    total = len(waits) + zeros
    rank = math.ceil(0.95 * total) - 1
    return 0.0 if rank < zeros else sorted(waits)[rank - zeros]


def pools(result: Result) -> list[dict]:
    """Per pool and for the cluster: offered and served GPU-h, the bound, utilisation."""
    rows = []
    whole_nodes = result.nodes // 2
    for pool, name in enumerate(POOLS):
        kinds = [s for k, s in zip(KINDS, result.kinds, strict=True) if k.pool == pool]
        nodes = whole_nodes if pool == 0 else result.nodes - whole_nodes
        capacity = nodes * GPUS_PER_NODE * SLICES_PER_GPU * result.measured_s
        offered = sum(s.offered_slice_s for s in kinds)
        rows.append({"pool": name, "offered": offered, "capacity": capacity,
                     "served": sum(s.served_slice_s for s in kinds),
                     "bound": min(offered, capacity),
                     "utilisation": result.busy_slice_s[pool] / capacity,
                     "whole_free": result.whole_free_node_s[pool] / result.measured_s,
                     "requests": sum(s.requests for s in kinds),
                     "at_once": sum(s.at_once for s in kinds)})
    rows.append({"pool": "cluster", **{key: sum(r[key] for r in rows) for key in
                 ("offered", "capacity", "served", "bound", "requests", "at_once")},
                 "utilisation": sum(result.busy_slice_s) / sum(r["capacity"] for r in rows),
                 "whole_free": sum(r["whole_free"] for r in rows)})
    return rows


def report(result: Result, elapsed: float) -> dict:
    print(f"\n== {result.policy.name} ({elapsed:.0f} s, {result.decisions} placements) ==")
    print(f"{'size':9}{'requests':>10}{'at once':>9}{'started':>9}{'gave up':>9}"
          f"{'wait mean':>11}{'wait p95':>10}{'offered GPU-h':>15}{'served GPU-h':>14}")
    for kind, s in zip(KINDS, result.kinds, strict=True):
        n = max(s.requests, 1)
        mean = sum(s.waits) / max(s.started, 1) / 60
        print(f"{kind.name:9}{s.requests:>10}{s.at_once / n:>9.1%}{s.started / n:>9.1%}"
              f"{s.gave_up:>9}{mean:>9.1f} m{p95(s.waits, s.at_once) / 60:>8.1f} m"
              f"{gpu_h(s.offered_slice_s):>15.0f}{gpu_h(s.served_slice_s):>14.0f}")
    print(f"{'pool':12}{'offered GPU-h':>14}{'served GPU-h':>13}{'acceptance':>11}{'bound':>8}"
          f"{'at once':>9}{'utilisation':>12}{'whole nodes free':>17}")
    rows = pools(result)
    for r in rows:
        print(f"{r['pool']:12}{gpu_h(r['offered']):>14.0f}{gpu_h(r['served']):>13.0f}"
              f"{r['served'] / r['offered']:>11.4f}{r['bound'] / r['offered']:>8.4f}"
              f"{r['at_once'] / r['requests']:>9.2%}{r['utilisation']:>12.2%}"
              f"{r['whole_free']:>17.2f}")
    return {r["pool"]: r for r in rows}


FIGURES = ("placement_acceptance_gpulease", "placement_at_once_gpulease",
           "placement_whole_card_acceptance_gpulease", "placement_whole_nodes_free_gpulease",
           "placement_acceptance_default", "placement_at_once_default",
           "placement_whole_card_acceptance_default", "placement_whole_nodes_free_default",
           "placement_acceptance_first_fit", "placement_at_once_first_fit",
           "placement_whole_card_acceptance_first_fit", "placement_whole_nodes_free_first_fit",
           "placement_bound", "placement_whole_card_acceptance_ratio", "placement_at_once_ratio",
           "placement_acceptance_ratio", "placement_vs_bound")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="half whole cards, half MIG")
    parser.add_argument("--days", type=float, default=7.0, help="measured time after warm-up")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--load", type=float, default=LOAD,
                        help="offered load per pool, a multiple of its capacity")
    parser.add_argument("--quick", action="store_true", help="100 nodes, 1 day")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.days = 100, 1.0
    packing = policy_from_config(scheduler_configuration(MIG_PROFILES), "gpulease")
    policies = [packing, default_policy(), first_fit_policy()]
    whole = args.nodes // 2
    mig = " + ".join(f"{n // GPUS_PER_NODE}x{r.removeprefix('nvidia.com/mig-')}"
                     for r, n in MIG_PER_NODE.items())
    print(f"placement: {args.nodes} nodes x {GPUS_PER_NODE} H200; {whole} whole cards "
          f"(nvidia.com/gpu {GPUS_PER_NODE}), {args.nodes - whole} MIG (mixed, per GPU {mig}: "
          + ", ".join(f"{r} {n}" for r, n in MIG_PER_NODE.items()) + "); a node "
          f"{NODE_ALLOCATABLE['cpu'] // 1000} CPU, {NODE_ALLOCATABLE['memory'] // GIB} GiB, "
          f"{NODE_ALLOCATABLE['pods']} pods")
    print("requests: " + "; ".join(
        f"{k.name} {k.share:.0%} ({k.pod['cpu']}m CPU, {k.pod['memory'] / GIB:.0f} GiB)"
        for k in KINDS))
    rates = [arrival_rate(pool, n, args.load) * HOUR for pool, n in enumerate(
        (whole, args.nodes - whole))]
    print(f"arrivals: Poisson per pool at {args.load}x capacity in GPU compute (whole cards "
          f"{rates[0]:.1f}/h, MIG {rates[1]:.1f}/h); durations exponential, mean "
          f"{MEAN_DURATION_S / HOUR:.0f} h; warm-up "
          f"{2 * MEAN_DURATION_S / HOUR:.0f} h, then requests arriving in {args.days:g} d measured;"
          f" seed {args.seed}")
    print(f"queue: gpulease's plan_cluster rule, oldest first per kind (whole cards strictly "
          f"FIFO), gives up after queue_max_wait {QUEUE_MAX_WAIT_S // 60} min; no length cap")
    print("acceptance: the share of offered GPU-time (GPUs x duration; a slice 1/7 GPU) whose "
          "request started within queue_max_wait; bound: min(1, capacity / offered) per pool")
    for policy in policies:
        print(f"policy {policy.name}: {describe(policy, args.nodes)}")
    rows = {}
    for policy in policies:
        started = time.perf_counter()
        result = simulate(policy, args.nodes, args.days, args.seed, args.load)
        rows[policy.name] = report(result, time.perf_counter() - started)
    acceptance = {name: r["cluster"]["served"] / r["cluster"]["offered"]
                  for name, r in rows.items()}
    at_once = {name: r["cluster"]["at_once"] / r["cluster"]["requests"]
               for name, r in rows.items()}
    whole_card = {name: r["whole cards"]["served"] / r["whole cards"]["offered"]
                  for name, r in rows.items()}
    bound = rows["gpulease"]["cluster"]["bound"] / rows["gpulease"]["cluster"]["offered"]
    ratio = acceptance["gpulease"] / acceptance["default"]
    print()
    for name in rows:
        key = name.replace("-", "_")
        figure(f"placement_acceptance_{key}", acceptance[name], 4)
        figure(f"placement_at_once_{key}", at_once[name], 4)
        figure(f"placement_whole_card_acceptance_{key}", whole_card[name], 4)
        figure(f"placement_whole_nodes_free_{key}", rows[name]["whole cards"]["whole_free"], 2)
    figure("placement_bound", bound, 4)
    figure("placement_whole_card_acceptance_ratio", whole_card["gpulease"] / whole_card["default"])
    figure("placement_at_once_ratio", at_once["gpulease"] / at_once["default"])
    figure("placement_acceptance_ratio", ratio)
    target("placement_acceptance_ratio", f">= {TARGET_RATIO}")
    figure("placement_vs_bound", acceptance["gpulease"] / bound)


if __name__ == "__main__":
    main()
