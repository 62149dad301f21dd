"""placement_p99_ms: gpulease's cluster admission decision on a large inventory.

    .venv/bin/python bench/cluster_placement.py [--nodes 1000] [--decisions 5000]

An inventory of NODES nodes × 8 H200s — half whole cards (nvidia.com/gpu: 8),
half in MIG mode under the mixed strategy (7 × 1g.18gb slices per GPU, 56 per
node) — about 70 % held by bound pods, with 20 requests admitted but not yet
bound. Each decision is `cluster_fit.fit` for a random request (a slice,
or 1, 2, 4 or 8 cards) on the maintained inventory (its index built once, as
the watch adapter builds one per change); the index build is timed apart.
The target is p99 < 1 ms. --quick: 50 nodes, 200 decisions (CI: it runs to its end).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from gpulease.core.capacity.cluster_fit import fit  # noqa: E402
from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, Hold  # noqa: E402
from gpulease.core.capacity.placement import NoFit  # noqa: E402
from gpulease.core.model.device_request import DeviceRequest  # noqa: E402

SLICE = "nvidia.com/mig-1g.18gb"


def inventory(nodes: int, rng: random.Random) -> tuple[tuple[ClusterNode, ...], tuple[Hold, ...]]:
    made, holds = [], []
    for n in range(nodes):
        mig = n % 2 == 1
        resource, count = (SLICE, 56) if mig else ("nvidia.com/gpu", 8)
        made.append(ClusterNode(f"node-{n:04d}", "H200", "mixed", "570.133.20", {resource: count}))
        held = int(count * 0.7)
        while held > 0:
            take = 1 if mig else min(held, rng.choice((1, 2, 4)))
            holds.append(Hold(f"ns/p{len(holds)}", made[-1].name, {resource: take}, "u", ""))
            held -= take
    return tuple(made), tuple(holds)


FIGURES = ("inventory_index_build_ms", "placement_median_ms", "placement_p99_ms",
           "placement_p99_over_target")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="50 nodes, 200 decisions (CI)")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.decisions = 50, 200
    rng = random.Random(7)
    nodes, holds = inventory(args.nodes, rng)
    pending = tuple(DeviceRequest("H200", "1g.18gb") if i % 2 else DeviceRequest("H200", None, 2)
                    for i in range(20))
    kinds = [DeviceRequest("H200", "1g.18gb")] + [DeviceRequest("H200", None, c)
                                                    for c in (1, 2, 4, 8)]
    builds = []
    for _ in range(5):
        started = time.perf_counter()
        maintained = ClusterInventory(nodes, holds)
        fit(kinds[0], maintained)  # builds the free counts and the index
        builds.append((time.perf_counter() - started) * 1000)
    times, outcomes = [], {"fit": 0, "wait": 0, "never": 0}
    for _ in range(args.decisions):
        request = rng.choice(kinds)
        started = time.perf_counter()
        try:
            fit(request, maintained, pending)
            outcomes["fit"] += 1
        except NoFit as e:
            outcomes["wait" if e.status == 503 else "never"] += 1
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p99 = times[int(len(times) * 0.99) - 1]
    print(f"{args.nodes} nodes x 8 GPUs, {len(holds)} bound holds, {len(pending)} pending; "
          f"{args.decisions} decisions: {outcomes}")
    figure("inventory_index_build_ms", statistics.median(builds), 1)
    figure("placement_median_ms", statistics.median(times))
    figure("placement_p99_ms", p99)
    figure("placement_p99_over_target", p99 / 1.0)
    target("placement_p99_ms", "< 1")


if __name__ == "__main__":
    main()
