"""GET /hub/gpulease/recommend: the spawn page's "Which profile does my work need?" panel asks here.

The same answer as the gpulease service's `GET api/recommend` (docs/rest-api.yml), from the
hub itself: the spawn page is a hub page, which has the hub's cookie and no OAuth cookie of
the service. The profiles and what is free of them are the spawn page's own: those the
user may start (enabled, in a group the profile allows) and what the user's default
server's spawner counts free (this host's devices, or the cluster's). A description that
cannot be estimated is a 400 in the service's error shape, naming each field.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulease.core.capacity.cluster_availability import host_availability
from gpulease.core.model.profiles import usable_by
from gpulease.core.policy.memory_estimate import estimate
from gpulease.core.policy.recommend import offer_of, recommend, recommendation_json
from gpulease.core.policy.work_description import workload_from_query
from gpulease.core.refusal import Refusal
from gpulease.spawners.spawn_core import GPULeaseSpawnCore


class RecommendHandler(BaseHandler):
    def initialize(self, get_ctx) -> None:
        self.get_gpulease = get_ctx

    def _json(self, data: dict, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))

    @web.authenticated
    async def get(self) -> None:
        user = self.current_user
        query = {name: self.get_argument(name) for name in self.request.query_arguments}
        try:
            workload = workload_from_query(query)
        except Refusal as refused:
            self._json(refused.body(), refused.status)
            return
        groups = {g.name for g in user.groups}
        # What the spawn page counts free: its spawner's answer (the cluster's in the
        # cluster shape), this host's devices where it gives none.
        spawner = user.get_spawner("")
        availability = (await spawner._form_availability()
                        if isinstance(spawner, GPULeaseSpawnCore) else None)
        ctx = self.get_gpulease()

        def answer() -> dict:
            profiles = [p for p in ctx.profiles.list(include_disabled=False)
                        if usable_by(p, groups)]
            free_of = availability or partial(host_availability, ctx.inventory,
                                              set(ctx.assignments.held()))
            offers = [offer_of(p, free_of(p.gpu.device_request()) if p.gpu else None)
                      for p in profiles]
            result = estimate(workload)
            rec = recommend(result.total, offers)
            return recommendation_json(workload, result, rec, groups,
                                       ctx.queue.waiting_by_profile())

        self._json(await asyncio.to_thread(answer))
