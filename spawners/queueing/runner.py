"""Admission in the hub process: limits, then a device now, or a place in the queue.

Every embedded spawn runs in the hub's event loop, so one `QueueRunner` per
gpulease context decides for all of them, under one asyncio lock: the limits
check, the claim and the enqueue of one start never interleave with another's.
The queue itself is in memory (its order is the order of the `spawn_queue`
rows, which mirror it for the gpulease service); `queue.plan` decides who may
start. A pass runs when a spawn joins the queue, when devices are released
(`LocalGPUSpawner._release` calls `released`) and every `poll_s` seconds while
anyone waits, as a fallback for releases this process did not see.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulease.core.capacity.displacement import on_the_box
from gpulease.core.capacity.placement import NoFit, Placement, free_summary, place
from gpulease.core.capacity.queue import (
    Waiting,
    plan,
    queue_places_refusal,
    restricted,
    start_tier,
)
from gpulease.core.capacity.reserved_pool import Withholding, withholding
from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory
from gpulease.core.policy.limits import Holding, check_limits
from gpulease.core.units import format_duration
from gpulease.spawners.queueing.base import (  # noqa: F401  (Refused and the progress: re-exported)
    QueueBase,
    Refused,
    Ticket,
    queue_progress,
    tell_started,
)
from gpulease.spawners.queueing.spot_preemption import SPOT_GRACE_S, displace_first, preempt_for
from gpulease.store.assignments import Holder, held_by

if TYPE_CHECKING:
    from gpulease.spawners.context import GPULeaseContext


@dataclass(frozen=True)
class Admitted:
    placement: Placement
    waited_s: float = 0.0  # > 0: it waited in the queue
    queued: bool = False


def holdings_from(held: Mapping[str, Holder], inventory: Inventory) -> list[Holding]:
    """Full GPUs and MIG slices held per server, from the open assignments."""
    kinds = {d.uuid: d.mig_profile is not None for d in inventory.allocatable()}
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for uuid, holder in held.items():
        if holder.state != "held":  # out of service: taken, but from no one's limit
            continue
        # A device gone from the inventory still counts, by the shape of its UUID.
        is_slice = kinds.get(uuid, uuid.startswith("MIG-"))
        counts[(holder.user, holder.server)][1 if is_slice else 0] += 1
    return [Holding(user, server, gpus, slices) for (user, server), (gpus, slices)
            in counts.items()]


def asks(request: DeviceRequest) -> tuple[int, int]:
    return (0, 1) if request.mig_profile is not None else (request.count, 0)


class QueueRunner(QueueBase):
    """The embedded box's queue: devices claimed by UUID (AssignmentStore)."""

    spot_grace_s: float = SPOT_GRACE_S  # the spawners' spot_grace_period

    # --- admission ---------------------------------------------------------------------

    async def admit(
        self, user: str, server: str, profile: str, request: DeviceRequest, *,
        user_groups: Collection[str] = (), group_members: Mapping[str, Collection[str]] = {},
        max_wait: float = 0.0, max_length: int = 1000, max_per_user: int = 0,
        spot: bool = False, reservation: int | None = None, tier: str | None = None,
    ) -> Admitted:
        """Check the limits, then claim devices now or wait in the queue for them.

        Raises Refused: 409 over a limit or holding `max_per_user` places in the
        queue already (0: no such limit), 422 never fits here, 503 no capacity
        and no queueing (`max_wait` 0: naming what is free), the queue full, or
        `max_wait` seconds passed in the queue. A cancelled spawn leaves the queue.
        `reservation`: the start takes a unit of that reservation (tier reserved).
        `tier`: the start's tier (None: spot where `spot`, reserved on a reservation,
        else on demand).
        """
        ctx = self.ctx
        inventory = ctx.inventory
        tier = start_tier(spot, reservation, tier)
        async with self._lock:
            held = await asyncio.to_thread(ctx.assignments.held)
            limit_table = await asyncio.to_thread(ctx.limits.all)
            holdings = holdings_from(held, inventory) + [
                Holding(t.user, t.server, *asks(t.request), queued=True) for t in self.waiting]
            refusal = check_limits(user, server, *asks(request), user_groups, group_members,
                                   limit_table, holdings)
            if refusal is not None:
                raise Refused(409, refusal.message)
            try:  # never fits here (model absent, node too small): no use waiting
                place(request, inventory, ())
            except NoFit as nofit:
                raise Refused(nofit.status, nofit.message) from None
            if not self.waiting or max_wait <= 0:
                try:
                    placement = await asyncio.to_thread(
                        ctx.assignments.claim, user, server, profile, request, inventory,
                        tier=tier, reservation_id=reservation)
                    return Admitted(placement)
                except NoFit as nofit:
                    if nofit.status != 503 or max_wait <= 0:
                        raise Refused(nofit.status, nofit.message) from None
            else:  # others wait: it may start at once only if it delays none of them
                me = object()
                queue = self.entries() + [Waiting(me, request, reservation=reservation,
                                                  tier=tier)]
                withheld = await self._withholding(held)
                planned = dict(plan(queue, inventory, held, withheld).start).get(me)
                if planned is not None:
                    try:
                        placement = await asyncio.to_thread(
                            ctx.assignments.claim, user, server, profile, request,
                            restricted(inventory, planned.uuids), tier=tier,
                            reservation_id=reservation)
                        return Admitted(placement)
                    except NoFit:
                        pass  # taken meanwhile: wait like the others
            theirs = queue_places_refusal(user, [(t.user, t.server) for t in self.waiting],
                                          max_per_user)
            if theirs is not None:  # before the row: a refused start leaves none
                raise Refused(409, theirs)
            if len(self.waiting) >= max_length:
                raise Refused(503, f"No free {request.describe()}, and the queue is full "
                                   f"({len(self.waiting)} spawns waiting). Try again later. "
                                   f"Free now: {free_summary(inventory, held)}")
            ticket = await self._enqueue(user, server, profile, request, tier, reservation)
        placement = await self._wait_in_queue(ticket, max_wait)
        waited = (utcnow() - ticket.enqueued_at).total_seconds()
        return Admitted(placement, waited, queued=True)

    async def _timed_out(self, ticket: Ticket, max_wait: float) -> Refused:
        held = await asyncio.to_thread(self.ctx.assignments.held)
        return Refused(503, f"Waited {format_duration(int(max_wait))} in the queue "
                            f"(queue_max_wait) and no {ticket.request.describe()} came "
                            f"free for this start; it is given up. Try again later. "
                            f"Free now: {free_summary(self.ctx.inventory, held)}")

    async def give_back(self, user: str, server: str) -> None:
        await asyncio.to_thread(self.ctx.assignments.release, user, server, "refused")
        self._kick()

    def _cancelled_after_placing(self, ticket: Ticket) -> None:
        self._spawn(asyncio.to_thread(self.ctx.assignments.release, ticket.user,
                                      ticket.server, "cancelled"))

    # --- serving the queue -----------------------------------------------------------------

    async def serve(self) -> None:
        """One pass: claim devices for every waiting spawn that may start now."""
        ctx = self.ctx
        async with self._lock:
            if not self.waiting and not (ctx.meter is not None and ctx.meter.preempting):
                return  # (preemptions for starts that left are taken back below)
            held = await asyncio.to_thread(ctx.assignments.held)
            decision = plan(self.entries(), ctx.inventory, held, await self._withholding(held))
            for ticket, message in decision.never:
                self._settle(ticket, Refused(422, message))
            for ticket, planned in decision.start:
                try:
                    placement = await asyncio.to_thread(
                        ctx.assignments.claim, ticket.user, ticket.server, ticket.profile,
                        ticket.request, restricted(ctx.inventory, planned.uuids),
                        tier=ticket.tier, reservation_id=ticket.reservation)
                except NoFit:
                    continue  # taken meanwhile: the next pass decides again
                if ticket in self.waiting:
                    self._settle(ticket, placement)
                else:  # cancelled while claiming
                    await asyncio.to_thread(ctx.assignments.release, ticket.user,
                                            ticket.server, "cancelled")
            if decision.start:  # what this pass claimed is held now
                held = await asyncio.to_thread(ctx.assignments.held)
            withheld = await self._withholding(held)
            told = await preempt_for(ctx, decision.waiting, held, self.spot_grace_s, withheld)
            if not told:
                await self._displace_for(decision.waiting, held, withheld)

    async def _displace_for(self, waiting: Collection[Ticket], held: Mapping[str, Holder],
                            withheld: Withholding) -> None:
        """The first waiting holder's start that on-demand servers in reserved capacity
        keep out displaces them (gpulease/core/capacity/displacement.py), one displacement at a
        time."""
        meter = self.ctx.meter
        if meter is None or meter.preempting or meter.queue_resuming:
            return  # what is being preempted comes free first
        by = held_by(dict(held))
        await displace_first(self.ctx, list(waiting), self.spot_grace_s, lambda t, started, own:
                             on_the_box(t.request, t.reservation, self.ctx.inventory, by,
                                        started, withheld, own))

    async def reservation_use(self) -> dict[int, set[tuple[str, str]]]:
        """The servers on each reservation's units: those holding devices claimed on it."""
        held = await asyncio.to_thread(self.ctx.assignments.held)
        used: dict[int, set[tuple[str, str]]] = {}
        for h in held.values():
            if h.reservation_id is not None and h.state == "held":
                used.setdefault(h.reservation_id, set()).add((h.user, h.server))
        return used

    async def _withholding(self, held: Mapping[str, Holder]) -> Withholding:
        """What the reservations active now withhold, given the devices `held`."""
        active = await asyncio.to_thread(self.ctx.reservations.active)
        return withholding(self.ctx.inventory, held_by(dict(held)), active)



_runners: dict[int, tuple[GPULeaseContext, QueueRunner]] = {}


def runner_for(ctx: GPULeaseContext, poll_s: float | None = None) -> QueueRunner:
    """The one runner of this context in this process (`poll_s`: the spawners' queue poll
    interval, kept when not given)."""
    entry = _runners.get(id(ctx))
    if entry is None or entry[0] is not ctx:
        entry = (ctx, QueueRunner(ctx) if poll_s is None else QueueRunner(ctx, poll_s))
        _runners[id(ctx)] = entry
    if poll_s is not None:
        entry[1].poll_s = poll_s
    return entry[1]


