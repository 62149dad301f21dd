"""Which profiles a piece of work fits, cheapest first: the answer of `GET api/recommend`.

Given the memory estimate of the work (`policy/memory_estimate.py`) and the GPU
profiles the caller may use, each with what is free of it now, a profile fits
when its GPU memory holds the estimate with headroom: HEADROOM x the estimate.
The headroom is 1.25 because the estimate is checked to within 25 % of
published measurements: the worst under-estimate among the check rows is
-19.6 %, a run that needed 1.244 x the estimate. A device's memory is what a
program can count on: a MIG slice's as `gpu_models.mig_usable_bytes` gives it
(the driver's listing, below the name's round figure), a card's as
`gpu_models.card_usable_bytes` gives it (nvidia-smi's total where published, else
93 % of the nominal size).

A profile of one device (a MIG slice or one card) fits when that device holds
the need. A profile of N cards fits when one card does (the work runs on one of
them: it is listed, after the one-card profiles of the same price); or when the
N cards together do, and then only if the work is split across them (sharded
weights, `device_map="auto"`, FSDP, tensor parallelism): it is marked `split`.
The estimate holds one CUDA context, and a split needs one on every card, so the
N cards must hold HEADROOM x (the estimate + (N - 1) x C_CUDA); beyond that the
estimate does not count what splitting costs (communication buffers, a layer
that does not divide evenly).

Fitting profiles are listed cheapest first (on-demand price per hour), then
those needing no split, then the smaller device. The one recommended is the
cheapest fitting profile with a device free now; if none is free, the cheapest
fitting one (a start waits in the queue). Pure functions over dataclasses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulease.core.capacity.cluster_availability import FREE, Availability
from gpulease.core.model.gpu_models import card_usable_bytes, mig_usable_bytes
from gpulease.core.model.profiles import Profile, spot_usable_by
from gpulease.core.policy.memory_estimate import C_CUDA, Estimate, Workload
from gpulease.core.units import format_credits

HEADROOM = 1.25


@dataclass(frozen=True)
class Offer:
    """A GPU profile as the recommendation sees it."""

    profile: Profile
    device_bytes: int | None  # one device's memory (None: a GPU model not in the table)
    availability: Availability | None

    @property
    def count(self) -> int:
        gpu = self.profile.gpu
        return 1 if gpu is None or gpu.mig else gpu.count


def device_memory(profile: Profile) -> int | None:
    """The memory of one of the profile's devices: what its MIG slice holds, or its card."""
    if profile.gpu is None:
        return None
    if profile.gpu.mig:
        return mig_usable_bytes(profile.gpu.model, profile.gpu.mig)
    return card_usable_bytes(profile.gpu.model)


def offer_of(profile: Profile, availability: Availability | None) -> Offer:
    return Offer(profile, device_memory(profile), availability)


@dataclass(frozen=True)
class Verdict:
    offer: Offer
    fits: bool
    split: bool          # fits only with the work split across the profile's cards
    why: str


@dataclass(frozen=True)
class Recommendation:
    estimate_bytes: int
    needed_bytes: int                   # HEADROOM x the estimate
    fitting: tuple[Verdict, ...]        # cheapest first
    too_small: tuple[Verdict, ...]      # GPU profiles that do not fit, largest first
    recommended: str | None             # a fitting profile's slug
    reason: str


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def _device(offer: Offer) -> str:
    gpu = offer.profile.gpu
    assert gpu is not None
    return f"a {gpu.model} {gpu.mig} slice" if gpu.mig else f"one {gpu.model}"


def split_needed(needed: int, count: int, headroom: float = HEADROOM) -> int:
    """What `count` cards must hold together to run work that needs `needed` bytes on one
    (its headroom included) split across them: one more CUDA context on each other card."""
    return needed + int((count - 1) * C_CUDA * headroom + 0.5)


def verdict(offer: Offer, needed: int, headroom: float = HEADROOM) -> Verdict:
    """Whether `offer` holds `needed` bytes, and why (or why not)."""
    device = offer.device_bytes
    if device is None:
        model = offer.profile.gpu.model if offer.profile.gpu else "?"
        return Verdict(offer, False, False,
                       f"the memory of a {model} is not known to gpulease")
    if device >= needed:
        return Verdict(offer, True, False,
                       f"{_device(offer)} has {_gb(device)}, {_gb(needed)} needed")
    count = offer.count
    if count == 1:
        return Verdict(offer, False, False,
                       f"{_device(offer)} has {_gb(device)}, {_gb(needed)} needed")
    split = split_needed(needed, count, headroom)
    contexts = (f"{count - 1} more CUDA context{'s' if count > 2 else ''} of "
                f"{_gb(C_CUDA)}, one on each card")
    if device * count >= split:
        return Verdict(offer, True, True,
                       f"{count} cards have {_gb(device * count)} together, {_gb(split)} "
                       f"needed split across them ({contexts}): only with the work split "
                       f"(one has {_gb(device)}, {_gb(needed)} needed on one)")
    return Verdict(offer, False, False,
                   f"{count} cards have {_gb(device * count)}, {_gb(split)} needed split "
                   f"across them ({contexts}); one has {_gb(device)}")


def _free_now(offer: Offer) -> bool:
    shown = offer.availability
    return shown is not None and shown.state == FREE and shown.free > 0


