"""placement_real_scheduler_ratio: gpulease's packing kube-scheduler against the default one,
both real, on one control plane, at reduced scale.

    .venv/bin/python bench/placement_real.py [--nodes 48] [--mean-s 40] [--window 4]
                                             [--load 1.2] [--seed 42] [--quick]

What bench/placement.py simulates, run on the real kube-scheduler: the test
control plane (tests/cluster/controlplane.py) with two pools of the same shape,
each NODES/2 kwok nodes of 8 H200s (224 CPUs, 2 TiB), half of them MIG in the
balanced layout (nvidia.com/mig-1g.18gb 16, mig-2g.35gb 8, mig-3g.71gb 8 per
node; the `mixed` strategy), half whole cards (nvidia.com/gpu 8). One pool's
pods name gpulease's packing scheduler (the control plane's kube-scheduler
binary run again with spawners/kube/scheduler_config.py's configuration, as
tests/cluster/packing_scheduler.py runs it: leader election on, its own
ServiceAccount), the other's the default scheduler. The nodes are bind-only
(kwok keeps them Ready; nothing runs their pods): a pod's start is its binding.

The same requests (seed 42) are offered to both pools in the same run, each
event to both at once: per pool kind (MIG, whole cards) Poisson arrivals at
LOAD × that kind's capacity in GPU compute (a GPU is 7 slices: 1g = 1, 2g = 2,
3g = 3, N cards = 7N; rate × mean duration × mean size = LOAD × capacity),
the mix 50 % 1g.18gb, 15 % 2g.35gb, 10 % 3g.71gb, 15 % one GPU, 5 % two,
3 % four, 2 % eight; exponential durations of mean MEAN_S seconds (2 h
compressed; queue_max_wait's 30 min is MEAN_S/4). Pods ask for a GPU's
share of cpu and memory (a card 24 CPUs and 224 GiB, a slice of compute
24/7 CPUs and 32 GiB).

In front of each pool gpulease's own queue decides when a pod is made, the
same for both: gpulease/core/capacity/cluster_queue.py plan_cluster over the pool's
inventory (bound pods' holds, admitted pods not yet bound given room first):
oldest first per kind, a waiting request keeping every node that could ever
run it from later requests of its kind (the head is not overtaken), other
kinds passing. A request still in the queue after the max wait gives up; a
pod made but not bound within a max wait of its making is given up too and
deleted (as kubespawner's start timeout would). A started pod is deleted when its
duration is up (grace 0), and its hold goes when the watch sees it gone.

Measured: the requests arriving in a window of WINDOW mean durations after
a warm-up of two. Acceptance (the headline): the share of offered GPU-time
(size × duration) that started (left the queue within the max wait, bound);
bounded by min(1, capacity / offered) per kind. Also per request size the
share started, the share started at once (never waited in the queue), mean
and p95 wait, whole nodes free (sampled each second), and the scheduling lag
from a pod's create to its binding (the machine's own delay, the same for
both). Needs `make cluster-tools` (Go).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from bench.placement_real_lane import SLICES, Api, Lane, Request, watch_lane  # noqa: E402
from gpulease.core.capacity.cluster_inventory import ClusterNode, node_from_object  # noqa: E402
from tests.cluster.conftest import POOL_LABEL, ControlPlane  # noqa: E402
from tests.cluster.controlplane import attach, detach, missing_tools  # noqa: E402
from tests.cluster.nodes import GpuNode, node_object  # noqa: E402
from tests.cluster.packing_scheduler import running_packing_scheduler  # noqa: E402

MIG_LAYOUT = {"1g.18gb": 16, "2g.35gb": 8, "3g.71gb": 8}  # per node of 8 GPUs: 56 slices
MIX = {"mig": [("1g.18gb", 1, 50), ("2g.35gb", 1, 15), ("3g.71gb", 1, 10)],
       "full": [(None, 1, 15), (None, 2, 5), (None, 4, 3), (None, 8, 2)]}
SLICES_PER_GPU = 7


def arrivals(seed: int, capacity: dict[str, int], mean_s: float, load: float,
             horizon_s: float) -> list[Request]:
    """Poisson arrivals per kind at `load` × its capacity (slices), seeded, merged."""
    made: list[Request] = []
    for n, (kind, mix) in enumerate(sorted(MIX.items())):
        rng = random.Random(f"{seed}-{n}")
        total = sum(w for *_, w in mix)
        mean_size = sum(Request(0, 0, m, c, 0).slices * w for m, c, w in mix) / total
        rate = load * capacity[kind] / (mean_s * mean_size)
        t = rng.expovariate(rate)
        while t < horizon_s:
            mig, count, _ = rng.choices(mix, weights=[w for *_, w in mix])[0]
            made.append(Request(0, t, mig, count, rng.expovariate(1 / mean_s)))
            t += rng.expovariate(rate)
    made.sort(key=lambda r: r.t)
    return [replace(r, id=i) for i, r in enumerate(made)]


def pool_nodes(kube, lane: str, count: int) -> tuple[list[ClusterNode], dict[str, str]]:
    """`count` bind-only nodes labelled for the lane, half MIG; their inventory form."""
    nodes, kinds = [], {}
    for i in range(count):
        kind = "mig" if i % 2 else "full"
        spec = GpuNode(f"bench-{lane}-{kind}-{i:03d}", cpu="224", memory="2Ti", bind_only=True,
                       **({"mig": MIG_LAYOUT} if kind == "mig" else {"gpus": 8}))
        obj = node_object(spec)
        obj["metadata"]["labels"][POOL_LABEL] = f"bench-{lane}"
        kube.create("/api/v1/nodes", obj)
        nodes.append(replace(node_from_object(obj), schedulable=True))
        kinds[spec.name] = kind
    for node in nodes:
        kube.wait_for(f"node {node.name} Ready and untainted", lambda n=node.name: (
            o := kube.get(f"/api/v1/nodes/{n}")) and not o["spec"].get("taints") and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in o["status"].get("conditions", [])), timeout=60)
    return nodes, kinds


def run(args: argparse.Namespace, plane: ControlPlane) -> dict[str, Lane]:
    kube = plane.admin()
    api = Api(plane.state["server"], plane.state["ca"], plane.root / "pki")
    tag = uuid.uuid4().hex[:4]
    max_wait = args.mean_s / 4
    warmup, window = 2 * args.mean_s, args.window * args.mean_s
    with running_packing_scheduler(plane.state, kube, list(MIG_LAYOUT),
                                   plane.root / "packing-scheduler") as packing:
        lanes: dict[str, Lane] = {}
        for name, scheduler in (("gpulease", packing.name), ("default", "")):
            namespace = f"bench-{name}-{tag}"
            kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
            nodes, kinds = pool_nodes(kube, f"{name}-{tag}", args.nodes // 2)
            lanes[name] = Lane(name, scheduler, namespace, f"bench-{name}-{tag}", tuple(nodes),
                               kinds, api, max_wait)
        capacity = {"mig": 0, "full": 0}  # in compute slices, of one pool
        for node in lanes["gpulease"].nodes:
            capacity[lanes["gpulease"].kinds[node.name]] += sum(
                n * SLICES.get(r.removeprefix("nvidia.com/mig-"), SLICES_PER_GPU)
                for r, n in node.allocatable.items())
        requests = arrivals(args.seed, capacity, args.mean_s, args.load, warmup + window)
        print(f"{len(requests)} requests over {warmup + window:.0f} s; capacity per pool "
              f"(compute slices, 7 a GPU): {capacity}; a pod asks 24 CPUs and 224 GiB a card, "
              f"24/7 CPU and 32 GiB a slice", flush=True)
        start = time.monotonic()
        for lane in lanes.values():
            watch_lane(kube, lane, start)
        end = warmup + window + max_wait + 5
        following = 0
        next_sample = warmup
        while (now := time.monotonic() - start) < end:
            while following < len(requests) and requests[following].t <= now:
                for lane in lanes.values():
                    lane.arrive(requests[following])
                following += 1
            for lane in lanes.values():
                lane.step(now)
            if warmup <= now < warmup + window and now >= next_sample:
                for lane in lanes.values():
                    lane.sample()
                next_sample += 1
            time.sleep(0.01)
        for lane in lanes.values():
            lane.measured = [r for r in requests if warmup <= r.t < warmup + window]
            lane.capacity = capacity
            lane.stop()
            api.request("DELETE", f"/api/v1/namespaces/{lane.namespace}/pods",
                        {"gracePeriodSeconds": 0})
            kube.delete(f"/api/v1/namespaces/{lane.namespace}")
            for node in lane.nodes:
                kube.delete(f"/api/v1/nodes/{node.name}")
        return lanes


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else (values or [0])[0]


def share(ours: float, theirs: float) -> float:
    """ours / theirs; nan where the default lane started nothing (a short --quick window)."""
    return ours / theirs if theirs else float("nan")


def report(lanes: dict[str, Lane], args: argparse.Namespace) -> None:
    acceptance = {}
    for name, lane in lanes.items():
        measured = lane.measured
        print(f"\n{name} ({lane.scheduler or 'default-scheduler'}): {len(measured)} requests "
              "measured")
        print(f"  {'size':<10} {'n':>5} {'started':>8} {'at once':>8} {'mean wait':>10} "
              f"{'p95 wait':>9}")
        for label in sorted({r.label for r in measured}, key=lambda s: (s[0].isdigit(), s)):
            these = [r for r in measured if r.label == label]
            started = [r for r in these if r.id in lane.bound_at]
            waits = [lane.bound_at[r.id] - r.t for r in started]
            at_once = [r for r in started if r.id not in lane.queued]
            print(f"  {label:<10} {len(these):>5} {len(started) / len(these):>8.1%} "
                  f"{len(at_once) / len(these):>8.1%} {statistics.fmean(waits or [0]):>9.2f}s "
                  f"{p95(waits):>8.2f}s")
        offered = sum(r.slices * r.duration for r in measured)
        started_time = sum(r.slices * r.duration for r in measured if r.id in lane.bound_at)
        acceptance[name] = started_time / offered
        at_once = sum(1 for r in measured if r.id in lane.bound_at and r.id not in lane.queued)
        lane.at_once_share = at_once / len(measured)
        per_kind = []
        for kind in ("mig", "full"):
            these = [r for r in measured if r.kind == kind]
            offered_kind = sum(r.slices * r.duration for r in these)
            lane.kind_acceptance[kind] = sum(
                r.slices * r.duration for r in these if r.id in lane.bound_at) / offered_kind
            load = offered_kind / (lane.capacity[kind] * args.window * args.mean_s)
            per_kind.append(f"{kind} {lane.kind_acceptance[kind]:.3f} (offered "
                            f"{load:.2f}× capacity: at most {min(1, 1 / load):.3f})")
        lags = lane.bind_lags
        print(f"  acceptance (share of offered GPU-time started): "
              f"{acceptance[name]:.3f}; per kind: {', '.join(per_kind)}")
        print(f"  started at once: {lane.at_once_share:.3f} of requests; whole nodes free "
              f"(mean of {len(lane.free_samples)} samples): full-card "
              f"{statistics.fmean(s[0] for s in lane.free_samples):.2f}, MIG "
              f"{statistics.fmean(s[1] for s in lane.free_samples):.2f} of "
              f"{len(lane.nodes) // 2} each")
        print(f"  create-to-bound lag: median {statistics.median(lags or [0]) * 1000:.0f} ms, "
              f"p95 {p95(lags) * 1000:.0f} ms; pods made but left Pending a max wait: "
              f"{lane.unscheduled}")
    ratio = share(acceptance["gpulease"], acceptance["default"])
    print()
    figure("placement_real_acceptance_gpulease", acceptance["gpulease"], 4)
    figure("placement_real_acceptance_default", acceptance["default"], 4)
    for kind, what in (("full", "full_card"), ("mig", "mig")):
        ours, theirs = (lanes[n].kind_acceptance[kind] for n in ("gpulease", "default"))
        figure(f"placement_real_{what}_ratio", share(ours, theirs), 4)
    figure("placement_real_at_once_ratio",
           share(lanes["gpulease"].at_once_share, lanes["default"].at_once_share), 4)
    for name, lane in lanes.items():
        figure(f"placement_real_whole_nodes_free_{name}",
               statistics.fmean(s[0] for s in lane.free_samples), 2)
    figure("placement_real_scheduler_ratio", ratio, 4)
    target("placement_real_scheduler_ratio", ">= 1.05")


FIGURES = ("placement_real_acceptance_gpulease", "placement_real_acceptance_default",
           "placement_real_full_card_ratio", "placement_real_mig_ratio",
           "placement_real_at_once_ratio", "placement_real_whole_nodes_free_gpulease",
           "placement_real_whole_nodes_free_default", "placement_real_scheduler_ratio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=48, help="nodes in all, half per scheduler")
    parser.add_argument("--mean-s", type=float, default=40.0, help="mean duration (2 h), s")
    parser.add_argument("--window", type=float, default=4.0, help="measured, in mean durations")
    parser.add_argument("--load", type=float, default=1.2, help="offered / capacity, per kind")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quick", action="store_true",
                        help="16 nodes, mean 10 s, window 2 (CI: it runs to its end)")
    parser.add_argument("--json", type=Path, help="also write each lane's outcomes here")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.mean_s, args.window = 16, 10.0, 2.0
    if missing_tools():
        sys.exit(f"needs {', '.join(missing_tools())}: run `make cluster-tools` (Go 1.26)")
    print(f"placement_real: {args.nodes} nodes × 8 H200 ({args.nodes // 2} per scheduler, half "
          f"MIG {MIG_LAYOUT}), mean duration {args.mean_s:g} s, max wait {args.mean_s / 4:g} s, "
          f"load {args.load:g}, warm-up {2 * args.mean_s:g} s, window "
          f"{args.window * args.mean_s:g} s, seed {args.seed}", flush=True)
    root = Path(tempfile.gettempdir()) / f"gpulease-cluster-bench-{uuid.uuid4().hex[:6]}"
    try:
        plane = ControlPlane(attach(root))
        lanes = run(args, plane)
    finally:
        detach(root)
        shutil.rmtree(root, ignore_errors=True)
    report(lanes, args)
    if args.json:
        args.json.write_text(json.dumps({n: lane.outcomes() for n, lane in lanes.items()}))


if __name__ == "__main__":
    main()
