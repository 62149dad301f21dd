"""`GET api/recommend`: the GPU memory a described piece of work needs, and the profiles it fits.

The description is the query (gpulease/core/policy/work_description.py); the estimate
is gpulease/core/policy/memory_estimate.py's, every part with how it was computed;
the profiles are those the caller may start, as the spawn page offers them (enabled,
and in a group the profile allows), with what is free of each now as api/profiles
counts it; gpulease/core/policy/recommend.py decides which fit, cheapest first.
"""

from __future__ import annotations

import asyncio

from gpulease.core.model.profiles import Profile, spot_usable_by, usable_by
from gpulease.core.policy.memory_estimate import Estimate, Workload, estimate
from gpulease.core.policy.recommend import HEADROOM, Recommendation, Verdict, offer_of, recommend
from gpulease.core.policy.work_description import workload_from_query
from gpulease.core.units import format_credits
from gpulease.hub.service.api.profiles import ProfileAvailability


def _workload_view(w: Workload) -> dict:
    shape = w.shape
    model = {"name": shape.name, "key": shape.key or None, "parameters": shape.parameters,
             "layers": shape.layers, "hidden": shape.hidden, "heads": shape.heads,
             "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "vocab": shape.vocab,
             "source": shape.source, "assumed": shape.assumed}
    view = {"model": model, "task": w.task, "precision": w.precision, "batch": w.batch,
            "sequence": w.sequence}
    if w.task != "inference":
        view.update(checkpointing=w.checkpointing, optimizer=w.optimizer)
    if w.task in ("lora", "qlora"):
        view["lora_rank"] = w.lora_rank
    return view


def _estimate_view(result: Estimate) -> dict:
    return {"bytes": result.total,
            "parts": [{"name": p.name, "bytes": p.bytes, "how": p.how} for p in result.parts]}


def _profile_view(v: Verdict, groups: set[str], queued: dict[str, int]) -> dict:
    profile: Profile = v.offer.profile
    gpu = profile.gpu
    assert gpu is not None
    view = {"slug": profile.slug, "display_name": profile.display_name,
            "gpu": {"model": gpu.model, **({"mig": gpu.mig} if gpu.mig else
                                          {"count": gpu.count})},
            "device_bytes": v.offer.device_bytes, "fits": v.fits, "split": v.split,
            "why": v.why, "price_per_hour": format_credits(profile.price_per_hour_ucr)}
    if profile.offers_spot and spot_usable_by(profile, groups):
        view["spot_price_per_hour"] = format_credits(profile.spot_price_per_hour_ucr or 0)
    shown = v.offer.availability
    if shown is not None:
        view["availability"] = {"free": shown.free, "total": shown.total,
                                "queued": queued.get(profile.slug, 0), "state": shown.state,
                                **({"why": shown.why} if shown.why else {})}
    return view


def recommendation_view(w: Workload, result: Estimate, rec: Recommendation, groups: set[str],
                        queued: dict[str, int]) -> dict:
    return {
        "workload": _workload_view(w),
        "estimate": _estimate_view(result),
        "headroom": HEADROOM,
        "needed_bytes": rec.needed_bytes,
        "profiles": [_profile_view(v, groups, queued) for v in rec.fitting],
        "too_small": [_profile_view(v, groups, queued) for v in rec.too_small],
        "recommended": rec.recommended,
        "reason": rec.reason,
    }


class RecommendHandler(ProfileAvailability):
    async def get(self):
        caller = self.caller()
        query = {name: self.get_argument(name) for name in self.request.query_arguments}
        workload = workload_from_query(query)
        result = estimate(workload)
        groups = set(caller.get("groups") or [])
        # What the spawn page offers this caller: enabled profiles of a group they are in.
        profiles = [p for p in await asyncio.to_thread(self.ctx.profiles.list, False)
                    if p.enabled and usable_by(p, groups)]
        availability_of = await self._availability()
        offers = [offer_of(p, availability_of(p.gpu.device_request()) if p.gpu else None)
                  for p in profiles]
        queued = await asyncio.to_thread(self.ctx.queue.waiting_by_profile)
        rec = recommend(result.total, offers)
        self.write_json(recommendation_view(workload, result, rec, groups, queued))


ROUTES = [(r"api/recommend", RecommendHandler)]
