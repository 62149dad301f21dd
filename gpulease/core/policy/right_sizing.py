"""Right-sizing advice (issue 47, item 3): which smaller GPU profile a researcher's recent
sessions would have fitted, and what it would have saved.

Pure. The caller passes the closed sessions of the lookback window (`Thresholds.lookback`)
with the GPU readings kept at close, and the offers as the researcher (or, for the admin
report, anyone) may start them. `advise` names one cheaper profile or None.

Which sessions count: those whose memory readings covered at least `min_coverage` of
their billed time (`judged`): one reading of a ten-hour session says little of its peak.
A session read less is not counted, but its readings still speak against a candidate
where they show it would not have fitted. Advice is never given for a candidate that a
counted session's peak GPU memory would not have fitted.

Readings, as kept at close: activity is a percentage 0-100 of the session's GPU (the
mean over its devices on a multi-GPU profile); peak memory is the session's total over
its devices, so 2× H200 -> 1× H200 compares it with one card's memory. Only GPU memory
and compute are judged: host CPU and memory are not read at close, and a smaller
profile's may be smaller.

The saving is what each counted session was billed (its own rate, on its own tier) less
what the smaller profile would have cost on the same tier (its on-demand price where it
has no price on that tier). Sessions on a tier that is not metered (a reserved unit,
paid for by its reservation) save nothing by the millisecond and add no saving.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from gpulease.core.model.gpu_models import (
    MIG_COMPUTE_SLICES_PER_GPU,
    card_usable_bytes,
    mig_compute_slices,
    mig_usable_bytes,
)
from gpulease.core.model.profiles import Profile
from gpulease.core.tiers import ON_DEMAND, registered
from gpulease.core.units import MS_PER_HOUR, credits_text, ms_cost

GiB = 1024**3


@dataclass(frozen=True)
class SessionUse:
    """One closed session on a profile, with the GPU readings kept at its close."""

    profile: str  # the profile's slug
    billed_ms: int
    mean_activity: float | None = None  # % of the GPU's compute, None: never read
    peak_activity: float | None = None
    peak_memory_bytes: int | None = None  # None: never read
    # How much of the session the readings stood for (gpulease/store/gpu_stats.py).
    activity_read_ms: int = 0
    memory_read_ms: int = 0
    tier: str = ON_DEMAND
    rate_per_hour_ucr: int | None = None  # what it was billed at; None: its profile's offer


@dataclass(frozen=True)
class Offer:
    """A GPU profile as the rule sees it."""

    slug: str
    model: str
    mig: str | None
    count: int
    memory_bytes: int  # what its slices or cards really hold (mig_usable_bytes, card_usable_bytes)
    compute: int  # compute slices: a MIG profile's N of 7 (× count), a full card 7 × count
    rate_per_hour_ucr: int  # on demand
    usable: bool = True  # enabled and usable by whom the advice is for
    # Its prices on the other metered tiers it is offered on, (tier, µcr per hour).
    tier_rates: tuple[tuple[str, int], ...] = ()

    def rate_on(self, tier: str) -> int:
        """The price per hour on `tier`; the on-demand price where it has none there."""
        return dict(self.tier_rates).get(tier, self.rate_per_hour_ucr)

    @property
    def label(self) -> str:
        """What the text calls it: "H200 1g.18gb", "2× H200"."""
        return f"{self.model} {self.mig}" if self.mig else f"{self.count}× {self.model}"


def offer_from(profile: Profile, *, usable: bool | None = None) -> Offer | None:
    """The offer of a GPU profile (None for a CPU-only one, which has nothing to right-size).
    `usable`: whether the researcher may start it; left out, whether it is enabled."""
    gpu = profile.gpu
    if gpu is None:
        return None
    if gpu.mig:
        # what the slice really holds, not its name's round figure
        memory = mig_usable_bytes(gpu.model, gpu.mig) * gpu.count
        compute = mig_compute_slices(gpu.mig) * gpu.count
    else:
        memory = (card_usable_bytes(gpu.model) or 0) * gpu.count
        compute = MIG_COMPUTE_SLICES_PER_GPU * gpu.count
    rates = tuple((t.name, price) for t in registered()
                  if t.metered and t.name != ON_DEMAND
                  and (price := profile.price_of(t.name)) is not None)
    return Offer(slug=profile.slug, model=gpu.model, mig=gpu.mig, count=gpu.count,
                 memory_bytes=memory, compute=compute,
                 rate_per_hour_ucr=profile.price_per_hour_ucr,
                 usable=profile.enabled if usable is None else usable, tier_rates=rates)


@dataclass(frozen=True)
class Thresholds:
    # Peak memory must be at most this share of the smaller profile's memory (what its
    # slice really holds: gpu_models.mig_usable_bytes, not the name's round figure): the
    # CUDA context takes some, and readings every few seconds can miss a short spike.
    memory_headroom: float = 0.90
    # "Would not be slower" when every session's mean activity scaled to the smaller
    # compute (mean × current compute / candidate compute) stays at most this: below it
    # the work left the slices idle part of the time, so fewer of them keep up.
    busy_activity: float = 0.80
    # Below this mean activity a session counts as idle in the admin report: a notebook
    # left open, its kernel waiting.
    idle_activity: float = 0.05
    # At least this many sessions and hours before advising: one or two sessions say little
    # about a workload, and the saving of a few minutes is not worth a notice.
    min_sessions: int = 3
    min_hours: float = 1.0
    # The window the caller takes sessions from: recent enough to be today's workload.
    lookback: dt.timedelta = dt.timedelta(days=30)
    # The share of counted sessions that must fit: all ("never advice that would not have
    # fit"). Lower it only knowingly: the sessions that would not have fit are left out of
    # the saving, and the text says how many fitted.
    fit_share: float = 1.0
    # A session counts only where its memory readings stood for at least this share of
    # its billed time; its activity judges the speed only where its activity readings did.
    # At a reading every 10 s, half an hour's session needs 90 of its 180 readings.
    min_coverage: float = 0.5

    def __post_init__(self) -> None:
        for name in ("memory_headroom", "busy_activity", "idle_activity", "fit_share",
                     "min_coverage"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be more than 0 and at most 1")
        if self.min_sessions < 1 or self.min_hours < 0:
            raise ValueError("min_sessions must be at least 1 and min_hours not negative")


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Advice:
    profile: str  # the smaller profile's slug
    saved_ucr: int
    sessions: int  # counted on the current profile
    hours: float
    fitted: int  # sessions that would have fitted (all of them by default)
    slower_up_to: float | None  # None: not slower; else the compute ratio
    speed_known: bool  # whether the readings (or equal compute) judged the speed
    text: str


@dataclass(frozen=True)
class ProfileUse:
    """One profile's sessions, for admins setting layouts and prices."""

    profile: str
    sessions: int
    hours: float
    mean_activity: float | None  # % : mean of the sessions' means (those read)
    p95_activity: float | None  # % : nearest-rank 95th percentile of the same
    idle_share: float | None  # of sessions read: mean activity under idle_activity
    # of the sessions whose memory was read well enough (judged): their peak fits a smaller
    # offer; None where none was
    fits_smaller_share: float | None
    advice: str | None  # the slug `advise` names for all of them together


