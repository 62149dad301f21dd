"""Admitting a start: resolving the profile choice and checking credit, before launch.

JupyterHub 6.1 saves a start's `user_options` before any spawner code runs,
so a refused start would overwrite the server's saved profile. The ORM hook
below remembers what they were, tagged with the asyncio task that replaced
them, so that only a refusal in that same start puts them back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jupyterhub import orm
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import object_session

from gpulease.core.billing.holds import Hold, held_on
from gpulease.core.billing.rules import LOW_BALANCE_MINUTES, minutes_left
from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import saved_profile
from gpulease.core.policy.cpu_totals import (
    CpuOnlyServer,
    cpu_only_refusal,
    parse_cores_cap,
    parse_memory_cap,
)
from gpulease.core.policy.options import (
    CHOSEN_BY_REQUEST,
    ServerChoice,
    options_summary,
    plain_options,
    resolve_user_options,
    resolved_options,
    why_chosen,
)
from gpulease.core.policy.user_names import name_problem
from gpulease.core.refusal import Refusal
from gpulease.core.tiers import ON_DEMAND, RESERVED, is_preemptible
from gpulease.core.units import format_credits, format_duration, rate_cost

if TYPE_CHECKING:
    from gpulease.core.capacity.reservation_rules import Reservation
    from gpulease.core.model.profiles import Profile
    from gpulease.spawners.context import GPULeaseContext
    from gpulease.spawners.local.spawner import LocalGPUSpawner

DATABASE_DOWN = (
    "gpulease's database cannot be reached, so no device can be placed safely; "
    "running servers are not affected. Try again in a minute or tell your hub admin."
)


@event.listens_for(orm.Spawner.user_options, "set", active_history=True)
def _remember_prior_options(target, value, oldvalue, initiator) -> None:
    """Keep what a server's saved options were before this request replaced them.

    Tagged with the asyncio task that replaced them, so that only a refusal in
    that same start restores them (an empty-body start replaced nothing).
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    prior = None if oldvalue in (None,) or not isinstance(oldvalue, dict) else dict(oldvalue)
    target._gpulease_prior_options = (task, prior)


