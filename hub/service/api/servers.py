"""Researchers' own servers: POST api/servers, api/me/default-profile, GET api/me/servers.

JupyterHub's own `PUT /users/{name}/servers/{server}` stores `user_options`
without looking at them; `POST api/servers` validates them first (profile
exists and the user may use it, image offered by it, account allowed), then
stores them through that hub API, so an empty-body start later runs exactly
the profile saved here (how VS Code, which sends no body, gets a GPU).
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyterhub.slugs import is_valid_safe_slug
from tornado import web
from tornado.escape import url_escape

from gpulease.core.billing.my_servers import ServerFacts, check_profile_choice, server_states
from gpulease.core.clock import utcnow
from gpulease.core.policy.options import OptionsRefused, resolve_user_options
from gpulease.core.refusal import Refusal
from gpulease.hub.service.api.billing import BillingHandler
from gpulease.hub.service.errors import APIError
from gpulease.store.sessions import SessionLedger

SERVER_NAME_RULE = ("server names are 1-30 characters: lowercase ASCII letters, digits and "
                    "single hyphens, starting with a letter and ending with a letter or digit "
                    "(e.g. train-1)")
POST_KEYS = ("name", "user_options", "user", "replace")


class ServerAPIHandler(BillingHandler):
    async def subject(self, requested: Any, readonly: bool = False) -> str:
        """Whose servers: the caller's own, or `requested` when the caller is an admin
        (or an auditor, for `readonly`)."""
        me = self.caller()
        if requested is not None and not isinstance(requested, str):
            raise APIError(400, "user must be a user name",
                           [{"field": "user", "message": "must be a string"}])
        if requested and requested != me["name"]:
            if not (self.is_auditor() if readonly else self.is_admin()):
                raise APIError(403, "Only gpulease admins may act on another user's servers"
                                    + (" (auditors may read them)" if readonly else ""),
                               [{"field": "user", "message": "must be your own name"}])
            return requested
        if me.get("kind", "user") != "user":
            raise APIError(400, f"{me.get('name')} is a service, with no servers of its own: "
                                "name the user", [{"field": "user", "message": "required"}])
        return me["name"]


class CreateServerHandler(ServerAPIHandler):
    """POST api/servers {"name", "user_options", "user"?, "replace"?}: create, don't start."""

    async def post(self):
        body = self.json_body()
        if not isinstance(body, dict):
            raise APIError(400, 'The body must be {"name": SERVER, "user_options": {...}}')
        unknown = sorted(str(k) for k in body if k not in POST_KEYS)
        if unknown:
            raise APIError(400, f"Unknown fields: {', '.join(unknown)}; allowed: "
                                f"{', '.join(POST_KEYS)}",
                           [{"field": k, "message": "unknown field"} for k in unknown])
        user = await self.subject(body.get("user"))
        name = body.get("name")
        if not isinstance(name, str) or not is_valid_safe_slug(name):
            raise APIError(400, f"Invalid server name {name!r}: {SERVER_NAME_RULE}",
                           [{"field": "name", "message": SERVER_NAME_RULE}])
        replace = body.get("replace", False)
        if not isinstance(replace, bool):
            raise APIError(400, "replace must be true or false",
                           [{"field": "replace", "message": "must be a boolean"}])
        model = await self.hub_user(user)
        options = await self.validated_options(user, model.get("groups") or [],
                                               body.get("user_options"))
        existing = (model.get("servers") or {}).get(name)
        path = f"/users/{url_escape(user, plus=False)}/servers/{name}"
        if existing is not None:
            if not replace:
                raise APIError(409, f"{user} already has a server named {name}; choose another "
                                    'name, or send "replace": true to replace the saved options '
                                    "of a stopped server",
                               [{"field": "name", "message": "exists already"}])
            if existing.get("ready") or existing.get("pending"):
                raise APIError(409, f"Server {name} of {user} is running or starting; stop it "
                                    "before replacing its options",
                               [{"field": "name", "message": "not stopped"}])
            await self.call_hub("PATCH", path, {"user_options": options})
            self.write_json({"user": user, "name": name, "user_options": options}, 200)
            return
        await self.call_hub("PUT", path, {"user_options": options})
        self.write_json({"user": user, "name": name, "user_options": options}, 201)

    async def validated_options(self, user: str, groups: list[str], given: Any) -> dict:
        """What to save: the request's options, checked, with the resolved profile named."""
        ctx = self.ctx
        if given is None:
            given = {}

        def resolve():
            return resolve_user_options(
                given, user=user, user_groups=set(groups),
                profiles=ctx.profiles.list(include_disabled=True), catalog=ctx.catalog,
                default_profile=ctx.profiles.get_default_profile(user),
                group_accounts={a.partition(":")[2] for a in ctx.ledger.group_accounts()},
            )

        try:
            choice = await asyncio.to_thread(resolve)
        except OptionsRefused as e:  # its fields are the options': user_options.<key>
            raise e.under("user_options", whole="user_options") from None
        saved = {}
        for key, value in given.items():
            value = value[0] if isinstance(value, list) and len(value) == 1 else value
            if value:
                saved[key] = value
        # Pin the profile: an empty-body start of this server runs it, even after
        # the user's default profile changes.
        saved["profile"] = choice.profile.slug
        return saved

    async def call_hub(self, method: str, path: str, body: dict) -> Any:
        # 409 names the limit of named servers (gpulease.hub.web.named_servers) or a clash
        return await self.hub_call(method, path, body, doing="store the server", answers={
            400: lambda m: Refusal.of_field("name", m, 400),
            409: lambda m: Refusal.of_field("name", m, 409),
            404: lambda m: Refusal(m, status=404)})


