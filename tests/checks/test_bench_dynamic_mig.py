"""bench/dynamic_mig.py's parts: the valid MIG configurations it searches, its trace, and
a tiny simulation through gpulease's own queue and fit rule (bench/dynamic_mig_sim.py)."""

from __future__ import annotations

from collections import Counter

from bench.dynamic_mig_search import best_fixed
from bench.dynamic_mig_sim import (
    dynamic_node,
    fixed_node,
    gpu_configs,
    remembered_overlaps,
    simulate,
)
from bench.dynamic_mig_trace import HOUR, SOLD, Request, offered_share, week_trace
from gpulease.core.capacity import partitioned_fit
from gpulease.core.capacity.dynamic_mig import mig_resource, partitioned_node
from gpulease.core.capacity.partitions import available, free_counts, overlap


def test_the_valid_configurations_of_an_h200_are_the_nine_maximal_undominated_ones():
    found = gpu_configs("H200")
    assert [dict(c) for c, _ in found] == [
        {"7g.141gb": 1}, {"3g.71gb": 2}, {"3g.71gb": 1, "2g.35gb": 2},
        {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}, {"3g.71gb": 1, "1g.18gb": 4},
        {"2g.35gb": 3, "1g.18gb": 1}, {"2g.35gb": 2, "1g.18gb": 3},
        {"2g.35gb": 1, "1g.18gb": 5}, {"1g.18gb": 7}]
    node = partitioned_node("H200", "g", 1)
    for config, witness in found:
        devices = [node.device(k) for k in witness]
        # the witness is one way to carve it: its slices, none overlapping, within the counters
        assert Counter(d.profile for d in devices) == Counter(dict(config))
        assert not any(overlap(a, b, node) for a in devices for b in devices if a is not b)
        assert all(n >= 0 for left in available(node, witness).values() for n in left.values())
        # and maximal: nothing sold fits beside it
        free = free_counts(node, witness)
        assert all(free[mig_resource(p)] == 0 for p in SOLD)


def test_remembered_overlaps_answer_as_the_fit_rule_does():
    node = partitioned_node("H200", "n", 2)
    with remembered_overlaps():
        remembered = partitioned_fit.overlap
        assert remembered is not overlap
        for a in node.devices:
            for b in node.devices:
                assert remembered(a, b, node) == overlap(a, b, node)
                assert remembered(a, b, node) == overlap(a, b, node)  # asked again: kept
    assert partitioned_fit.overlap is overlap


def test_the_trace_is_seeded_and_offers_what_its_docstring_says():
    assert week_trace(3, 8, 1, 0) == week_trace(3, 8, 1, 0)
    assert week_trace(3, 8, 1, 0) != week_trace(4, 8, 1, 0)
    shares = offered_share(7)
    assert round(shares["student"], 2) == 0.29 and round(shares["tuner"], 2) == 0.77
    compressed = week_trace(3, 2, 0.25, 0, 32 * HOUR, 360)
    assert compressed and all(0 <= r.arrived < 6 * HOUR / 360 for r in compressed)


def _requests(*spec: tuple[float, str, float]) -> list[Request]:
    return [Request(i, t * HOUR, p, d * HOUR, "x") for i, (t, p, d) in enumerate(spec)]


def test_a_dynamic_gpu_starts_a_7g_and_then_two_3gs_no_fixed_layout_starts_all_three():
    requests = _requests((0, "7g.141gb", 1), (1.5, "3g.71gb", 1), (1.5, "3g.71gb", 1))
    dynamic = simulate([dynamic_node("n", 1)], requests, 2 * HOUR)
    assert dynamic.started == {0: 0.0, 1: 1.5 * HOUR, 2: 1.5 * HOUR}
    configs = [c for c, _ in gpu_configs()]
    search = best_fixed(requests, requests, ["n"], 1, configs, 2 * HOUR, 10, lambda _: None)
    assert search.best.gpu_hours < dynamic.gpu_hours(requests) == 1 + 2 * 3 / 7
    assert not search.mixed and search.evaluations == 0  # one GPU: every layout is uniform
    two_3g = simulate([fixed_node("n", [(("3g.71gb", 2),)])], requests, 2 * HOUR)
    assert two_3g.refused == {0} and set(two_3g.started) == {1, 2}


def test_a_waiting_7g_keeps_its_gpu_from_a_later_slice_and_starts_when_it_frees():
    requests = _requests((0, "1g.18gb", 1), (0.1, "7g.141gb", 1), (0.2, "1g.18gb", 1))
    out = simulate([dynamic_node("n", 1)], requests, 2 * HOUR)
    assert out.started == {0: 0.0, 1: 1 * HOUR, 2: 2 * HOUR}
    assert out.misplaced == 0
