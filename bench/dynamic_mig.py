"""dynamic_mig_acceptance_ratio: DynamicMIG GPUs against the best fixed MIG layout in hindsight.

    .venv/bin/python bench/dynamic_mig.py [--days 7] [--seed 46] [--budget 400]
                                          [--real-hours 24] [--real-scale 360] [--no-real]
                                          [--quick]

A lab's pool of 8 H200s (2 nodes × 4, as two 4-GPU servers) under a simulated
week of MIG demand (bench/dynamic_mig_trace.py: students' 1g.18gb and 2g.35gb
notebooks of 1-3 h in weekday daytime, fine-tuners' 3g.71gb and 7g.141gb runs
of 4-12 h in evenings, nights and weekends, the mix shifting through the week,
offered load 1.05 of the pool, patience 2 h), run through gpulease's queue and
the real allocation rule (bench/dynamic_mig_sim.py), on:

- dynamic: every GPU in NVIDIA's DynamicMIG mode: a slice is carved where
  kube-scheduler's first fit puts it when its request starts;
- fixed: the best fixed layout for this very week, chosen in hindsight
  (bench/dynamic_mig_search.py): every uniform layout of the 9 valid
  configurations of an H200 in the sold profiles, then a hill-climb over
  mixed layouts (one GPU's configuration changed at a time) from the best.

Measured over the requests arriving in the week (a warm-up day before):
GPU-time started (compute slices / 7 × duration, of every request that
started) and waits (a request that never started, having given up or been
refused, counts its patience). Figures:

- `dynamic_mig_acceptance_ratio`: GPU-time started, dynamic over fixed (target
  ≥ 1.10);
- `dynamic_mig_wait_p95_ratio`: p95 wait, dynamic over fixed (target ≤ 1.0):
  1.0 where both are 0, nan where only the fixed one is; where more than 5 %
  of requests never start in both pools both p95s are the patience, and the
  ratio is 1.0 by construction, so the mean wait's ratio is printed too;
- the absolute GPU-hours, p95 and mean waits and the share never started of
  both; which layout won (`dynamic_mig_fixed_layout: ...`, a text line, and
  `dynamic_mig_fixed_layout_mixed`: 1 mixed, 0 uniform);
- `dynamic_mig_real_scheduler_ratio`: GPU-time started, dynamic over fixed,
  of a reduced trace replayed on the real kube-scheduler (target ≥ 1.05;
  bench/dynamic_mig_real.py): 2 H200s on one node per pool, a weekday from
  08:00 for REAL_HOURS hours compressed REAL_SCALE times (1 h = 10 s), its own
  best fixed layout in hindsight from the simulation, whose ratio for the same
  reduced trace is printed next to it (`dynamic_mig_real_sim_ratio`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dynamic_mig_search import Search, best_fixed, describe, node_counts  # noqa: E402
from bench.dynamic_mig_sim import (  # noqa: E402
    Config,
    Outcome,
    config_name,
    dynamic_node,
    gpu_configs,
    p95,
    simulate,
)
from bench.dynamic_mig_trace import (  # noqa: E402
    HOUR,
    PATIENCE_S,
    SOLD,
    Request,
    offered_share,
    week_trace,
)
from bench.figures import figure, target  # noqa: E402

NODES, GPUS_PER_NODE = ("lab-a", "lab-b"), 4
REAL_GPUS = 2

FIGURES = ("dynamic_mig_acceptance_ratio", "dynamic_mig_wait_p95_ratio",
           "dynamic_mig_gpu_hours_dynamic", "dynamic_mig_gpu_hours_fixed",
           "dynamic_mig_wait_p95_dynamic_min", "dynamic_mig_wait_p95_fixed_min",
           "dynamic_mig_wait_mean_ratio", "dynamic_mig_not_started_dynamic",
           "dynamic_mig_not_started_fixed", "dynamic_mig_fixed_layout_mixed",
           "dynamic_mig_local_search_runs", "dynamic_mig_real_sim_ratio",
           "dynamic_mig_real_gpu_hours_dynamic", "dynamic_mig_real_gpu_hours_fixed",
           "dynamic_mig_real_scheduler_ratio")


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; 1.0 where both are 0, nan where only theirs is."""
    if theirs:
        return ours / theirs
    return 1.0 if not ours else float("nan")


def _dynamic(requests: Sequence[Request], nodes: Sequence[str], gpus: int) -> Outcome:
    return simulate([dynamic_node(n, gpus) for n in nodes], requests, PATIENCE_S)