class DefaultProfileHandler(ServerAPIHandler):
    """GET/PUT api/me/default-profile: the profile of a server's first empty-body start."""

    async def get(self):
        user = await self.subject(self.get_argument("user", None), readonly=True)
        slug = await asyncio.to_thread(self.ctx.profiles.get_default_profile, user)
        self.write_json({"user": user, "profile": slug})

    async def put(self):
        body = self.json_body()
        if not isinstance(body, dict) or "profile" not in body:
            raise APIError(400, 'The body must be {"profile": SLUG} (or {"profile": null} '
                                "to clear it)")
        unknown = sorted(str(k) for k in body if k not in ("profile", "user"))
        if unknown:
            raise APIError(400, f"Unknown fields: {', '.join(unknown)}; allowed: profile, user")
        user = await self.subject(body.get("user"))
        slug = body["profile"]
        if slug is not None:
            if not isinstance(slug, str) or not slug:
                raise APIError(400, "profile must be a profile slug or null",
                               [{"field": "profile", "message": "must be a string or null"}])
            model = await self.hub_user(user)
            ctx = self.ctx
            try:
                await asyncio.to_thread(
                    lambda: check_profile_choice(
                        slug, user=user, groups=model.get("groups") or [],
                        profiles=ctx.profiles.list(include_disabled=True), catalog=ctx.catalog))
            except OptionsRefused as e:  # about the one field of this body
                raise Refusal.of_field("profile", e.message, e.status) from None
        await asyncio.to_thread(self.ctx.profiles.set_default_profile, user, slug)
        self.write_json({"user": user, "profile": slug})


class MyServersHandler(ServerAPIHandler):
    """GET api/me/servers: each server's profile and state (running with its cost so far,
    queued with its position, suspended with why, pending, stopped)."""

    async def get(self):
        user = await self.subject(self.get_argument("user", None), readonly=True)
        model = await self.hub_user(user)
        facts = [ServerFacts.from_model({**srv, "name": name})
                 for name, srv in (model.get("servers") or {}).items()]
        self.write_json({"user": user,
                         "servers": [s.to_json() for s in await self.states(user, facts)]})

    async def states(self, user: str, facts: list[ServerFacts]):
        ctx = self.ctx

        def gather():
            latest = SessionLedger(ctx.engine).latest_by_server(user)
            timeouts = {p.slug: p.idle_timeout_s for p in ctx.profiles.list()}
            positions = {f.name: ctx.queue.position(user, f.name) for f in facts if f.pending}
            return server_states(facts, latest, timeouts, positions, utcnow())

        # A database error answers 503 naming it (BaseAPIHandler.write_error).
        return await asyncio.to_thread(gather)


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/servers", CreateServerHandler),
    (r"api/me/default-profile", DefaultProfileHandler),
    (r"api/me/servers", MyServersHandler),
]
