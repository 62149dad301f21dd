"""api/profiles: the profiles a caller may use, and an admin's changes to them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from gpulease.core.capacity.cluster_availability import (
    Availability,
    cluster_availability,
    host_availability,
    unknown,
)
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.profiles import (
    ProfileError,
    parse_profile,
    parse_profiles_document,
    servers_saving,
    usable_by,
)
from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.views import profile_view


class ProfileAvailability(BaseAPIHandler):
    """What is free of each profile's GPUs, as api/profiles and api/recommend show it."""

    async def _availability(self) -> Callable[[DeviceRequest], Availability]:
        """What is free per GPU request: this host's devices, or in the cluster shape the
        cluster's (the ClusterSource's listing, on the spawner's nodes, behind the queue)."""
        source = self.settings.get("gpulease_cluster")
        if source is None:
            held = set(await asyncio.to_thread(self.ctx.assignments.held))
            return partial(host_availability, self.ctx.inventory, held)
        try:
            listed = await source.listed()
        except Refusal as away:  # the profiles still list; their availability says why
            # The API server's own words (its address, its RBAC refusal naming the
            # ServiceAccount) are for admins; a user learns only that it is away.
            not_known = unknown(away.message if self.is_admin() else
                                "the cluster cannot be read right now; try again shortly")
            return lambda _request: not_known
        queue = await asyncio.to_thread(self.ctx.queue.rows)
        by_slug = {p.slug: p for p in await asyncio.to_thread(self.ctx.profiles.list, True)}
        waiting = tuple(by_slug[q.profile].gpu.device_request() for q in queue
                        if q.profile in by_slug and by_slug[q.profile].gpu)
        inventory = source.spawner_nodes(listed.inventory)
        return lambda request: cluster_availability(request, inventory, (), waiting)


class ProfilesHandler(ProfileAvailability):
    async def get(self):
        model = self.caller()
        admin = self.is_admin()
        profiles = await asyncio.to_thread(self.ctx.profiles.list, admin)
        if not admin:
            groups = set(model.get("groups") or [])
            profiles = [p for p in profiles if p.enabled and usable_by(p, groups)]
        waiting = await asyncio.to_thread(self.ctx.queue.waiting_by_profile)
        availability_of = await self._availability()
        views = [profile_view(p, availability_of(p.gpu.device_request()) if p.gpu else None,
                              admin=admin, queued=waiting.get(p.slug, 0)) for p in profiles]
        self.write_json({"profiles": views})

    async def put(self):
        """Apply a whole profiles document at once: upsert, and with prune delete the rest."""
        self.require_admin()
        body = self.json_body()
        if not isinstance(body, dict) or set(body) - {"profiles", "prune"}:
            raise APIError(400, 'The body must be {"profiles": [...], "prune": false}')
        prune = body.get("prune", False)
        if not isinstance(prune, bool):
            raise APIError(400, "prune must be true or false",
                           [{"field": "prune", "message": "must be a boolean"}])
        if not isinstance(body.get("profiles"), list):
            raise APIError(400, "profiles must be a list of profiles",
                           [{"field": "profiles", "message": "must be a list"}])
        try:
            # Nothing is written unless every profile is valid: errors name
            # "profiles[i] (slug): field".
            profiles = parse_profiles_document({"profiles": body["profiles"]},
                                               self.ctx.catalog, "")
        except ProfileError as e:
            raise Refusal("Invalid profiles: nothing was changed", e.errors) from None
        actor = self.caller()["name"]
        result = await asyncio.to_thread(self.ctx.profiles.apply, profiles, prune, actor)
        self.write_json(
            {"created": result.created, "updated": result.updated,
             "unchanged": result.unchanged, "deleted": result.deleted}
        )


class ProfileHandler(BaseAPIHandler):
    async def put(self, slug: str):
        self.require_admin()
        body = self.json_body()
        if isinstance(body, dict) and "slug" in body and body["slug"] != slug:
            raise APIError(400, f"The body's slug {shown(body['slug'])} differs from the URL's "
                                f"{shown(slug)}",
                           [{"field": "slug", "message": "must be omitted or equal the URL's"}])
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "slug"}
        try:
            profile = parse_profile(body, self.ctx.catalog, slug=slug)
        except ProfileError as e:
            raise Refusal(f"Invalid profile {slug}", e.errors) from None
        actor = self.caller()["name"]
        outcome = await asyncio.to_thread(self.ctx.profiles.upsert, profile, actor)
        self.write_json({"slug": slug, "result": outcome, **profile.to_spec()},
                        201 if outcome == "created" else 200)

    async def delete(self, slug: str):
        """Delete a profile; 409 while servers keep it in their saved options, unless forced."""
        self.require_admin()
        force = self.get_argument("force", "false").lower()
        if force not in ("true", "false", "1", "0", ""):
            raise APIError(400, f"force must be true or false, got {force!r}",
                           [{"field": "force", "message": "must be true or false"}])
        if not await asyncio.to_thread(self.ctx.profiles.exists, slug):
            raise APIError(404, f"No profile {slug}",
                           [{"field": "slug", "message": f"no profile {slug}"}])
        using = servers_saving(await self._all_users(), slug)
        if using and force not in ("true", "1"):
            names = ", ".join(f"{s['user']}/{s['server'] or '(default)'} "
                              f"({'running' if s['running'] else 'stopped'})" for s in using)
            message = (f"Profile {slug} is still saved by {len(using)} server(s): {names}. "
                       "Delete with ?force=true to remove it anyway: those servers then ask "
                       "for a new profile at their next start (running ones keep running).")
            self.write_json({"status": 409, "message": message,
                             "errors": [{"field": "slug", "message": message}],
                             "servers": using}, 409)
            return
        if not await asyncio.to_thread(self.ctx.profiles.delete, slug, self.caller()["name"]):
            raise APIError(404, f"No profile {slug}",
                           [{"field": "slug", "message": f"no profile {slug}"}])
        self.write_json({"slug": slug, "result": "deleted", "servers": using})

    async def _all_users(self) -> list[dict]:
        """Every hub user with their servers, stopped ones included (page by page)."""
        users: list[dict] = []
        paginated = {"Accept": "application/jupyterhub-pagination+json"}
        while True:
            page = await self.hub_call(
                "GET", f"/users?include_stopped_servers=1&offset={len(users)}",
                headers=paginated, doing="list its users' servers")
            users.extend(page["items"])
            if not page["items"] or page["_pagination"].get("next") is None:
                return users
