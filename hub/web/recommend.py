"""GET /hub/gpulease/recommend: the spawn page's "Which profile does my work need?" panel asks here.

The same answer as the gpulease service's `GET api/recommend` (docs/rest-api.yml), from the
hub itself: the spawn page is a hub page, which has the hub's cookie and no OAuth cookie of
the service. The profiles and what is free of them are the spawn page's own: those the
user whose spawn page it is may start (enabled, in a group the profile allows) and what
that user's default server's spawner counts free (this host's devices, or the cluster's).
A description that cannot be estimated is a 400 in the service's error shape, naming each
field.

The spawn page asks `/hub/gpulease/recommend/<user>` for the user whose page it is: an
admin on /hub/spawn/ada gets ada's profiles, not the admin's own. Only a caller that may
open that user's spawn page may ask for them: JupyterHub's SpawnHandler requires the
`servers` scope on the user (`@needs_scope("servers")`, filtered by `user_name`), and so
does this; a caller without it gets JupyterHub's 404 (or 403). `/hub/gpulease/recommend`
answers for the caller.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial

from jupyterhub.handlers import BaseHandler
from jupyterhub.scopes import needs_scope
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

    @needs_scope("servers")
    def _spawn_page_user(self, user_name: str):
        """`user_name`'s User, for a caller who may open their spawn page (as JupyterHub's
        SpawnHandler decides: the `servers` scope on that user)."""
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        return user

    @web.authenticated
    async def get(self, user_name: str | None = None) -> None:
        user = self.current_user
        if user_name is not None and user_name != user.name:
            user = self._spawn_page_user(user_name)
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
