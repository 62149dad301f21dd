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
import datetime as dt
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from gpulease.hub.db import utcnow
from gpulease.hub.limits import Holding, check_limits
from gpulease.hub.refusal import Refusal
from gpulease.hub.units import format_duration
from gpulease.spawners.assignments import Holder
from gpulease.spawners.inventory import Inventory
from gpulease.spawners.placement import DeviceRequest, NoFit, Placement, free_summary, place
from gpulease.spawners.queue import Waiting, plan, queue_places_refusal, restricted

if TYPE_CHECKING:
    from gpulease.hub.context import GPULeaseContext

log = logging.getLogger("gpulease.queue")


class Refused(Refusal):
    """A start that cannot be admitted (limits, capacity, the queue): `status`, and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message, status=status)


@dataclass(eq=False)
class Ticket:
    """A spawn waiting in the queue; its future gets the placement (or a Refused)."""

    user: str
    server: str
    profile: str
    request: DeviceRequest
    future: asyncio.Future
    enqueued_at: dt.datetime = field(default_factory=utcnow)


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


def _asks(request: DeviceRequest) -> tuple[int, int]:
    return (0, 1) if request.mig_profile is not None else (request.count, 0)


class QueueRunner:
    def __init__(self, ctx: GPULeaseContext, poll_s: float = 5.0):
        self.ctx = ctx
        self.poll_s = poll_s
        self.waiting: list[Ticket] = []
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    # --- what the spawner and its progress ask --------------------------------------

    def position(self, user: str, server: str) -> int | None:
        for index, ticket in enumerate(self.waiting, start=1):
            if (ticket.user, ticket.server) == (user, server):
                return index
        return None

    def released(self) -> None:
        """Devices were released: serve the queue now rather than at the next poll."""
        if self.waiting:
            self._kick()

    # --- admission ---------------------------------------------------------------------

    async def admit(
        self, user: str, server: str, profile: str, request: DeviceRequest, *,
        user_groups: Collection[str] = (), group_members: Mapping[str, Collection[str]] = {},
        max_wait: float = 0.0, max_length: int = 1000, max_per_user: int = 0,
    ) -> Admitted:
        """Check the limits, then claim devices now or wait in the queue for them.

        Raises Refused: 409 over a limit or holding `max_per_user` places in the
        queue already (0: no such limit), 422 never fits here, 503 no capacity
        and no queueing (`max_wait` 0: naming what is free), the queue full, or
        `max_wait` seconds passed in the queue. A cancelled spawn leaves the queue.
        """
        ctx = self.ctx
        inventory = ctx.inventory
        async with self._lock:
            held = await asyncio.to_thread(ctx.assignments.held)
            limit_table = await asyncio.to_thread(ctx.limits.all)
            holdings = holdings_from(held, inventory) + [
                Holding(t.user, t.server, *_asks(t.request), queued=True) for t in self.waiting]
            refusal = check_limits(user, server, *_asks(request), user_groups, group_members,
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
                        ctx.assignments.claim, user, server, profile, request, inventory)
                    return Admitted(placement)
                except NoFit as nofit:
                    if nofit.status != 503 or max_wait <= 0:
                        raise Refused(nofit.status, nofit.message) from None
            else:  # others wait: it may start at once only if it delays none of them
                me = object()
                queue = [Waiting(t, t.request) for t in self.waiting] + [Waiting(me, request)]
                planned = dict(plan(queue, inventory, held).start).get(me)
                if planned is not None:
                    try:
                        placement = await asyncio.to_thread(
                            ctx.assignments.claim, user, server, profile, request,
                            restricted(inventory, planned.uuids))
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
            await asyncio.to_thread(ctx.queue.add, user, server, profile)
            ticket = Ticket(user, server, profile, request,
                            asyncio.get_running_loop().create_future())
            self.waiting.append(ticket)
            log.info("%s/%s waits for %s at position %d", user, server, request.describe(),
                     len(self.waiting))
        try:
            placement = await self._wait(ticket, max_wait)
        finally:
            await self._forget(ticket)
        waited = (utcnow() - ticket.enqueued_at).total_seconds()
        return Admitted(placement, waited, queued=True)

    async def _wait(self, ticket: Ticket, max_wait: float) -> Placement:
        self._kick()  # keep passes coming while it waits
        try:
            return await asyncio.wait_for(asyncio.shield(ticket.future), max_wait)
        except TimeoutError:
            if ticket.future.done():  # served at the very last moment
                return ticket.future.result()
            self._withdraw(ticket)
            held = await asyncio.to_thread(self.ctx.assignments.held)
            raise Refused(503, f"Waited {format_duration(int(max_wait))} in the queue "
                               f"(queue_max_wait) and no {ticket.request.describe()} came "
                               f"free for this start; it is given up. Try again later. "
                               f"Free now: {free_summary(self.ctx.inventory, held)}") from None
        except asyncio.CancelledError:
            self._withdraw(ticket)
            if ticket.future.done() and not ticket.future.cancelled() \
                    and ticket.future.exception() is None:
                # Placed just as the spawn was cancelled: give the devices back.
                self._spawn(asyncio.to_thread(self.ctx.assignments.release, ticket.user,
                                              ticket.server, "cancelled"))
            raise
        except BaseException:
            self._withdraw(ticket)
            raise

    def _withdraw(self, ticket: Ticket) -> None:
        """Leave the queue (synchronous: no pass can place it half-way)."""
        if ticket in self.waiting:
            self.waiting.remove(ticket)
            if not ticket.future.done():
                ticket.future.cancel()
            self._kick()  # those it held back may start now

    async def _forget(self, ticket: Ticket) -> None:
        # The row goes even when this spawn is being cancelled: a task of its own.
        task = self._spawn(asyncio.to_thread(self.ctx.queue.remove, ticket.user, ticket.server))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass
        except SQLAlchemyError as e:
            log.error("cannot remove %s/%s from the queue table yet: %s",
                      ticket.user, ticket.server, e)

    # --- serving the queue -----------------------------------------------------------------

    async def serve(self) -> None:
        """One pass: claim devices for every waiting spawn that may start now."""
        ctx = self.ctx
        async with self._lock:
            if not self.waiting:
                return
            held = await asyncio.to_thread(ctx.assignments.held)
            decision = plan([Waiting(t, t.request) for t in self.waiting], ctx.inventory, held)
            for ticket, message in decision.never:
                self._settle(ticket, Refused(422, message))
            for ticket, planned in decision.start:
                try:
                    placement = await asyncio.to_thread(
                        ctx.assignments.claim, ticket.user, ticket.server, ticket.profile,
                        ticket.request, restricted(ctx.inventory, planned.uuids))
                except NoFit:
                    continue  # taken meanwhile: the next pass decides again
                if ticket in self.waiting:
                    self._settle(ticket, placement)
                else:  # cancelled while claiming
                    await asyncio.to_thread(ctx.assignments.release, ticket.user,
                                            ticket.server, "cancelled")

    def _settle(self, ticket: Ticket, outcome: Placement | Refused) -> None:
        if ticket in self.waiting:
            self.waiting.remove(ticket)
        if ticket.future.done():
            return
        if isinstance(outcome, Refused):
            ticket.future.set_exception(outcome)
        else:
            ticket.future.set_result(outcome)

    def _kick(self) -> None:
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = self._spawn(self._serve_while_waiting())

    async def _serve_while_waiting(self) -> None:
        while self.waiting:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.serve()
            except Exception:  # the database may be away: the next pass tries again
                log.exception("serving the spawn queue failed")

    def _spawn(self, coro) -> asyncio.Task:
        # The event loop keeps only weak references to tasks.
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


_runners: dict[int, tuple[GPULeaseContext, QueueRunner]] = {}


def runner_for(ctx: GPULeaseContext, poll_s: float = 5.0) -> QueueRunner:
    """The one runner of this context in this process."""
    entry = _runners.get(id(ctx))
    if entry is None or entry[0] is not ctx:
        entry = (ctx, QueueRunner(ctx, poll_s))
        _runners[id(ctx)] = entry
    entry[1].poll_s = poll_s
    return entry[1]


# --- what the user sees -------------------------------------------------------------------


async def queue_progress(
    runner: QueueRunner, user: str, server: str, what: str,
    admitting: Callable[[], bool], interval: float = 0.5,
) -> AsyncIterator[dict]:
    """Spawn progress events while a start waits: its position, each time it changes.

    `admitting()` is true until the start is past the queue (placed or refused).
    """
    last = None
    while admitting():
        pos = runner.position(user, server)
        if pos is not None and pos != last:
            last = pos
            yield {"progress": 15,
                   "message": f"Waiting for a free {what}: position {pos} in the queue"}
        await asyncio.sleep(interval)
    if last is not None and runner.position(user, server) is None:
        yield {"progress": 40, "message": f"A free {what} is yours; starting"}


async def tell_started(ctx: GPULeaseContext, user: str, server: str, profile: str,
                       waited_s: float) -> None:
    """A queued server answers: post a `queued_started` notice and notify its user."""
    from gpulease.hub.notifier import announce

    await announce(ctx.notices, ctx.notify_backends, "queued_started", user, server, profile,
                   waited_s / 60)

