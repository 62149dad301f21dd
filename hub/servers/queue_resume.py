"""Queued spawns carried over a hub restart, in both shapes.

JupyterHub forgets a pending spawn when its process ends, but the `spawn_queue`
rows it was waiting on stay (a killed hub removes nothing; a hub stopping with
Ctrl-C or SIGTERM keeps them on purpose, QueueStore.keep_rows), and so does the
server's `user_options`, which JupyterHub saved before any of gpulease's code ran.
At start-up the new hub starts each of them again, in the rows' order, with those
options, so that they wait in its queue in the same order and start as capacity
frees.

`plan_resume` is the rule (pure): which rows start again, with which options, and
which are skipped and why (the user deleted, the named server deleted, the server
running or starting already, its profile deleted, disabled or no longer allowed to
the user). `resume_queued` is the I/O, run by GPULeaseHub once it is fully up.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpulease.core.model.profiles import Profile, saved_profile, usable_by
from gpulease.store.queue_store import QueuedSpawn, QueueStore

if TYPE_CHECKING:
    from jupyterhub.app import JupyterHub

    from gpulease.spawners.context import GPULeaseContext

# How long one start may take to be back in the queue (or admitted, or refused)
# before the next one is sent anyway.
SETTLE_S = 60.0


@dataclass(frozen=True)
class ServerNow:
    """What the new hub knows of a queued row's user and server."""

    user_exists: bool
    server_exists: bool = True  # a named server deleted: False (the default always exists)
    active: bool = False  # running or starting already
    saved_options: dict | None = None
    user_groups: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Resume:
    user: str
    server: str
    profile: str
    options: dict


@dataclass(frozen=True)
class Skip:
    user: str
    server: str
    profile: str
    why: str

    def message(self) -> str:
        return (f"Queued start of {self.user}/{self.server or '(default)'} ({self.profile}), "
                f"left by the previous hub, is not started again: {self.why}")


def plan_resume(rows: Sequence[QueuedSpawn], servers: Mapping[tuple[str, str], ServerNow],
                profiles: Mapping[str, Profile]) -> list[Resume | Skip]:
    """Each row, in queue order: start it again (with its options) or skip it (why).

    The options are the server's saved ones when they name the row's profile
    (they carry the image and account chosen too), else just that profile. What
    the rule lets through still goes through the normal admission: rights,
    credit, limits, the queue.
    """
    out: list[Resume | Skip] = []
    for row in sorted(rows, key=lambda r: r.position):
        now = servers.get((row.user, row.server), ServerNow(user_exists=False))
        profile = profiles.get(row.profile)
        why = (
            "the user no longer exists" if not now.user_exists
            else "the named server no longer exists" if not now.server_exists
            else "the server is running or starting already" if now.active
            else f"profile {row.profile} no longer exists" if profile is None
            else f"profile {row.profile} is disabled" if not profile.enabled
            else f"profile {row.profile} is no longer allowed to {row.user} (groups: "
                 f"{', '.join(profile.groups)})" if not usable_by(profile, set(now.user_groups))
            else None
        )
        if why is not None:
            out.append(Skip(row.user, row.server, row.profile, why))
            continue
        saved = now.saved_options
        options = dict(saved) if saved and saved_profile(saved) == row.profile else {
            "profile": row.profile}
        out.append(Resume(row.user, row.server, row.profile, options))
    return out


# --- I/O -------------------------------------------------------------------------------


def server_now(app: JupyterHub, user: str, server: str) -> ServerNow:
    """What the hub's ORM says of `user`/`server` (on the event loop's thread)."""
    from jupyterhub import orm

    orm_user = orm.User.find(app.db, user)
    if orm_user is None:
        return ServerNow(user_exists=False)
    orm_spawner = orm_user.orm_spawners.get(server)
    if orm_spawner is None and server:
        return ServerNow(user_exists=True, server_exists=False)
    spawner = app.users[orm_user].spawners.get(server)
    active = spawner is not None and bool(spawner.active)
    saved = orm_spawner.user_options if orm_spawner is not None else None
    return ServerNow(True, True, active, dict(saved) if isinstance(saved, dict) else None,
                     frozenset(g.name for g in orm_user.groups))


async def resume_queued(app: JupyterHub, ctx: GPULeaseContext, rows: Sequence[QueuedSpawn],
                        token: str, log: logging.Logger, settle_s: float = SETTLE_S) -> None:
    """Start again the spawns the previous hub left queued, one after the other.

    Each goes through the hub's own REST API (POST users/NAME/servers/SERVER) with
    the gpulease service's token, so it takes JupyterHub's whole spawn path — the
    concurrent-spawn and named-server limits, the proxy route once it runs, the
    spawn progress — and gpulease's admission, as a user's start does. Calling
    `User.spawn` in-process instead would skip the request handler's bookkeeping
    (BaseHandler.spawn_single_user adds the proxy route and watches the pending
    spawn), which is JupyterHub's and not a stable interface.

    The next one is sent only once this one waits in the queue again, was
    admitted, or was answered (a refusal: its message is logged).
    """
    await resume_in_order(
        rows, partial(server_now, app), ctx.queue, partial(ctx.profiles.list, True),
        partial(_start_again, app, ctx, token=token, log=log, settle_s=settle_s), log)