def recommend(estimate_bytes: int, offers: Sequence[Offer],
              headroom: float = HEADROOM) -> Recommendation:
    """The GPU profiles among `offers` that hold `estimate_bytes` with headroom, cheapest
    first, and the one to start (module docstring). CPU-only profiles are left out."""
    needed = int(estimate_bytes * headroom + 0.5)
    verdicts = [verdict(offer, needed, headroom) for offer in offers
                if offer.profile.gpu is not None]
    fitting = sorted((v for v in verdicts if v.fits),
                     key=lambda v: (v.offer.profile.price_per_hour_ucr, v.split,
                                    v.offer.device_bytes or 0, v.offer.profile.slug))
    too_small = sorted((v for v in verdicts if not v.fits),
                       key=lambda v: (-(v.offer.device_bytes or 0) * v.offer.count,
                                      v.offer.profile.slug))
    head = (f"the work needs about {_gb(estimate_bytes)}; with {headroom:g}x headroom "
            f"{_gb(needed)}")
    if not fitting:
        return Recommendation(estimate_bytes, needed, (), tuple(too_small), None,
                              f"No profile you may use fits: {head}. Try a lower precision "
                              "(int8, int4), LoRA or QLoRA, a smaller batch or sequence, or "
                              "activation checkpointing.")
    free = [v for v in fitting if _free_now(v.offer)]
    chosen = free[0] if free else fitting[0]
    profile = chosen.offer.profile
    if free and chosen is fitting[0]:
        now = "and it has a device free now"
    elif free:
        now = (f"and it has a device free now (the cheaper {fitting[0].offer.profile.slug} "
               "would wait in the queue)")
    else:
        now = "but nothing that fits is free now: a start waits in the queue"
    reason = (f"{profile.display_name} ({profile.slug}) is the cheapest profile that fits: "
              f"{head}; {chosen.why}, {now}.")
    return Recommendation(estimate_bytes, needed, tuple(fitting), tuple(too_small),
                          profile.slug, reason)


# --- the answer as JSON (api/recommend, and the hub's gpulease/recommend for the spawn page) --

def _parameters_text(count: int) -> str:
    """1,235,814,400 -> "1.24 B"; 70,000,000,000 -> "70 B"; 350,000,000 -> "350 M"."""
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6)):
        if count >= size:
            text = f"{count / size:.3g}"
            return f"{text if 'e' not in text else f'{count / size:.0f}'} {unit}"
    return f"{count:,}"


def estimated_for(w: Workload) -> str:
    """What was estimated, in words a person checks at a glance: "Llama 3.2 1B, 1.24 B
    parameters", or "a 70 B-parameter model (a Llama-like shape assumed)"."""
    shape = w.shape
    count = _parameters_text(shape.parameters)
    if shape.assumed:
        return f"a {count}-parameter model (a Llama-like shape assumed)"
    return f"{shape.name}, {count} parameters"


def _workload_json(w: Workload) -> dict[str, Any]:
    shape = w.shape
    model = {"name": shape.name, "key": shape.key or None, "parameters": shape.parameters,
             "layers": shape.layers, "hidden": shape.hidden, "heads": shape.heads,
             "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "vocab": shape.vocab,
             "source": shape.source, "assumed": shape.assumed}
    view: dict[str, Any] = {"model": model, "task": w.task, "precision": w.precision,
                            "batch": w.batch, "sequence": w.sequence}
    if w.task != "inference":
        view.update(checkpointing=w.checkpointing, optimizer=w.optimizer)
    if w.task in ("lora", "qlora"):
        view["lora_rank"] = w.lora_rank
    return view


def _profile_json(v: Verdict, groups: set[str], queued: Mapping[str, int]) -> dict[str, Any]:
    profile = v.offer.profile
    gpu = profile.gpu
    assert gpu is not None
    view: dict[str, Any] = {
        "slug": profile.slug, "display_name": profile.display_name,
        "gpu": {"model": gpu.model, **({"mig": gpu.mig} if gpu.mig else {"count": gpu.count})},
        "device_bytes": v.offer.device_bytes, "fits": v.fits, "split": v.split, "why": v.why,
        "price_per_hour": format_credits(profile.price_per_hour_ucr)}
    if profile.offers_spot and spot_usable_by(profile, groups):
        view["spot_price_per_hour"] = format_credits(profile.spot_price_per_hour_ucr or 0)
    shown = v.offer.availability
    if shown is not None:
        view["availability"] = {"free": shown.free, "total": shown.total,
                                "queued": queued.get(profile.slug, 0), "state": shown.state,
                                **({"why": shown.why} if shown.why else {})}
    return view


def recommendation_json(w: Workload, result: Estimate, rec: Recommendation, groups: set[str],
                        queued: Mapping[str, int]) -> dict[str, Any]:
    """The answer of api/recommend (docs/rest-api.yml, Recommendation)."""
    return {
        "estimated_for": estimated_for(w),
        "workload": _workload_json(w),
        "estimate": {"bytes": result.total,
                     "parts": [{"name": p.name, "bytes": p.bytes, "how": p.how}
                               for p in result.parts]},
        "headroom": HEADROOM,
        "needed_bytes": rec.needed_bytes,
        "profiles": [_profile_json(v, groups, queued) for v in rec.fitting],
        "too_small": [_profile_json(v, groups, queued) for v in rec.too_small],
        "recommended": rec.recommended,
        "reason": rec.reason,
    }