def _covered(read_ms: int, use: SessionUse, t: Thresholds) -> bool:
    return read_ms > 0 and read_ms >= t.min_coverage * use.billed_ms


def judged(use: SessionUse, t: Thresholds) -> bool:
    """Whether the session's memory readings covered enough of it to count."""
    return use.peak_memory_bytes is not None and _covered(use.memory_read_ms, use, t)


def _mean(use: SessionUse, t: Thresholds) -> float | None:
    """The mean activity where its readings covered enough of the session, else None."""
    return use.mean_activity if _covered(use.activity_read_ms, use, t) else None


def _limit(offer: Offer, t: Thresholds) -> Fraction:
    # Exact: Fraction("0.9") is 9/10, so "just over 90 %" is over by one byte.
    return Fraction(str(t.memory_headroom)) * offer.memory_bytes


def _fits(use: SessionUse, offer: Offer, t: Thresholds) -> bool:
    return judged(use, t) and use.peak_memory_bytes <= _limit(offer, t)  # type: ignore[operator]


def _shown_over(use: SessionUse, offer: Offer, t: Thresholds) -> bool:
    """Whatever the coverage, a peak read over the limit shows it would not have fitted."""
    return use.peak_memory_bytes is not None and use.peak_memory_bytes > _limit(offer, t)