async def apply_gpulease_options(spawner: LocalGPUSpawner, user_options: Any) -> None:
    """Spawner.apply_user_options hook: validate and resolve the profile choice."""
    orm_spawner = spawner.orm_spawner
    prior = getattr(orm_spawner, "_gpulease_prior_options", None)
    orm_spawner._gpulease_prior_options = None
    replaced_now = prior is not None and prior[0] is asyncio.current_task()
    spawner._options_to_restore = (prior[1],) if replaced_now else None
    problem = name_problem(spawner.user.name)  # a user made before the rule: no home for it
    if problem:
        spawner.refuse(Refusal(f"Cannot start a server for this user: {problem}. An admin "
                               "can rename the user (docs/admin.md, User names)"))
    ctx = spawner.gpulease
    # Not counted with the profile of its last run by other starts (cpu_only_servers).
    spawner.gpulease_choice = None
    user = spawner.user.name
    # Read the hub's ORM here, on its own thread, not in the worker thread below.
    groups = {g.name for g in spawner.user.groups}
    server = spawner.name

    def still_spawning() -> bool:  # JupyterHub's flags: the spawn has not ended
        return bool(spawner._spawn_pending or spawner._start_pending)

    def resolve_and_check_credit() -> tuple[ServerChoice, list[Profile]]:
        profiles = ctx.profiles.list(include_disabled=True)
        asked = user_options.get("profile") if isinstance(user_options, dict) else None
        # Only a profile that is gone needs the audit log's word on whether it was deleted.
        gone = isinstance(asked, str) and asked not in {p.slug for p in profiles}
        choice = resolve_user_options(
            user_options,
            user=user,
            user_groups=groups,
            profiles=profiles,
            catalog=ctx.catalog,
            default_profile=ctx.profiles.get_default_profile(user),
            # the ledger names accounts "group:NAME"; options speaks of group names
            group_accounts={a.partition(":")[2] for a in ctx.ledger.group_accounts()},
            deleted_profiles=ctx.profiles.deleted_slugs() if gone else frozenset(),
        )
        # A holder's start takes a free unit of their reservation (not billed by the millisecond);
        # the options saved stay the on-demand choice, for a resume after the period.
        run_as = on_reservation(choice, user, server, holding, in_use) or choice
        admit_for_credit(ctx, (user, server), run_as, {p.slug: p.min_run_s for p in profiles},
                         alive=still_spawning)
        spawner.gpulease_balance = ctx.ledger.balance(run_as.account)
        return choice, run_as, profiles

    try:
        # The reservations this user holds now, and who runs on their units (the shape's
        # runner knows: claimed devices, or labelled pods and admitted starts).
        accounts = {f"user:{user}"} | {f"group:{g}" for g in groups}
        holding = [r for r in await asyncio.to_thread(ctx.reservations.active)
                   if r.account in accounts]
        in_use = await spawner._queue_runner().reservation_use() if holding else {}
        choice, run_as, profiles = await asyncio.to_thread(resolve_and_check_credit)
    except Refusal as refused:  # the options (OptionsRefused) or the credit (BillingError)
        spawner.refuse(refused)
    except SQLAlchemyError as e:
        spawner.log.error("gpulease database error resolving options: %s", e)
        spawner.refuse(Refusal(DATABASE_DOWN, status=503))
    if choice.profile.is_cpu_only:
        # On the event loop, with no await until the choice is set: starts at once are
        # checked one after the other, each counting those before it.
        refusal = cpu_only_refusal(
            user, server, choice.profile.cpu, choice.profile.memory_bytes,
            cpu_only_servers(spawner, {p.slug: p for p in profiles}),
            parse_cores_cap(spawner.cpu_only_cpu_per_user),
            parse_memory_cap(spawner.cpu_only_memory_per_user))
        if refusal is not None:
            spawner.refuse(Refusal(refusal, status=409))
    spawner.gpulease_choice = run_as
    if choice.chosen_by != CHOSEN_BY_REQUEST:
        _save_resolved(spawner, resolved_options(choice))
    elif orm_spawner.user_options != (plain := plain_options(user_options)):
        # Lists of one (the REST API takes a form's shape too) are saved as plain strings:
        # the culler read {"profile": ["short"]} as no profile, so no max_runtime applied.
        _save_resolved(spawner, plain)
    spawner.log.info("%s: %s (%s)", spawner._log_name, options_summary(run_as), choice.chosen_by)


def on_reservation(choice: ServerChoice, user: str, server: str,
                   holding: Sequence[Reservation],
                   in_use: Mapping[int, set[tuple[str, str]]]) -> ServerChoice | None:
    """`choice` on a free unit of a reservation its user holds (tier reserved), or None.

    `holding`: the active reservations whose account is the user's own or a group they
    are in; `in_use`: the servers on each reservation's units (the shape's runner checks
    again when it admits). Of several: the one of the account the start chose, then the
    user's own, then the one that ends first. An on-demand start only: spot is asked for.
    """
    if choice.tier != ON_DEMAND or choice.profile.gpu is None:
        return None
    gpu = choice.profile.gpu
    # (the kind too: a profile whose GPU an admin changed since is another kind of device)
    kind = (gpu.model, gpu.mig) if gpu.mig else (gpu.model, None)
    per_unit = 1 if gpu.mig else gpu.count
    candidates = [r for r in holding if r.profile == choice.profile.slug and r.kind == kind
                  and r.per_unit == per_unit]
    free = [r for r in candidates
            if r.units > len(set(in_use.get(r.id, ())) - {(user, server)})]
    if not free:
        return None
    best = min(free, key=lambda r: (r.account != choice.account, r.account != f"user:{user}",
                                    r.holds_until(), r.id))
    return replace(choice, tier=RESERVED, reservation_id=best.id, account=best.account)


