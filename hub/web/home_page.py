"""The hub's home page: each server's profile and state, and the default-profile form.

Runs in the hub process. The page is rendered server-side from the hub's own
view of the user's servers and gpulease's database (through the shared
context), so it needs no call to the gpulease service — whose OAuth cookie a
hub page does not have. Setting the default profile is a plain form POST to a
hub handler (the hub's cookie and `_xsrf`), validated like the service's
`PUT api/me/default-profile`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from jupyterhub.handlers import BaseHandler
from jupyterhub.utils import url_path_join
from tornado import web

from gpulease.core.billing.my_servers import (
    LastFailure,
    ServerFacts,
    ServerState,
    check_profile_choice,
    server_states,
)
from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import usable_by
from gpulease.core.policy.options import OptionsRefused, price_text
from gpulease.core.units import format_credits, seconds_text
from gpulease.hub.web.template_values import OffLoop
from gpulease.spawners.http_error import http_error
from gpulease.store.failed_starts import FailedStarts
from gpulease.store.identities import IdentityStore
from gpulease.store.sessions import SessionLedger

log = logging.getLogger("gpulease")


@dataclass(frozen=True)
class ProfileChoice:
    slug: str
    display_name: str
    gpu: bool
    price: str  # credits per hour, "1.20"


@dataclass
class HomeData:
    servers: list[ServerState] = field(default_factory=list)
    profiles: list[ProfileChoice] = field(default_factory=list)
    default_profile: str | None = None
    unavailable: bool = False  # gpulease's database did not answer
    identity: str = ""  # who signed in, as the identity provider names them ("" local)

    def cost(self, state: ServerState) -> str:
        return format_credits(state.cost_ucr) if state.cost_ucr is not None else ""

    def rate(self, state: ServerState) -> str:
        if state.rate_per_hour_ucr is None:
            return ""
        return price_text(state.rate_per_hour_ucr)

    def billed(self, state: ServerState) -> str:
        return seconds_text(state.billed_ms) if state.billed_ms is not None else ""

    def started(self, state: ServerState) -> str:
        return state.started.isoformat(timespec="seconds") + "Z" if state.started else ""

    def failed_at(self, state: ServerState) -> str:
        failed = state.failed_start
        return f"{failed.at:%Y-%m-%d %H:%M:%S} UTC" if failed is not None else ""


def user_facts(user: Any) -> list[ServerFacts]:
    """JupyterHub's User wrapper -> the facts of every server, running or not."""
    facts = []
    for name, orm_spawner in user.orm_spawners.items():
        spawner = user.spawners.get(name)
        facts.append(ServerFacts(
            name=name,
            ready=bool(spawner is not None and spawner.ready),
            pending=spawner.pending if spawner is not None else None,
            started=orm_spawner.started,
            user_options=orm_spawner.user_options or None,
        ))
    return facts


def home_data(ctx: Any, name: str, groups: set[str], facts: list[ServerFacts]) -> HomeData:
    """Everything the home page shows about user `name`'s servers (`facts`, read from
    the hub beforehand), from gpulease's database: blocking, run it in a thread. A
    page must render even when the database is away: then only JupyterHub's own
    view is shown."""
    try:
        profiles = ctx.profiles.list(include_disabled=False)
        latest = SessionLedger(ctx.engine).latest_by_server(name)
        default = ctx.profiles.get_default_profile(name)
        positions = {f.name: ctx.queue.position(name, f.name) for f in facts if f.pending}
        bound = IdentityStore(ctx.engine).of_user(name)
        failures = {server: LastFailure(f.at, f.why, f.log_tail)
                    for server, f in FailedStarts(ctx.engine).last_by_server(name).items()}
    except Exception as e:  # noqa: BLE001 - shown as "states unavailable", logged
        log.warning("home page of %s without gpulease's data: %s", name, e)
        return HomeData(servers=server_states(facts, {}, {}, {}, utcnow()), unavailable=True)
    timeouts = {p.slug: p.idle_timeout_s for p in profiles}
    usable = sorted((p for p in profiles if usable_by(p, groups)),
                    key=lambda p: (p.price_per_hour_ucr, p.slug))
    return HomeData(
        servers=server_states(facts, latest, timeouts, positions, utcnow(), failures),
        profiles=[ProfileChoice(p.slug, p.display_name, p.gpu is not None,
                                price_text(p.price_per_hour_ucr)) for p in usable],
        default_profile=default,
        identity=bound.identity.shown() if bound else "",
    )


def home_template_var(get_ctx):
    """template_vars callable: `gpulease_home()` in home.html, computed only when called
    (template vars are built for every hub page), in a worker thread
    (gpulease.hub.web.template_values)."""

    def for_user(user):
        if user is None:
            return None

        def when_called() -> OffLoop[HomeData | None]:
            # The hub's ORM is read here, on the loop; the database in the thread.
            data = partial(home_data, get_ctx(), user.name, {g.name for g in user.groups},
                           user_facts(user))
            return OffLoop(data, fallback=None)

        return when_called

    return for_user


class DefaultProfileFormHandler(BaseHandler):
    """POST /hub/gpulease/default-profile (form field `profile`; empty clears it)."""

    def initialize(self, get_ctx) -> None:
        self.get_gpulease = get_ctx

    @web.authenticated
    async def post(self):
        user = self.current_user
        slug = self.get_body_argument("profile", "").strip() or None
        groups = {g.name for g in user.groups}
        ctx = self.get_gpulease()

        def save():
            if slug is not None:
                check_profile_choice(slug, user=user.name, groups=groups,
                                     profiles=ctx.profiles.list(include_disabled=True),
                                     catalog=ctx.catalog)
            ctx.profiles.set_default_profile(user.name, slug)

        try:
            await asyncio.to_thread(save)
        except OptionsRefused as e:
            raise http_error(e) from None
        self.redirect(url_path_join(self.hub.base_url, "home"))