def _smaller(current: Offer, offers: Iterable[Offer]) -> list[Offer]:
    """Offers of the same GPU model, usable, cheaper, and no larger in memory or compute,
    cheapest first (ties: more memory, then slug). Another model's slices do not compare:
    their speed per slice differs."""
    found = [o for o in offers
             if o.usable and o.slug != current.slug and o.model == current.model
             and o.rate_per_hour_ucr < current.rate_per_hour_ucr
             and o.memory_bytes <= current.memory_bytes and o.compute <= current.compute]
    return sorted(found, key=lambda o: (o.rate_per_hour_ucr, -o.memory_bytes, o.slug))


def _speed(uses: Sequence[SessionUse], every: Sequence[SessionUse], current: Offer,
           candidate: Offer, t: Thresholds) -> tuple[bool, float | None] | None:
    """(speed known, slower up to) for the candidate; None where a reading shows it would
    be slower (the saving, reckoned at the same length, would not be real).

    `uses`: the sessions counted; `every`: all on the profile, whose well-read activity
    speaks against a candidate even where their memory was read too little to count them.
    Known and not slower: every counted session's mean activity was read and, scaled to
    the candidate's compute, stays under `busy_activity`, and no peak scaled passes
    100 %. A scaled peak over 100 %: known, but its busiest moments run up to the
    compute ratio slower. A mean not read: not known; it may run up to the ratio slower."""
    ratio = current.compute / candidate.compute
    if ratio <= 1:
        return True, None  # as many slices: no slower whatever the activity
    if any(a is not None and a / 100 * ratio > t.busy_activity
           for a in (_mean(u, t) for u in every)):
        return None
    if any(_mean(u, t) is None for u in uses):
        return False, ratio
    peaks = [u.peak_activity for u in every
             if u.peak_activity is not None and _mean(u, t) is not None]
    if any(p / 100 * ratio > 1 for p in peaks):
        return True, ratio
    return True, None


def _times(ratio: float) -> str:
    return f"{round(ratio, 1):g}×"


def _text(last: int, uses: Sequence[SessionUse], fitted: Sequence[SessionUse],
          current: Offer, target: Offer, saved: int, speed: tuple[bool, float | None],
          t: Thresholds) -> str:
    peak = max(u.peak_memory_bytes or 0 for u in uses) / GiB
    means = [_mean(u, t) for u in uses]
    read = [a for a in means if a is not None]
    compute = (f", and averaged at most {max(read):.0f} % of its compute" if len(read) == len(uses)
               else "")
    counted = (f"Your last {len(uses)} sessions on {current.label}" if len(uses) == last
               else f"{len(uses)} of your last {last} sessions on {current.label} (those "
                    "the GPU readings covered)")
    of = "" if len(fitted) == len(uses) else f" {len(fitted)} of them"
    text = (f"{counted} peaked at {peak:.1f} GiB of GPU memory{compute}: {target.label} "
            f"would have fitted{of} and saved {credits_text(saved)} credits")
    known, slower = speed
    if slower is not None:
        text += (f" (fits in memory; may run up to {_times(slower)} slower)" if not known
                 else f" (its busiest moments may run up to {_times(slower)} slower)")
    return text + "."