def cpu_only_servers(spawner: LocalGPUSpawner,
                     profiles: dict[str, Profile]) -> list[CpuOnlyServer]:
    """The user's other running and starting CPU-only servers, at their profiles' size.

    A start counts once past this check (its choice is set then); one still
    before it counts when it makes its own check, against this one. A server
    the hub found running after a restart has only its saved options (the
    profile as defined now).
    """
    found = []
    for name, other in list(spawner.user.spawners.items()):
        if other is spawner or not other.active:
            continue
        choice = getattr(other, "gpulease_choice", None)
        if choice is not None:
            profile = choice.profile
        elif other.pending:
            continue
        else:
            saved = other.orm_spawner.user_options if other.orm_spawner is not None else None
            profile = profiles.get(saved_profile(saved) or "")  # a list of one too
        if profile is not None and profile.is_cpu_only:
            found.append(CpuOnlyServer(name, profile.cpu, profile.memory_bytes))
    return found


def admit_for_credit(ctx: GPULeaseContext, key: tuple[str, str], choice: ServerChoice,
                     min_run_s: dict[str, int], alive: Callable[[], bool]) -> None:
    """Check credit and hold the start's minimum run, as one step (gpulease.core.billing.holds).

    Runs in a worker thread; the lock serialises the starts of this hub process,
    so starts sent at once cannot together spend more than the balance. The
    hold lasts while `alive()` and until the server's session opens.
    """
    profile, (user, _server), account = choice.profile, key, choice.account
    rate = choice.rate_per_hour_ucr
    needed = rate_cost(profile.min_run_s, rate)
    holds = ctx.holds
    with holds.lock:
        pending = holds.on(account)
        paid = needed > 0 or rate > 0
        runs = ctx.ledger.open_runs(account) if paid else []  # a free start is never refused
        ctx.ledger.check_start(
            account, user, needed,
            what=f"{profile.slug}'s minimum run of {format_duration(profile.min_run_s)}",
            rate_per_hour_ucr=rate,
            held=held_on(pending, runs, min_run_s),
            member_held=held_on(pending, runs, min_run_s, user=user),
        )
        if needed > 0:
            holds.add(Hold(key, account, needed, utcnow(), alive=alive))


def _save_resolved(spawner: LocalGPUSpawner, resolved: dict[str, str]) -> None:
    """Save what a start resolved, as the server's user_options: the profile, image and
    account of a start that named no profile, a request's own options as plain strings.

    The culler, pages, usage, the API and a later empty-body resume then all
    read the same profile. A refusal later in this start (limits, queue) puts
    back what was saved before, through LocalGPUSpawner.refuse.
    """
    orm_spawner = spawner.orm_spawner
    before = orm_spawner.user_options
    if spawner._options_to_restore is None:
        spawner._options_to_restore = (dict(before) if isinstance(before, dict) else None,)
    orm_spawner.user_options = resolved
    orm_spawner._gpulease_prior_options = None  # this write is not a request's
    spawner.user_options = dict(resolved)
    session = object_session(orm_spawner)
    if session is not None:
        session.commit()


def start_events(choice: ServerChoice, balance_ucr: int) -> list[dict]:
    """The spawn progress's first words: what starts, at what price, on which account,
    why (an empty-body start, as VS Code sends, is told what it got), and a low balance."""
    profile = choice.profile
    why = why_chosen(choice)
    spot = (f" on the {choice.tier} tier (it may be interrupted for an on-demand start, with "
            "notice to save; the home is kept)") if is_preemptible(choice.tier) else ""
    if choice.tier == RESERVED:
        spot = (f" on a unit of reservation {choice.reservation_id} (paid for by it, not by "
                "the millisecond)")
    events = [{"progress": 10,
               "message": f"Starting {profile.display_name} ({choice.image.name}) at "
                          f"{format_credits(choice.rate_per_hour_ucr)} credits/h{spot}, charged "
                          f"to {choice.account}" + (f"; {why}" if why else "")}]
    left = minutes_left(balance_ucr, choice.rate_per_hour_ucr)
    if left is not None and left < LOW_BALANCE_MINUTES:
        events.append({"progress": 20,
                       "message": f"Low balance: {format_credits(balance_ucr)} credits on "
                                  f"{choice.account}, about {left} min at this price. The "
                                  "server stops when the balance reaches zero."})
    return events
