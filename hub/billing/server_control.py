"""The hub's side of the billing heartbeat: JupyterHub's servers, seen and stopped from inside.

`HubServerControl` implements `gpulease.hub.billing.metering.HubServers` over the
running JupyterHub app: which servers run, polling one, stopping one as the
REST API's DELETE would (a pending start included: its spawn is cancelled
first), and killing one whose stop does not complete. The decisions of what
to stop and when to kill are `gpulease.core.billing.enforcement`'s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from jupyterhub import orm

from gpulease.core.billing.enforcement import RunningServer
from gpulease.core.model.profiles import option_value
from gpulease.core.policy.options import rate_for
from gpulease.core.tiers import ON_DEMAND, REQUESTABLE, RESERVED

log = logging.getLogger("gpulease.metering")

# How long a cancelled pending start may take to unwind before the stop goes on
# (JupyterHub's own DELETE waits a second).
CANCEL_WAIT_S = 2.0


def saved_meter_facts(ctx: Any, user: str, options: dict | None, server: str = "",
                      groups: set[str] | frozenset[str] = frozenset(),
                      ) -> tuple[str, str, int, str, int | None] | None:
    """(profile, account, rate, tier, reservation) of a server from its saved options
    (blocking: a thread).

    For a server this hub did not start (a restart): the saved profile at its
    price now, charged to the saved account, else the user's own; a server whose
    devices were claimed on a reservation still active, and whose user still holds it
    (its own account, or a group in `groups`), runs on it (tier reserved).
    None when no profile is known (the caller logs it).
    """
    slug = option_value(options, "profile") or ctx.profiles.get_default_profile(user)
    profile = ctx.profiles.get(slug) if slug else None
    if profile is None:
        return None
    account = option_value(options, "account") or f"user:{user}"
    if ":" not in account:
        account = f"user:{account}"
    claimed = {h.reservation_id for h in ctx.assignments.held().values()
               if (h.user, h.server) == (user, server) and h.reservation_id is not None}
    holds = {f"user:{user}"} | {f"group:{g}" for g in groups}
    for r in ctx.reservations.active():
        if r.id in claimed and r.account in holds:
            return profile.slug, r.account, 0, RESERVED, r.id
    saved = option_value(options, "tier")
    tier = saved if saved in REQUESTABLE and profile.offers(saved) else ON_DEMAND
    return profile.slug, account, rate_for(profile, tier), tier, None


class HubServerControl:
    """HubServers over a running JupyterHub (an instance of GPULeaseHub)."""

    def __init__(self, app: Any, ctx: Any):
        self.app = app
        self.ctx = ctx
        # The stops this object started; the event loop holds tasks only weakly.
        self._stops: dict[tuple[str, str], asyncio.Task] = {}

    def _spawner(self, user_name: str, server_name: str) -> Any | None:
        orm_user = orm.User.find(self.app.db, user_name)
        if orm_user is None:
            return None
        return self.app.users[orm_user].spawners.get(server_name)

    def is_active(self, user: str, server: str) -> bool:
        spawner = self._spawner(user, server)
        return spawner is not None and bool(spawner.active)

    async def is_running(self, user: str, server: str) -> bool:
        spawner = self._spawner(user, server)
        if spawner is None or not spawner.active:
            return False
        return await spawner.poll() is None

    async def running(self) -> list[RunningServer]:
        out: list[RunningServer] = []
        unknown: list[tuple[Any, dict | None]] = []
        metered = self.ctx.meter.live if self.ctx.meter is not None else {}
        for user in list(self.app.users.values()):
            for spawner in list(user.spawners.values()):
                # Ready: JupyterHub counts it as running. A session being opened
                # right now (at its launch) is not a gap.
                if not spawner.ready or getattr(spawner, "_gpulease_opening", False):
                    continue
                key = (user.name, spawner.name)
                # Ready without a session may also be gone since JupyterHub last
                # polled (a poll that closed its session does not tell JupyterHub):
                # such a server needs no session, or one would bill a dead server
                # from its first answer again, over the session that already did.
                if key not in metered and await spawner.poll_and_notify() is not None:
                    continue
                choice = getattr(spawner, "gpulease_choice", None)
                launched = getattr(spawner, "gpulease_launched_at", None)
                started = spawner.orm_spawner.started if spawner.orm_spawner else None
                if choice is not None:
                    out.append(RunningServer(key, choice.profile.slug, choice.account,
                                             choice.rate_per_hour_ucr, launched,
                                             started, choice.tier, choice.reservation_id))
                else:
                    unknown.append((spawner, dict(spawner.orm_spawner.user_options or {})))
        for spawner, options in unknown:
            key = (spawner.user.name, spawner.name)
            if key in metered:
                continue  # only the few without a session need their profile looked up
            groups = {g.name for g in spawner.user.groups}  # the hub's ORM: on the loop
            facts = await asyncio.to_thread(saved_meter_facts, self.ctx, key[0], options, key[1],
                                            groups)
            if facts is None:
                log.error("%s runs with no billing session and no known profile (saved "
                          "options %s); it cannot be metered: stop it or fix its profile",
                          spawner._log_name, options or "none")
                continue
            slug, account, rate, tier, reservation = facts
            out.append(RunningServer(key, slug, account, rate,
                                     getattr(spawner, "gpulease_launched_at", None),
                                     spawner.orm_spawner.started, tier, reservation))
        return out

    async def stop(self, user_name: str, server_name: str) -> None:
        """Stop a server as JupyterHub's DELETE would, its pending start included."""
        key = (user_name, server_name)
        running = self._stops.get(key)
        if running is not None and not running.done():
            return  # one stop at a time; the heartbeat kills one that hangs
        orm_user = orm.User.find(self.app.db, user_name)
        if orm_user is None:
            return
        user = self.app.users[orm_user]
        spawner = user.spawners.get(server_name)
        if spawner is None or not spawner.active or spawner.pending == "stop":
            return  # gone, or someone else's stop is in flight

        async def stop() -> None:
            try:
                if spawner.pending:  # a start in flight: cancel it, as DELETE does
                    log.warning("interrupting the pending %s of %s to stop it", spawner.pending,
                                spawner._log_name)
                    future = spawner._spawn_future
                    if future is not None and not future.done():
                        future.cancel()
                        await asyncio.wait([future], timeout=CANCEL_WAIT_S)
                await self.app.proxy.delete_user(user, server_name)
                await user.stop(server_name)
            except Exception:
                log.exception("could not stop %s (tried again next heartbeat)",
                              spawner._log_name)

        task = asyncio.ensure_future(stop())
        self._stops[key] = task
        task.add_done_callback(lambda t: self._stops.pop(key, None) if
                               self._stops.get(key) is t else None)

    async def kill(self, user_name: str, server_name: str) -> int:
        spawner = self._spawner(user_name, server_name)
        if spawner is None:
            return 0
        kill_now = getattr(spawner, "kill_now", None)
        if kill_now is None:
            log.error("cannot kill %s: its spawner has no kill_now", spawner._log_name)
            return 0
        return await kill_now()
