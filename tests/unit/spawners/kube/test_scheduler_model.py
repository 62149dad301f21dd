"""bench/scheduler_model.py against kube-scheduler's scores computed by hand (from
k8s.io/kubernetes v1.36.3's noderesources plugins and schedule_one.go), and
bench/placement_sim.py's indexed engine against that model, decision by decision."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from random import Random

import pytest

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))  # bench/ is run from the clone's root, not installed

from bench.placement_sim import KINDS, MIG_PROFILES, Engine, simulate, state_node  # noqa: E402
from bench.scheduler_model import (  # noqa: E402
    LEAST_ALLOCATED,
    MOST_ALLOCATED,
    NodeState,
    ResourceSpec,
    allocation_vectors,
    balanced_allocation_score,
    default_policy,
    first_fit_policy,
    fits,
    node_score,
    num_feasible_nodes_to_find,
    policy_from_config,
    schedule,
    weighted_score,
)
from gpulease.spawners.kube.scheduler_config import scheduler_configuration  # noqa: E402

GPU = "nvidia.com/gpu"
MIG_1G, MIG_2G, MIG_3G = (f"nvidia.com/mig-{p}" for p in ("1g.18gb", "2g.35gb", "3g.71gb"))
PACKING = policy_from_config(scheduler_configuration(MIG_PROFILES))

# A node with a quarter of its GPUs, a third of its cpu and a fifth of its memory requested.
NODE = NodeState("n", {"cpu": 3000, "memory": 10_000, GPU: 4},
                 {"cpu": 1000, "memory": 2000, GPU: 1})
POD = {"cpu": 1000, "memory": 1000, GPU: 1}


def test_the_packing_policy_is_read_from_gpuleases_configuration():
    assert PACKING.strategy == MOST_ALLOCATED
    assert PACKING.percentage_of_nodes_to_score == 100
    assert PACKING.balanced_resources == ()  # BalancedAllocation disabled there
    assert {r.name: r.weight for r in PACKING.fit_resources} == {
        GPU: 10, MIG_1G: 10, MIG_2G: 10, MIG_3G: 10, "cpu": 1, "memory": 1}
    default = default_policy()
    assert (default.strategy, default.percentage_of_nodes_to_score) == (LEAST_ALLOCATED, 0)
    assert [r.name for r in default.balanced_resources] == ["cpu", "memory"]


def test_most_allocated_by_hand():
    # gpu (1+1)*100/4 = 50 at weight 10; cpu 2000*100/3000 = 66; memory 3000*100/10000 = 30:
    # (500 + 66 + 30) / 12 = 49 (integer division).
    assert node_score(PACKING, POD, NODE) == 49
    req, alloc = [2, 2000], [4, 3000]
    assert weighted_score((ResourceSpec(GPU, 3), ResourceSpec("cpu")), req, alloc,
                          MOST_ALLOCATED) == (50 * 3 + 66) // 4


def test_least_allocated_and_balanced_allocation_by_hand():
    # LeastAllocated: cpu (3000-2000)*100/3000 = 33, memory (10000-3000)*100/10000 = 70 -> 51.
    # BalancedAllocation: with the pod |2000/3000 - 3000/10000| / 2 = 0.1833 -> 81; without it
    # |1000/3000 - 2000/10000| / 2 = 0.0667 -> 93; 50 + (50 + 81 - 93) / 2 = 69.
    policy = default_policy()
    req, allocated, alloc = allocation_vectors(policy.balanced_resources, POD, NODE)
    assert (req, allocated, alloc) == ([2000, 3000], [1000, 2000], [3000, 10_000])
    assert balanced_allocation_score(req, allocated, alloc) == 69
    assert node_score(policy, POD, NODE) == 51 + 69
    # A pod that makes the node less balanced is scored under 75; one that balances it, over.
    assert balanced_allocation_score([3000, 2000], [1000, 2000], [3000, 10_000]) < 75
    assert balanced_allocation_score([1000, 3333], [1000, 2000], [3000, 10_000]) > 75


def test_an_unrequested_extended_resource_is_skipped_cpu_and_memory_always_count():
    node = NodeState("mig", {"cpu": 7000, "memory": 7000, MIG_1G: 16, MIG_3G: 8},
                     {"cpu": 1400, "memory": 1400, MIG_1G: 3, MIG_3G: 4})
    pod = {"cpu": 700, "memory": 700, MIG_1G: 1}
    req, _, alloc = allocation_vectors(PACKING.fit_resources, pod, node)
    by_name = {r.name: (q, a) for r, q, a in zip(PACKING.fit_resources, req, alloc, strict=True)}
    assert by_name[MIG_3G] == (0, 0)  # held half full, but this pod does not ask for it
    assert by_name[MIG_2G] == by_name[GPU] == (0, 0)  # the node has none
    # 1g 4*100/16 = 25 at 10, cpu and memory 2100*100/7000 = 30: (250 + 30 + 30) / 12 = 25;
    # counting the 3g slices (50 at 10) would give (310 + 500) / 22 = 36.
    assert node_score(PACKING, pod, node) == 25
    # cpu and memory count even for a pod that requests neither.
    assert allocation_vectors(PACKING.fit_resources, {MIG_1G: 1}, node)[0][-2:] == [1400, 1400]
    assert node_score(PACKING, {MIG_1G: 1}, node) == (250 + 20 + 20) // 12


def test_fit_filter():
    assert fits(POD, NODE)
    assert not fits({**POD, GPU: 4}, NODE)  # 3 free
    assert not fits({**POD, MIG_1G: 1}, NODE)  # the node has none
    assert not fits(POD, replace(NODE, allocatable={**NODE.allocatable, "pods": 2}, pods=2))


def test_nodes_to_find_is_kube_schedulers_adaptive_share():
    assert num_feasible_nodes_to_find(0, 1000) == 420  # 50 - 1000/125 = 42%
    assert num_feasible_nodes_to_find(0, 99) == 99  # under 100 nodes: all
    assert num_feasible_nodes_to_find(0, 150) == 100  # 49% is 73: at least 100
    assert num_feasible_nodes_to_find(0, 6000) == 300  # 50 - 48 = 2%, at least 5%
    assert num_feasible_nodes_to_find(100, 1000) == 1000  # gpulease's setting


def gpu_nodes(used: list[int]) -> list[NodeState]:
    return [state_node(0, (u,), f"n{i}") for i, u in enumerate(used)]


def test_packing_puts_a_gpu_pod_on_the_fuller_node_the_default_spreads():
    nodes = gpu_nodes([0, 6, 2])
    pod = KINDS[3].pod  # one GPU, 24 CPUs, 224 GiB
    assert schedule(PACKING, pod, nodes, 0, Random(1)).node == 1
    assert schedule(default_policy(), pod, nodes, 0, Random(1)).node == 0
    assert schedule(first_fit_policy(), pod, gpu_nodes([8, 6, 2]), 0, Random(1)).node == 1


def test_ties_are_broken_uniformly_at_random_and_seeded():
    nodes = gpu_nodes([1, 3, 1, 1, 0])
    decisions = [schedule(PACKING, KINDS[3].pod, nodes, 0, Random(seed)) for seed in range(400)]
    assert {d.top for d in decisions} == {(1,)}  # one fullest node: no draw matters
    nodes = gpu_nodes([2, 0, 2, 5, 2])  # 3 is fullest but a 4-GPU pod does not fit there
    picks = Counter(schedule(PACKING, KINDS[5].pod, nodes, 0, Random(seed)).node
                    for seed in range(600))
    assert set(picks) == {0, 2, 4} and min(picks.values()) > 150
    assert schedule(PACKING, KINDS[5].pod, nodes, 0, Random(5)) == \
        schedule(PACKING, KINDS[5].pod, nodes, 0, Random(5))


def test_the_default_searches_a_window_from_a_rotating_index():
    nodes = gpu_nodes([3] * 150)
    nodes[140] = state_node(0, (0,), "empty")  # the default's best node, outside the window
    decision = schedule(default_policy(), KINDS[3].pod, nodes, 10, Random(1))
    assert decision.next_start == 110  # 100 feasible found from 10: the 101st stops it
    assert 140 not in decision.top and len(decision.top) == 100
    assert schedule(default_policy(), KINDS[3].pod, nodes, 60, Random(1)).node == 140


class CheckedEngine(Engine):
    """The indexed engine, each decision checked against scheduler_model.schedule."""

    checked = 0

    def choose(self, k: int) -> int | None:
        start, before = self.start, self.rng.getstate()
        chosen = super().choose(k)
        after = self.rng.getstate()
        self.rng.setstate(before)
        nodes = [self.node_state(p) for p in range(self.n)]
        expected = schedule(self.policy, KINDS[k].pod, nodes, start, self.rng)
        assert (chosen, self.start) == (expected.node, expected.next_start)
        assert self.rng.getstate() == after  # the same draws
        CheckedEngine.checked += 1
        return chosen


@pytest.mark.parametrize("policy", [replace(default_policy(), percentage_of_nodes_to_score=10),
                                    PACKING, first_fit_policy()], ids=lambda p: p.name)
def test_the_indexed_engine_decides_as_the_model(policy):
    # 300 nodes: the default's search window (100 nodes) cuts in while half of them are free.
    engine, rng, bound = CheckedEngine(policy, 300, Random(3)), Random(4), []
    CheckedEngine.checked = 0
    for step in range(900):
        if bound and (rng.random() < 0.45 or step % 7 == 0):
            engine.bind(*bound.pop(rng.randrange(len(bound))), sign=-1)
            continue
        k = rng.randrange(len(KINDS))
        if engine.fits(k):
            pos = engine.choose(k)
            engine.bind(pos, k)
            bound.append((pos, k))
    assert CheckedEngine.checked > 400


def test_a_small_seeded_simulation_is_deterministic_and_packing_keeps_nodes_whole():
    runs = [simulate(p, 20, 0.5, 42, load=0.6) for p in (PACKING, PACKING, default_policy())]
    packing, again, default = runs
    assert packing.kinds == again.kinds and packing.whole_free_node_s == again.whole_free_node_s
    whole_free = [r.whole_free_node_s[0] / r.measured_s for r in (packing, default)]
    assert whole_free[0] > 1.0 > 10 * whole_free[1]  # mean whole-card nodes with nothing in use
    # The same requests arrive under each policy (one stream); only the placement differs.
    assert [s.requests for s in packing.kinds] == [s.requests for s in default.kinds]
    assert packing.kinds[6].started > default.kinds[6].started  # 8-GPU requests
    # plan_cluster's rule: per kind oldest first, whole cards strictly FIFO (no 1-GPU request
    # starts while an 8-GPU one waits), though dozens of whole-card requests waited.
    assert packing.overtaken == default.overtaken == 0
    assert sum(len(s.waits) + s.gave_up for s in default.kinds[3:]) > 20
    # 120 nodes through simulate itself, each placement checked against the model.
    CheckedEngine.checked = 0
    simulate(default_policy(), 120, 0.02, 42, warmup_s=1800, engine_class=CheckedEngine)
    assert CheckedEngine.checked > 300