def table(name: str, outcome: Outcome, measured: Sequence[Request]) -> None:
    """Per profile: requests, share started, GPU-hours started, waits of those started."""
    print(f"\n{name}: {outcome.gpu_hours(measured):.1f} GPU-h started; "
          f"{outcome.passes} queue passes; misplaced carves {outcome.misplaced}")
    print(f"  {'profile':<10} {'n':>5} {'started':>8} {'after a wait':>13} {'refused':>8} "
          f"{'GPU-h':>8} {'mean wait':>10} {'p95 wait':>9} (of those started, min)")
    for profile in SOLD:
        these = [r for r in measured if r.profile == profile]
        if not these:
            continue
        started = [r for r in these if r.id in outcome.started]
        waits = [(outcome.started[r.id] - r.arrived) / 60 for r in started]
        refused = sum(r.id in outcome.refused for r in these)
        queued = sum(w > 0 for w in waits)
        print(f"  {profile:<10} {len(these):>5} {len(started) / len(these):>8.1%} "
              f"{queued / len(these):>13.1%} {refused / len(these):>8.1%} "
              f"{outcome.gpu_hours(these):>8.1f} "
              f"{statistics.fmean(waits or [0]):>10.1f} {p95(waits):>9.1f}")


def search_report(search: Search, configs: Sequence[Config], names: Sequence[str]) -> None:
    print("\nfixed layouts, uniform (every GPU the same configuration):")
    for c, candidate in enumerate(search.uniform):
        print(f"  {config_name(configs[c]):<28} {candidate.gpu_hours:>8.1f} GPU-h, mean wait "
              f"{candidate.mean_wait_s / 60:>5.1f} min")
    kind = "mixed" if search.mixed else "uniform"
    print(f"  best: {kind}, {search.best.gpu_hours:.1f} GPU-h, after {search.evaluations} "
          f"hill-climb runs and {search.steps} moves: "
          f"{describe(search.best.layout, configs, names)}")