def _saving(use: SessionUse, current: Offer, candidate: Offer) -> int:
    """What the session would have saved on the candidate, on the tier it ran on: each
    billed once over its whole length (ms_cost), rounded as gpulease rounds it."""
    if not any(t.name == use.tier and t.metered for t in registered()):
        return 0  # paid for otherwise (a reservation): nothing saved by the millisecond
    rate = current.rate_on(use.tier) if use.rate_per_hour_ucr is None else use.rate_per_hour_ucr
    return ms_cost(use.billed_ms, rate) - ms_cost(use.billed_ms, candidate.rate_on(use.tier))


def advise(uses: Iterable[SessionUse], current: Offer, offers: Iterable[Offer],
           t: Thresholds = DEFAULT_THRESHOLDS) -> Advice | None:
    """The cheapest smaller offer (see `_smaller`) the sessions on `current` would have
    fitted, or None. `uses`: the researcher's sessions of the lookback window; those on
    other profiles are not counted, nor those read too little (`judged`). A candidate is
    passed over where any session's readings show it would not have fitted, or its
    activity, scaled to the candidate's compute, shows it would have been slower; where
    activity was not read, the advice says how much slower it may be (the compute ratio)."""
    on_current = [u for u in uses if u.profile == current.slug]
    mine = [u for u in on_current if judged(u, t)]
    ms = sum(u.billed_ms for u in mine)
    if len(mine) < t.min_sessions or ms < t.min_hours * MS_PER_HOUR:
        return None
    for candidate in _smaller(current, offers):
        if t.fit_share >= 1 and any(_shown_over(u, candidate, t) for u in on_current):
            continue
        fitted = [u for u in mine if _fits(u, candidate, t)]
        if not fitted or len(fitted) < t.fit_share * len(mine):
            continue
        speed = _speed(mine, on_current, current, candidate, t)
        if speed is None:
            continue
        saved = sum(_saving(u, current, candidate) for u in fitted)
        if saved <= 0:
            continue
        known, slower = speed
        return Advice(profile=candidate.slug, saved_ucr=saved, sessions=len(mine),
                      hours=ms / MS_PER_HOUR, fitted=len(fitted), slower_up_to=slower,
                      speed_known=known,
                      text=_text(len(on_current), mine, fitted, current, candidate, saved,
                                 speed, t))
    return None


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def profile_report(uses_by_profile: Mapping[str, Sequence[SessionUse]],
                   offers: Sequence[Offer],
                   t: Thresholds = DEFAULT_THRESHOLDS) -> list[ProfileUse]:
    """Per GPU profile with sessions (by slug): how busy and how oversized it was, across
    all researchers. `offers`: as admins see them (usable: enabled). Shares are of sessions,
    not of hours: a profile mostly opened and left idle shows as such however long the
    one busy session ran."""
    by_slug = {o.slug: o for o in offers}
    report = []
    for slug in sorted(uses_by_profile):
        current, uses = by_slug.get(slug), list(uses_by_profile[slug])
        if current is None or not uses:
            continue  # a CPU-only or removed profile: nothing to right-size
        read = [a for a in (_mean(u, t) for u in uses) if a is not None]
        smaller = _smaller(current, offers)
        judged_uses = [u for u in uses if judged(u, t)]
        fits = sum(1 for u in judged_uses if any(_fits(u, o, t) for o in smaller))
        advice = advise(uses, current, offers, t)
        report.append(ProfileUse(
            profile=slug, sessions=len(uses),
            hours=sum(u.billed_ms for u in uses) / MS_PER_HOUR,
            mean_activity=sum(read) / len(read) if read else None,
            p95_activity=_p95(read) if read else None,
            idle_share=(sum(1 for a in read if a / 100 < t.idle_activity) / len(read)
                        if read else None),
            fits_smaller_share=fits / len(judged_uses) if judged_uses else None,
            advice=advice.profile if advice else None))
    return report
