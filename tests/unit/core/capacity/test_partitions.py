"""The DynamicMIG fit rule (gpulease/core/capacity/partitions.py) on H200s as NVIDIA's
driver publishes them (dynamic_mig.py from mig_geometry.py): first fit in the driver's
order, no overlap, and the fragmentation first fit leaves."""

from __future__ import annotations

import pytest

from gpulease.core.capacity.dynamic_mig import GPU_RESOURCE, mig_resource, partitioned_node
from gpulease.core.capacity.partitions import (
    available,
    carve,
    carved,
    first_fit,
    fits,
    free_counts,
    overlap,
)
from gpulease.core.model import mig_geometry as geo

ONE, TWO, THREE, FOUR, SEVEN = (mig_resource(p) for p in
                                ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"))


@pytest.fixture
def node():
    return partitioned_node("H200", "n", 2)


def memory_slices(node, keys) -> list[set[int]]:
    """Per allocated device, the memory slices it takes (from its consumption)."""
    return [{int(c.rsplit("-", 1)[1]) for _s, c, _n in node.device(k).consumes
             if c.startswith("memory-slice-")} for k in keys]


def test_an_idle_h200_offers_what_nvidia_smi_lists_as_the_most_of_each_profile(node):
    assert free_counts(node, ()) == {
        GPU_RESOURCE: 2, ONE: 14, mig_resource("1g.35gb"): 8, TWO: 6, THREE: 4, FOUR: 2,
        SEVEN: 2}


def test_first_fit_takes_the_lowest_free_memory_slice_of_the_first_gpu(node):
    first = first_fit(node, ONE, ())
    assert first.key == "n/gpu-0-mig-1g18gb-19-0"
    assert first_fit(node, ONE, {first.key}).key == "n/gpu-0-mig-1g18gb-19-1"
    assert first_fit(node, THREE, {first.key}).key == "n/gpu-0-mig-3g71gb-9-4"


def test_a_full_gpu_fits_only_where_nothing_is_carved(node):
    one = first_fit(node, ONE, ()).key
    assert first_fit(node, GPU_RESOURCE, {one}).key == "n/gpu-1"
    assert first_fit(node, SEVEN, {one}).key == "n/gpu-1-mig-7g141gb-0-0"
    assert first_fit(node, ONE, {"n/gpu-0", "n/gpu-1"}) is None


def test_carved_slices_never_overlap_and_fill_both_gpus(node):
    taken: list[str] = []
    for resource in [THREE, ONE, TWO, ONE, THREE, TWO, ONE, ONE, ONE, FOUR, ONE]:
        got = carve(node, [resource], taken)
        if got is not None:
            taken.append(got[0].key)
    per_gpu: dict[str, list[set[int]]] = {}
    for key in taken:
        per_gpu.setdefault(node.device(key).gpu, []).append(memory_slices(node, [key])[0])
    for slices in per_gpu.values():
        flat = [s for group in slices for s in group]
        assert len(flat) == len(set(flat)), "two slices share a memory slice"
    assert all(v >= 0 for left in available(node, taken).values() for v in left.values())


def test_first_fit_fragments_a_gpu_a_3g_then_finds_no_room(node):
    # a 1g at slice 0 and one at slice 4 of each GPU: 3 free compute slices left on
    # each, yet no 3g placement (slices 0-3 or 4-7) is whole anywhere
    taken = {f"n/gpu-{g}-mig-1g18gb-19-{s}" for g in (0, 1) for s in (0, 4)}
    assert free_counts(node, taken)[ONE] == 10
    assert first_fit(node, THREE, taken) is None
    assert first_fit(node, TWO, taken).key == "n/gpu-0-mig-2g35gb-14-2"


def test_a_request_for_two_full_gpus_is_carved_whole_or_not_at_all(node):
    assert [d.key for d in carve(node, [GPU_RESOURCE] * 2, ())] == ["n/gpu-0", "n/gpu-1"]
    assert carve(node, [GPU_RESOURCE] * 2, {"n/gpu-0-mig-1g18gb-19-6"}) is None


def test_overlap_is_sharing_a_memory_slice(node):
    d = node.device
    assert overlap(d("n/gpu-0-mig-3g71gb-9-0"), d("n/gpu-0-mig-1g18gb-19-3"), node)
    assert not overlap(d("n/gpu-0-mig-3g71gb-9-0"), d("n/gpu-0-mig-3g71gb-9-4"), node)
    assert not overlap(d("n/gpu-0-mig-7g141gb-0-0"), d("n/gpu-1-mig-1g18gb-19-0"), node)
    assert overlap(d("n/gpu-0"), d("n/gpu-0-mig-1g18gb-19-6"), node)


def test_a_counter_short_of_its_need_refuses_whatever_the_slices_say(node):
    left = available(node, ())
    left["n/gpu-0-counter-set"]["multiprocessors"] = 10
    assert not fits(node.device("n/gpu-0-mig-1g18gb-19-0"), left)
    assert fits(node.device("n/gpu-1-mig-1g18gb-19-0"), left)


def test_carved_lists_each_gpus_slices_by_first_memory_slice(node):
    taken = {"n/gpu-0-mig-3g71gb-9-4", "n/gpu-0-mig-1g18gb-19-0"}
    shown = carved(node, taken)
    assert [d.key for d in shown["n/gpu-0-counter-set"]] == [
        "n/gpu-0-mig-1g18gb-19-0", "n/gpu-0-mig-3g71gb-9-4"]
    assert shown["n/gpu-1-counter-set"] == []


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL", "H200"])
def test_every_profile_has_nvidia_smis_placements(model):
    per_gpu = {p: len(places) for p, places in geo.placements(model).items()}
    from gpulease.core.model.gpu_models import MIG_PROFILES
    assert per_gpu == {p: n for p, n in MIG_PROFILES[model].items() if "+" not in p}
