"""Preempting spot servers: the adapter around the pure rules.

On the embedded box gpulease chooses the victims (preempt_for); in the cluster
shape kube-scheduler does, and gpulease tells them and ends their sessions
(tell_preempted, from spawners/kube/cluster_preemption.py's reading of their pods).

At each pass over the queue (QueueRunner.serve), every waiting on-demand start
that spot servers hold the room for gets it, in the queue's order: the servers
the rule (gpulease/core/capacity/preemption.py, plan_preemptions) chooses are told at once (a
`preemption_warning` notice with its deadline: JupyterLab's banner and the hub's pages show it) and
given `grace_s` seconds to save; the meter then stops each with reason
`preempted`, billed up to the deadline (gpulease.hub.billing.metering.Meter.preempt).
Their devices come back like any stop's, and the queue's next pass places the
waiting start. Devices of servers already being preempted count as coming free
(to the first start that can use them), so one start never preempts twice.

A holder's start that neither free devices nor spot servers make room for
displaces on-demand servers standing in reserved capacity (displace, the rule in
gpulease/core/capacity/displacement.py), in both shapes, the same way: told, then stopped at
the deadline with reason `preempted`; one displacement at a time (`displacing`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from gpulease.core.billing.enforcement import PREEMPTED
from gpulease.core.capacity.displacement import Displacement
from gpulease.core.capacity.preemption import plan_preemptions, spot_holdings
from gpulease.core.capacity.reserved_pool import NO_WITHHOLDING, Withholding
from gpulease.core.clock import utcnow
from gpulease.core.notices import subject_for
from gpulease.core.policy.options import price_text
from gpulease.core.tiers import ON_DEMAND, RESERVED, is_preemptible, label_of, preempts_any
from gpulease.store.assignments import HELD, Holder

if TYPE_CHECKING:
    from gpulease.spawners.context import GPULeaseContext
    from gpulease.spawners.kube.cluster_preemption import PreemptedPod
    from gpulease.spawners.queueing.base import Ticket

log = logging.getLogger("gpulease.queue")

# The default of the spawners' spot_grace_period, here only.
SPOT_GRACE_S = 120.0


def _warning(server: str, profile: str, deadline: dt.datetime, wanted: str,
             victim_tier: str = "spot", start_tier: str = ON_DEMAND) -> str:
    name = f"server {server}" if server else "your server"
    # a holder's start on its reservation is on demand to the one it preempts
    start = ("an on-demand start" if start_tier in (ON_DEMAND, RESERVED)
             else f"a {label_of(start_tier)} start")
    return (f"{label_of(victim_tier)} {name} ({profile}) is preempted: {start} needs its GPU "
            f"({wanted}). Save your work: it is suspended at "
            f"{deadline.strftime('%H:%M:%S')} UTC and billing stops then. Your home is kept; "
            f"resume it from the hub's home page, on {victim_tier} again or on demand.")


def _displaced_warning(server: str, profile: str, deadline: dt.datetime, wanted: str) -> str:
    name = f"server {server}" if server else "your server"
    return (f"On-demand {name} ({profile}) is stopped: it runs on GPU capacity reserved "
            f"for this period, and the reservation's holder is starting on it ({wanted}). "
            f"Save your work: it is suspended at {deadline.strftime('%H:%M:%S')} UTC and "
            "billing stops then. Your home is kept; resume it from the hub's home page "
            "once a GPU is free.")


async def _tell(ctx: GPULeaseContext, user: str, server: str, profile: str,
                deadline: dt.datetime, text: str) -> None:
    """The notice (JupyterLab, the hub's pages) and, through the hub, mail or webhook."""
    announce = ctx.meter.announce if ctx.meter is not None else None
    try:
        if announce is not None:  # never raises
            await announce("preemption_warning", user, server, profile, None,
                           (subject_for("preemption_warning", user, server, deadline), text),
                           deadline)
        else:
            await asyncio.to_thread(ctx.notices.post, user, server, "preemption_warning", text,
                                    deadline)
    except Exception as e:  # the stop goes ahead: the deadline is the meter's
        log.error("could not post the preemption notice of %s/%s: %s", user, server, e)


async def _record(meter, key: tuple[str, str], until: dt.datetime | None,
                  why: str | None = None) -> None:
    """The preemption (or its withdrawal) on the session's row: a hub restart keeps it."""
    live = meter.live.get(key)
    if live is None:
        return
    try:
        await asyncio.to_thread(meter.sessions.set_preemption, live.session_id, until, why)
    except SQLAlchemyError as e:  # the meter still stops it at the deadline
        log.error("could not record the preemption of %s/%s: %s", *key, e)


async def tell_preempted(ctx: GPULeaseContext, preempted: PreemptedPod) -> None:
    """A spot pod kube-scheduler is preempting (the cluster shape): its session is to end
    `preempted`, billed up to the deadline, and its user is told now. Nothing for a
    server with no open session (still starting: nothing is billed yet)."""
    meter = ctx.meter
    key = (preempted.user, preempted.server)
    live = meter.live.get(key) if meter is not None else None
    if live is None:
        log.info("%s (%s/%s) is being preempted before its session opened", preempted.pod,
                 preempted.user, preempted.server or "(default)")
        return
    why = f"preempted by kube-scheduler for an on-demand pod ({preempted.why})"
    if not meter.preempt(key, preempted.deadline, why):
        return
    await _record(meter, key, preempted.deadline, why)
    try:  # a server gone before the meter's stop closes with this reason too
        await asyncio.to_thread(meter.sessions.request_end_reason, *key, PREEMPTED)
    except SQLAlchemyError as e:  # the meter records it with its stop at the deadline
        log.error("could not record preempted for %s/%s yet: %s", *key, e)
    log.warning("%s/%s (%s, %s, pod %s) %s: suspended at %s", preempted.user,
                preempted.server or "(default)", live.tier, live.profile, preempted.pod, why,
                preempted.deadline.isoformat())
    wanted = ", ".join(f"{count} {resource}" for resource, count in preempted.resources.items())
    await _tell(ctx, preempted.user, preempted.server, live.profile, preempted.deadline,
                _warning(preempted.server, live.profile, preempted.deadline, wanted, live.tier))


async def preempt_for(ctx: GPULeaseContext, waiting: Sequence[Ticket],
                      held: Mapping[str, Holder], grace_s: float,
                      withheld: Withholding = NO_WITHHOLDING) -> tuple[str, ...]:
    """Tell the spot servers the rule chooses for the waiting on-demand starts
    (plan_preemptions), and take back the preemptions no waiting start needs any more
    (the start they were made for was cancelled or gave up); returns the "user/server"
    names newly preempted. By the tiers' records: the servers of every preemptible tier,
    for the starts of every tier that may preempt one (gpulease/core/tiers.py)."""
    meter = ctx.meter
    if meter is None or not (meter.preempting or any(preempts_any(t.tier) for t in waiting)):
        return ()
    live = meter.live
    spot = {key: session.tier for key, session in live.items()
            if is_preemptible(session.tier) and key not in meter.preempting}
    claimed = {uuid: ((h.user, h.server), h.since.timestamp())
               for uuid, h in held.items() if h.state == HELD}
    holdings = spot_holdings(claimed, ctx.inventory, spot, spot)
    leaving: dict[tuple[str, str], set[str]] = {key: set() for key in meter.preempting}
    for uuid, h in held.items():
        if (h.user, h.server) in leaving:
            leaving[(h.user, h.server)].add(uuid)
    # on-demand starts, holders' starts on their reservations (and those of any tier
    # above a preemptible one)
    on_demand = [(ticket, ticket.request) for ticket in waiting if preempts_any(ticket.tier)]
    decided = plan_preemptions(
        on_demand, ctx.inventory, set(held) - set().union(*leaving.values()), holdings,
        {key: frozenset(devices) for key, devices in leaving.items()}, withheld,
        {ticket: ticket.reservation for ticket, _ in on_demand},
        {ticket: ticket.tier for ticket, _ in on_demand})
    # (after a restart, not before every queued start is back: hub/servers/queue_resume.py)
    for key in () if meter.queue_resuming else decided.unneeded:
        await withdraw(ctx, key, "no waiting start needs its GPU any more")
    told: list[str] = []
    for ticket, chosen in decided.chosen:
        told += await preempt_chosen(ctx, ticket, chosen.victims, grace_s)
    return tuple(told)


async def preempt_chosen(ctx: GPULeaseContext, ticket: Ticket,
                         victims: Sequence[tuple[str, str]], grace_s: float) -> list[str]:
    """Tell the servers `victims`, chosen for `ticket`'s waiting start, that they are
    stopped at the end of the grace period with reason preempted; returns the
    "user/server" names told (one already being preempted is left as it is)."""
    meter = ctx.meter
    live = meter.live
    deadline = utcnow() + dt.timedelta(seconds=grace_s)
    told = []
    for key in victims:
        user, server = key
        if key not in live:
            continue
        profile = live[key].profile
        start = ("start on its reservation" if ticket.reservation is not None
                 else f"{ticket.tier} start")
        why = (f"preempted for {ticket.user}/{ticket.server or '(default)'}'s {start} "
               f"of {ticket.request.describe()}")
        if not meter.preempt(key, deadline, why):
            continue
        await _record(meter, key, deadline, why)
        told.append(f"{user}/{server}")
        log.warning("%s/%s (%s, %s, %s credits/h) %s: suspended at %s", user,
                    server or "(default)", live[key].tier, profile,
                    price_text(live[key].rate_per_hour_ucr), why, deadline.isoformat())
        await _tell(ctx, user, server, profile, deadline,
                    _warning(server, profile, deadline, ticket.request.describe(),
                             live[key].tier, ticket.tier))
    return told


def displacing(meter) -> bool:
    """Whether an on-demand server is being displaced now (one displacement at a time)."""
    return any(key in meter.live and meter.live[key].tier == ON_DEMAND
               for key in meter.preempting)


async def displace(ctx: GPULeaseContext, ticket: Ticket, chosen: Displacement,
                   grace_s: float) -> tuple[str, ...]:
    """Tell the on-demand servers `chosen` for a holder's waiting start that they are
    stopped at the end of the grace period (gpulease/core/capacity/displacement.py), as a preempted
    spot server is; returns the "user/server" names told."""
    meter = ctx.meter
    deadline = utcnow() + dt.timedelta(seconds=grace_s)
    why = (f"displaced from reserved capacity for {ticket.user}/"
           f"{ticket.server or '(default)'}'s start on reservation {ticket.reservation} "
           f"({ticket.request.describe()})")
    told = []
    for key in chosen.victims:
        user, server = key
        live = meter.live.get(key)
        if live is None or not meter.preempt(key, deadline, why, on_demand=True):
            continue
        await _record(meter, key, deadline, why)
        told.append(f"{user}/{server}")
        log.warning("%s/%s (on demand, %s, %s credits/h) %s: suspended at %s", user,
                    server or "(default)", live.profile, price_text(live.rate_per_hour_ucr),
                    why, deadline.isoformat())
        await _tell(ctx, user, server, live.profile, deadline,
                    _displaced_warning(server, live.profile, deadline,
                                       ticket.request.describe()))
    return tuple(told)


async def displace_first(ctx: GPULeaseContext, waiting: Sequence[Ticket], grace_s: float,
                         choose: Callable[[Ticket, dict, set], Displacement | None]) -> None:
    """Displace for the first waiting holder's start that `choose(ticket, started, own)`
    finds a displacement for (the shape's reading of gpulease/core/capacity/displacement.py):
    `started` the running on-demand servers' session ids, `own` those charged to the ticket's
    reservation's account."""
    meter = ctx.meter
    started = {key: live.session_id for key, live in meter.live.items()
               if live.tier == ON_DEMAND and key not in meter.preempting}
    if not started or all(ticket.reservation is None for ticket in waiting):
        return
    account_of = {r.id: r.account for r in await asyncio.to_thread(ctx.reservations.active)}
    for ticket in waiting:
        if ticket.reservation is None:
            continue
        own = {key for key in started
               if meter.live[key].account == account_of.get(ticket.reservation)}
        chosen = choose(ticket, started, own)
        if chosen is not None:
            await displace(ctx, ticket, chosen, grace_s)
            return


async def withdraw(ctx: GPULeaseContext, key: tuple[str, str], why: str) -> None:
    """Take back `key`'s preemption (its deadline not reached): clear its record and
    notice."""
    meter = ctx.meter
    if not meter.withdraw_preemption(key):
        return
    await _record(meter, key, None)
    log.warning("%s/%s: its preemption is withdrawn: %s", key[0], key[1] or "(default)", why)
    try:
        await asyncio.to_thread(ctx.notices.clear, *key, ["preemption_warning"])
    except SQLAlchemyError as e:
        log.error("could not clear the preemption notice of %s/%s: %s", *key, e)
