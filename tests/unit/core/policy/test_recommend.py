"""The recommendation (issue 48): the profiles a workload's memory estimate fits, cheapest first."""

from __future__ import annotations

import dataclasses

from gpulease.core.capacity.cluster_availability import FREE, QUEUE, Availability
from gpulease.core.model.gpu_models import GiB, mig_usable_bytes
from gpulease.core.model.llm_shapes import MODELS, shape_for_parameters
from gpulease.core.model.profiles import SAMPLE_PROFILES, GpuSpec, load_profiles_file
from gpulease.core.policy.memory_estimate import C_CUDA, Workload
from gpulease.core.policy.recommend import (
    HEADROOM,
    device_memory,
    estimated_for,
    offer_of,
    recommend,
)
from gpulease.images import shipped_catalog

CPU, SLICE, FULL = load_profiles_file(SAMPLE_PROFILES, shipped_catalog())
SLICE2 = dataclasses.replace(SLICE, slug="h200-2g", display_name="H200 slice (2g.35gb)",
                             gpu=GpuSpec("H200", "2g.35gb"), price_per_hour_ucr=2_400_000)
TWO = dataclasses.replace(FULL, slug="h200-x2", display_name="Two H200",
                          gpu=GpuSpec("H200", None, 2), price_per_hour_ucr=16_000_000)
FREE_NOW = Availability(3, 7, FREE)
NONE_FREE = Availability(0, 7, QUEUE)


def offers(*pairs):
    return [offer_of(profile, shown) for profile, shown in pairs]


def test_a_slice_holds_what_the_driver_lists_not_its_name():
    assert device_memory(SLICE) == mig_usable_bytes("H200", "1g.18gb") < 18 * GiB
    assert device_memory(FULL) == int(141 * GiB * 0.93)  # a card: what a program gets
    assert device_memory(CPU) is None


def test_the_cheapest_fitting_profile_is_first_and_recommended():
    result = recommend(10 * 10**9, offers((FULL, FREE_NOW), (SLICE, FREE_NOW),
                                          (SLICE2, FREE_NOW), (CPU, None)))
    assert result.needed_bytes == int(10e9 * HEADROOM)
    assert [v.offer.profile.slug for v in result.fitting] == ["h200-1g", "h200-2g", "h200-full"]
    assert result.recommended == "h200-1g"
    assert "cheapest profile that fits" in result.reason and "free now" in result.reason
    assert result.too_small == ()  # the CPU-only profile is never a candidate


def test_headroom_rules_out_a_device_the_estimate_alone_would_fill():
    slice_bytes = device_memory(SLICE)
    result = recommend(int(slice_bytes * 0.9), offers((SLICE, FREE_NOW), (FULL, FREE_NOW)))
    assert [v.offer.profile.slug for v in result.fitting] == ["h200-full"]
    (small,) = result.too_small
    assert small.offer.profile.slug == "h200-1g" and "needed" in small.why


def test_nothing_free_recommends_a_free_one_that_costs_more_and_says_so():
    result = recommend(10 * 10**9, offers((SLICE, NONE_FREE), (FULL, FREE_NOW)))
    assert result.recommended == "h200-full"
    assert "h200-1g would wait in the queue" in result.reason
    queued = recommend(10 * 10**9, offers((SLICE, NONE_FREE)))
    assert queued.recommended == "h200-1g" and "waits in the queue" in queued.reason


def test_several_cards_fit_only_with_the_work_split_across_them():
    result = recommend(150 * 10**9, offers((FULL, FREE_NOW), (TWO, FREE_NOW)))
    (fit,) = result.fitting
    assert fit.offer.profile.slug == "h200-x2" and fit.split
    assert "split" in fit.why
    assert [v.offer.profile.slug for v in result.too_small] == ["h200-full"]


def test_a_split_counts_a_cuda_context_on_every_card():
    # The estimate holds one CUDA context; split across N cards, each holds its own.
    card = device_memory(TWO)
    just_fits_two = int(2 * card / HEADROOM) - 10**6   # fits, were one context enough
    result = recommend(just_fits_two, offers((TWO, FREE_NOW)))
    assert result.fitting == ()
    (small,) = result.too_small
    needed = int((just_fits_two + C_CUDA) * HEADROOM + 0.5)
    assert f"{needed / 1e9:.1f} GB needed split" in small.why
    assert "1 more CUDA context" in small.why
    room = int(2 * card / HEADROOM) - C_CUDA - 10**6
    (fit,) = recommend(room, offers((TWO, FREE_NOW))).fitting
    assert fit.split and "1 more CUDA context" in fit.why and "one on each card" in fit.why
    four = dataclasses.replace(TWO, slug="h200-x4", gpu=GpuSpec("H200", None, 4))
    assert recommend(int(4 * card / HEADROOM) - 2 * C_CUDA,
                     offers((four, FREE_NOW))).fitting == ()
    (fit,) = recommend(int(4 * card / HEADROOM) - 3 * C_CUDA - 10**6,
                       offers((four, FREE_NOW))).fitting
    assert "3 more CUDA contexts" in fit.why


def test_when_nothing_fits_the_answer_says_what_to_try():
    result = recommend(500 * 10**9, offers((SLICE, FREE_NOW), (FULL, FREE_NOW)))
    assert result.fitting == () and result.recommended is None
    assert "int4" in result.reason and "checkpointing" in result.reason
    assert [v.offer.profile.slug for v in result.too_small] == ["h200-full", "h200-1g"]


def test_a_gpu_model_of_unknown_memory_is_never_said_to_fit():
    odd = dataclasses.replace(FULL, slug="odd", gpu=GpuSpec("Mystery-GPU", None, 1))
    result = recommend(10**9, offers((odd, FREE_NOW)))
    assert result.fitting == ()
    assert "not known" in result.too_small[0].why


def test_the_answer_says_which_model_it_estimated():
    def said(shape) -> str:
        return estimated_for(Workload(shape=shape, task="inference", precision="bf16",
                                      batch=1, sequence=1024))

    assert said(MODELS["llama-3.2-1b"]) == "Llama 3.2 1B, 1.24 B parameters"
    assert said(MODELS["bert-large-uncased"]) == "BERT large (uncased), 335 M parameters"
    assert said(shape_for_parameters(70 * 10**9)) == (
        "a 70 B-parameter model (a Llama-like shape assumed)")
    assert said(shape_for_parameters(350 * 10**6)).startswith("a 350 M-parameter model")
    assert said(shape_for_parameters(999_700_000_000)).startswith("a 1000 B-parameter")
    assert said(shape_for_parameters(10**13)).startswith("a 10 T-parameter model")