def resume_then_serve(app: JupyterHub, ctx: GPULeaseContext, rows: Sequence[QueuedSpawn],
                      token: str, log: logging.Logger, *, embedded: bool) -> asyncio.Future:
    """resume_queued, then, on the embedded box, one pass over the queue: a preemption
    the meter restored that no start came back for is taken back there (nothing else
    passes when nobody waits). Until the rows are all back no restored preemption is
    taken back: a spot start resumed first must not undo one made for an on-demand
    start not yet resumed."""
    if ctx.meter is not None and rows:
        ctx.meter.queue_resuming = True
    return asyncio.ensure_future(_resume_then_serve(app, ctx, rows, token, log, embedded))


async def _resume_then_serve(app: JupyterHub, ctx: GPULeaseContext,
                             rows: Sequence[QueuedSpawn], token: str, log: logging.Logger,
                             embedded: bool) -> None:
    from gpulease.spawners.queueing.runner import runner_for  # the embedded shape's runner

    try:
        if rows:
            await resume_queued(app, ctx, rows, token, log)
    finally:
        meter = ctx.meter
        if meter is not None:
            meter.queue_resuming = False
            if meter.preempting and embedded:
                await runner_for(ctx).serve()
            elif meter.preempting:  # the cluster's runners (DRA mode preempts itself)
                from gpulease.spawners.kube.cluster_runner import runners_of

                for runner in runners_of(ctx):
                    await runner.serve()


async def resume_in_order(rows: Sequence[QueuedSpawn], now_of: Callable[[str, str], ServerNow],
                          queue: QueueStore, profiles_of: Callable[[], Sequence[Profile]],
                          start_again: Callable[[Resume], Awaitable[None]],
                          log: logging.Logger) -> None:
    """The rows in order, each decided (plan_resume) just before it is started again.

    The users are on the new hub while the rows before theirs start, which takes a
    while: one may start the server herself, stop it, or delete the named server
    meanwhile. So what the hub knows of a server (`now_of`, on the event loop's
    thread) and the profiles are read at its turn, not all at once, and only the
    previous hub's row itself goes: a row the server's own start has since is
    the queue's, not this step's, to remove.
    """
    for row in sorted(rows, key=lambda r: r.position):
        now = now_of(row.user, row.server)
        profiles = {p.slug: p for p in await asyncio.to_thread(profiles_of)}
        step = plan_resume([row], {(row.user, row.server): now}, profiles)[0]
        # The previous hub's row goes; the admission adds this hub's, at the end.
        await asyncio.to_thread(queue.remove_row, row)
        if isinstance(step, Skip):
            log.warning(step.message())
            continue
        try:
            await start_again(step)
        except Exception:
            log.exception("starting again the queued start of %s/%s", step.user, step.server)


async def _start_again(app: JupyterHub, ctx: GPULeaseContext, step: Resume, *, token: str,
                       log: logging.Logger, settle_s: float) -> None:
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    name = f"{step.user}/{step.server or '(default)'}"
    path = (f"users/{quote(step.user)}/servers/{quote(step.server)}" if step.server
            else f"users/{quote(step.user)}/server")
    request = HTTPRequest(
        f"{app.hub.api_url.rstrip('/')}/{path}", method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        body=json.dumps({"user_options": step.options}), request_timeout=settle_s + 600)
    answer = asyncio.ensure_future(AsyncHTTPClient().fetch(request, raise_error=False))
    _keep(answer)
    log.info("Starting again %s (%s), queued before the hub restarted", name, step.profile)
    deadline = asyncio.get_running_loop().time() + settle_s
    while not answer.done():
        if await asyncio.to_thread(ctx.queue.position, step.user, step.server) is not None:
            log.info("%s waits in the queue again", name)
            return
        if _admitted(app, step.user, step.server):
            log.info("%s was admitted at once", name)
            return
        if asyncio.get_running_loop().time() > deadline:
            log.warning("%s: not settled after %.0f s; starting the next", name, settle_s)
            return
        await asyncio.wait({answer}, timeout=0.2)
    response = answer.result()
    if response.code >= 400:
        log.warning("%s, started again, was refused (%s): %s", name, response.code,
                    _message(response.body))


def _admitted(app: JupyterHub, user: str, server: str) -> bool:
    """Past gpulease's limits and queue and still starting (gpulease's own flag)."""
    try:
        spawner = app.users[user].spawners.get(server)
    except KeyError:  # deleted meanwhile
        return False
    return bool(spawner is not None and spawner.pending == "spawn"
                and getattr(spawner, "_gpulease_admitted", False))


def _message(body: bytes | None) -> str:
    try:
        data: Any = json.loads(body or b"")
        return str(data.get("message", data))
    except (ValueError, AttributeError):
        return (body or b"").decode(errors="replace")[:500]


_answers: set[asyncio.Future] = set()


def _keep(future: asyncio.Future) -> None:
    # The event loop keeps only weak references: a queued start's answer (202) comes later.
    _answers.add(future)
    future.add_done_callback(_answers.discard)
