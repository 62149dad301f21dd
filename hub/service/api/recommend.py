"""`GET api/recommend`: the GPU memory a described piece of work needs, and the profiles it fits.

The description is the query (gpulease/core/policy/work_description.py); the estimate
is gpulease/core/policy/memory_estimate.py's, every part with how it was computed;
the profiles are those the caller may start, as the spawn page offers them (enabled,
and in a group the profile allows), with what is free of each now as api/profiles
counts it; gpulease/core/policy/recommend.py decides which fit, cheapest first. The
spawn page asks the hub's own `gpulease/recommend` (hub/web/recommend.py) for the
same answer: a hub page has no OAuth cookie of this service.
"""

from __future__ import annotations

import asyncio

from gpulease.core.model.profiles import usable_by
from gpulease.core.policy.memory_estimate import estimate
from gpulease.core.policy.recommend import offer_of, recommend, recommendation_json
from gpulease.core.policy.work_description import workload_from_query
from gpulease.hub.service.api.profiles import ProfileAvailability


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
        self.write_json(recommendation_json(workload, result, rec, groups, queued))


ROUTES = [(r"api/recommend", RecommendHandler)]
