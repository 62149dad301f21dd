"""HTTP handlers of the gpulease hub service (`/services/gpulease/`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

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
from gpulease.hub.caller_rights import (
    has_hub_admin_powers,
)
from gpulease.hub.identities import IdentityStore
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.views import cluster_inventory_view, inventory_view, profile_view
from gpulease.spawners.cluster_availability import (
    Availability,
    cluster_availability,
    host_availability,
    unknown,
)
from gpulease.store.accounts import AccountError, validate_password, validate_username
from gpulease.store.sessions import SessionLedger


async def current_inventory(handler: BaseAPIHandler) -> dict[str, Any]:
    """GET api/inventory's answer (the admin page shows the same): the embedded shape's
    devices, or in the cluster shape (a ClusterSource in the settings) the cluster form."""
    queue = await asyncio.to_thread(handler.ctx.queue.rows)
    source = handler.settings.get("gpulease_cluster")
    if source is not None:  # 502/503 refusals naming the cause when it cannot be listed
        listed = await source.listed()
        return cluster_inventory_view(listed.inventory, listed.at, source.namespace, queue)
    held = await asyncio.to_thread(handler.ctx.assignments.held)
    isolation = handler.settings.get("gpulease_isolation", {})
    open_sessions = await asyncio.to_thread(SessionLedger(handler.ctx.engine).open_sessions)
    tiers = {(s.user, s.server): s.tier for s in open_sessions}
    active = await asyncio.to_thread(handler.ctx.reservations.active)
    return inventory_view(handler.ctx.inventory, held, queue, isolation, tiers, active)


class InventoryHandler(BaseAPIHandler):
    async def get(self):
        self.require_auditor()
        self.write_json(await current_inventory(self))


class ProfilesHandler(BaseAPIHandler):
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


class UsersHandler(BaseAPIHandler):
    async def post(self):
        """Create a local account and its hub user (admins only)."""
        self.require_admin()
        body = self.json_body()
        if not isinstance(body, dict):
            raise APIError(400, 'The body must be {"name": ..., "password": ..., "admin": false}')
        unknown = set(body) - {"name", "password", "admin"}
        if unknown:
            raise APIError(400, f"Unknown fields: {', '.join(sorted(unknown))}; "
                                "allowed: name, password, admin")
        errors = []
        name, password, admin = body.get("name"), body.get("password"), body.get("admin", False)
        try:
            name = validate_username(name if isinstance(name, str) else "")
        except AccountError as e:
            errors.append({"field": "name", "message": str(e)})
        try:
            validate_password(password if isinstance(password, str) else "", str(name))
        except AccountError as e:
            errors.append({"field": "password", "message": str(e)})
        if not isinstance(admin, bool):
            errors.append({"field": "admin", "message": "must be true or false"})
        if errors:
            raise APIError(400, "Invalid user", errors)
        # JupyterHub lets only a hub admin grant admin: that is asked of the
        # caller, whose own token makes the admin (docs/security.md); the
        # service itself is no hub admin.
        caller_token = self.hub_auth.get_token(self, in_cookie=False) if admin else None
        if admin and not caller_token:
            raise APIError(403, "Making a hub admin needs a hub admin's API token in the "
                                "Authorization header (the gpulease CLI sends one)",
                           [{"field": "admin", "message": "needs a hub admin's token"}])
        await self._refuse_taking_over_an_admin(name)
        bound = await asyncio.to_thread(IdentityStore(self.ctx.engine).of_user, name)
        if bound is not None:  # a password would sign in as them where local login is on
            message = (f"user name {name!r} belongs to {bound.identity.shown()}, who signs "
                       "in through the identity provider; choose another name")
            raise APIError(409, message, [{"field": "name", "message": message}])
        try:
            await asyncio.to_thread(self.ctx.accounts.create, name, password)
        except AccountError as e:
            raise APIError(409, str(e), [{"field": "name", "message": str(e)}]) from None
        try:
            await self._create_hub_user(name, caller_token)
        except Refusal:
            # Nothing half-written: without its hub user the account is useless.
            await asyncio.to_thread(self.ctx.accounts.delete, name)
            raise
        # Never the password: who created which account, and whether an admin.
        await asyncio.to_thread(self.ctx.audit.record, self.caller()["name"], "user.create",
                                f"user:{name}", None, {"name": name, "admin": admin})
        result: dict[str, Any] = {"name": name, "admin": admin}
        result.update(await asyncio.to_thread(
            make_unix_account, name, self.settings.get("gpulease_isolation", {})))
        self.write_json(result, 201)

    async def _refuse_taking_over_an_admin(self, name: str) -> None:
        """A hub user may exist without a local account (made on the hub's own
        admin page or API, or by admin_users). Giving an existing hub admin an
        account sets its password: only a hub admin may do that, as JupyterHub
        lets only admins modify admins; a gpulease admin by group may not, nor
        a hub admin's narrowed token."""
        if has_hub_admin_powers(self.caller()):
            return
        existing = await self.hub_call("GET", f"/users/{name}",
                                       doing=f"say whether user {name} exists",
                                       answers={404: lambda _: None})
        if existing and existing.get("admin"):
            raise APIError(403, f"{name} is a hub admin already: only a hub admin may give it "
                                f"a gpulease account and password, and "
                                f"{self.caller().get('name')} is not one",
                           [{"field": "name", "message": "an existing hub admin"}])

    async def _create_hub_user(self, name: str, admin_token: str | None) -> None:
        """The hub user; an admin only through `admin_token`, the calling hub admin's."""
        as_caller = {"Authorization": f"token {admin_token}"} if admin_token else None
        not_admin = {403: lambda _: Refusal(
            f"Cannot make {name} a hub admin: only a hub admin may, and "
            f"{self.caller().get('name')} is not one; create the user without admin, or ask "
            "a hub admin", [("admin", "only a hub admin may grant admin")], status=403)
        } if admin_token else {}
        made = await self.hub_call(
            "POST", f"/users/{name}", {"admin": True} if admin_token else None,
            headers=as_caller, doing=f"create user {name}",
            answers={**not_admin, 409: lambda _: None})  # a hub user of that name may exist
        if made is None and admin_token:
            await self.hub_call("PATCH", f"/users/{name}", {"admin": True}, headers=as_caller,
                                doing=f"make user {name} an admin", answers=not_admin)