def real_run(args: argparse.Namespace, configs: Sequence[Config]) -> tuple[float, float, float]:
    """(simulated ratio, real GPU-h dynamic, real GPU-h fixed) of the reduced trace."""
    requests = week_trace(args.seed, REAL_GPUS, args.real_hours / 24, 0.0,
                          args.real_start_h * HOUR)
    names = ("real",)
    search = best_fixed(requests, requests, names, REAL_GPUS, configs, PATIENCE_S, args.budget,
                        lambda _line: None)
    dynamic = _dynamic(requests, names, REAL_GPUS)
    sim_ratio = ratio(dynamic.gpu_hours(requests), search.best.gpu_hours)
    counts = dict(node_counts(search.best.layout, configs)[0])
    day, hour = divmod(args.real_start_h, 24)
    print(f"\nreal kube-scheduler: {len(requests)} requests, day {day:g} (0: Monday) from "
          f"{hour:g}:00 for {args.real_hours:g} h compressed {args.real_scale:g}× (patience "
          f"{PATIENCE_S / args.real_scale:g} s), {REAL_GPUS} H200s a pool; the fixed pool's "
          f"layout, best in hindsight for this trace: "
          f"{describe(search.best.layout, configs, ['node'])} ({counts}); simulated "
          f"{dynamic.gpu_hours(requests):.1f} against {search.best.gpu_hours:.1f} GPU-h",
          flush=True)
    if args.no_real:
        return sim_ratio, float("nan"), float("nan")
    from bench.dynamic_mig_real import replay
    from tests.cluster.conftest import ControlPlane
    from tests.cluster.controlplane import attach, detach, missing_tools
    if missing_tools():
        sys.exit(f"needs {', '.join(missing_tools())}: run `make cluster-tools` (Go 1.26)")
    compressed = [Request(r.id, r.arrived / args.real_scale, r.profile,
                          r.duration / args.real_scale, r.who) for r in requests]
    root = Path(tempfile.gettempdir()) / f"gpulease-mig-bench-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    try:
        lanes = replay(ControlPlane(attach(root)), compressed, REAL_GPUS, counts,
                       PATIENCE_S / args.real_scale)
    finally:
        detach(root)
        shutil.rmtree(root, ignore_errors=True)
    hours = {}
    for name, lane in lanes.items():
        hours[name] = lane.gpu_hours(args.real_scale)
        print(f"  {name}: {len(lane.bound_at)} of {len(requests)} started, {hours[name]:.1f} "
              f"GPU-h; gave up {len(lane.gave_up)} (made but never bound: {lane.unscheduled}, "
              f"refused: {lane.refused}); {lane.passes} queue passes")
    print(f"  replayed in {time.monotonic() - began:.0f} s", flush=True)
    return sim_ratio, hours["dynamic"], hours["fixed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=7.0, help="measured days from Monday")
    parser.add_argument("--warmup-h", type=float, default=24.0, help="unmeasured hours before")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--budget", type=int, default=400, help="hill-climb runs at most")
    parser.add_argument("--real-start-h", type=float, default=32.0,
                        help="the reduced trace's start, hours from Monday 00:00 (Tuesday 08:00)")
    parser.add_argument("--real-hours", type=float, default=24.0,
                        help="the reduced trace's hours")
    parser.add_argument("--real-scale", type=float, default=360.0,
                        help="its compression: trace seconds per real second")
    parser.add_argument("--no-real", action="store_true", help="simulate only")
    parser.add_argument("--quick", action="store_true",
                        help="one day, 12 hill-climb runs; real: 6 h from Tuesday noon, 1 h = 5 s")
    args = parser.parse_args()
    if args.quick:
        args.days, args.warmup_h, args.budget = 1.0, 6.0, 12
        args.real_start_h, args.real_hours, args.real_scale = 36.0, 6.0, 720.0
    began = time.monotonic()
    requests = week_trace(args.seed, len(NODES) * GPUS_PER_NODE, args.days,
                          args.warmup_h * HOUR)
    measured = [r for r in requests if r.arrived >= 0]
    offered = sum(r.gpus * r.duration for r in measured) / 3600
    capacity = len(NODES) * GPUS_PER_NODE * args.days * 24
    shares = offered_share(args.days)
    print(f"dynamic_mig: {len(NODES)} nodes × {GPUS_PER_NODE} H200, {args.days:g} days from "
          f"Monday (warm-up {args.warmup_h:g} h), seed {args.seed}: {len(measured)} requests "
          f"measured, {offered:.0f} GPU-h offered = {offered / capacity:.2f} of the pool "
          f"(expected {shares['student']:.2f} students + {shares['tuner']:.2f} fine-tuners); "
          f"patience {PATIENCE_S / HOUR:g} h", flush=True)
    configs = [c for c, _witness in gpu_configs()]
    with ProcessPoolExecutor(1) as pool:  # the dynamic pool beside the search: 2 cores
        dynamic_future = pool.submit(_dynamic, requests, NODES, GPUS_PER_NODE)
        search = best_fixed(requests, measured, NODES, GPUS_PER_NODE, configs, PATIENCE_S,
                            args.budget)
        dynamic = dynamic_future.result()
    fixed = search.best.outcome
    search_report(search, configs, NODES)
    table("dynamic (DynamicMIG)", dynamic, measured)
    table("fixed (best in hindsight)", fixed, measured)
    print(f"\nsimulated in {time.monotonic() - began:.0f} s", flush=True)
    sim_ratio, real_dynamic, real_fixed = real_run(args, configs)

    waits = {name: o.waits(measured, PATIENCE_S) for name, o in
             (("dynamic", dynamic), ("fixed", fixed))}
    not_started = {name: 1 - sum(r.id in o.started for r in measured) / len(measured)
                   for name, o in (("dynamic", dynamic), ("fixed", fixed))}
    print()
    print(f"dynamic_mig_fixed_layout: {describe(search.best.layout, configs, NODES)}")
    figure("dynamic_mig_gpu_hours_dynamic", dynamic.gpu_hours(measured), 1)
    figure("dynamic_mig_gpu_hours_fixed", fixed.gpu_hours(measured), 1)
    figure("dynamic_mig_acceptance_ratio",
           ratio(dynamic.gpu_hours(measured), fixed.gpu_hours(measured)), 4)
    target("dynamic_mig_acceptance_ratio", ">= 1.10")
    figure("dynamic_mig_wait_p95_dynamic_min", p95(waits["dynamic"]) / 60, 1)
    figure("dynamic_mig_wait_p95_fixed_min", p95(waits["fixed"]) / 60, 1)
    figure("dynamic_mig_wait_p95_ratio", ratio(p95(waits["dynamic"]), p95(waits["fixed"])), 4)
    target("dynamic_mig_wait_p95_ratio", "<= 1.0")
    figure("dynamic_mig_wait_mean_ratio",
           ratio(statistics.fmean(waits["dynamic"]), statistics.fmean(waits["fixed"])), 4)
    figure("dynamic_mig_not_started_dynamic", not_started["dynamic"], 4)
    figure("dynamic_mig_not_started_fixed", not_started["fixed"], 4)
    figure("dynamic_mig_fixed_layout_mixed", 1 if search.mixed else 0, 0)
    figure("dynamic_mig_local_search_runs", search.evaluations, 0)
    figure("dynamic_mig_real_sim_ratio", sim_ratio, 4)
    figure("dynamic_mig_real_gpu_hours_dynamic", real_dynamic, 2)
    figure("dynamic_mig_real_gpu_hours_fixed", real_fixed, 2)
    figure("dynamic_mig_real_scheduler_ratio", ratio(real_dynamic, real_fixed), 4)
    target("dynamic_mig_real_scheduler_ratio", ">= 1.05")
    print(f"\ndynamic_mig done in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