def make_unix_account(name: str, isolation: dict) -> dict[str, str]:
    """The user's Unix account and home, made now rather than at the first start.

    A failure does not undo the hub user: the first start tries again and
    says why it cannot; the answer carries the reason for the CLI to show.
    """
    if not isolation.get("unix_accounts") or not isolation.get("homes"):
        return {}
    from pathlib import Path

    from gpulease.host.state import StateDir, StateError, ensure_home
    from gpulease.host.unix_accounts import (
        UnixAccountError,
        UnixAccountPolicy,
        ensure_unix_account,
        own_home,
    )

    homes = Path(isolation["homes"])
    try:
        policy = UnixAccountPolicy(isolation["unix_prefix"], isolation["unix_uid_min"],
                                   isolation["unix_uid_max"])
        home = ensure_home(StateDir(homes.parent), name)
        account = ensure_unix_account(name, policy, home)
        own_home(home, account)
    except (UnixAccountError, StateError, OSError, KeyError) as e:
        return {"unix_account_error": str(e)}
    return {"unix_account": account.name, "uid": str(account.uid)}


class RootHandler(BaseAPIHandler):
    """The service's root: the hub checks it is up; people and scripts see what it is."""

    def get(self):
        from gpulease import __version__

        self.write_json({"service": "gpulease", "version": __version__, "api": "api/"})


class NotFoundHandler(BaseAPIHandler):
    def prepare(self):
        raise APIError(404, f"No such gpulease API path: {self.request.path}")





