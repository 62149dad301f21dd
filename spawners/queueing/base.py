"""The queue's machinery, the same in both shapes: tickets, waiting, passes, progress.

A start that cannot have its GPUs now waits here, in arrival order, until a
pass of its shape's runner settles it: `QueueRunner` (spawners/queueing/runner.py)
claims devices on the embedded box, `ClusterQueueRunner`
(spawners/kube/cluster_runner.py) admits a pod to the cluster's counted capacity.
Every decision of one runner happens under its one asyncio lock. The queue is
in memory; its `spawn_queue` rows mirror it for the gpulease service.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from gpulease.core.capacity.queue import Waiting, served_order
from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.refusal import Refusal
from gpulease.core.tiers import ON_DEMAND

if TYPE_CHECKING:
    from gpulease.spawners.context import GPULeaseContext

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
    tier: str = ON_DEMAND  # served by its queue rank (gpulease/core/tiers.py)
    reservation: int | None = None  # tier reserved: the reservation whose unit it takes


class QueueBase:
    """The waiting spawns of one hub process and the passes that serve them.

    What is the same in both shapes: tickets in arrival order, one lock for
    every decision, passes on a wake-up or every `poll_s` seconds while anyone
    waits, withdrawal on cancel or timeout, the `spawn_queue` row. A subclass
    decides (`serve`) and says what a timeout reports and what a placement made
    just as its spawn was cancelled must give back."""

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
        for index, ticket in enumerate(served_order(self.waiting), start=1):
            if (ticket.user, ticket.server) == (user, server):
                return index
        return None

    def entries(self) -> list[Waiting]:
        """The waiting tickets as the queue's decision takes them
        (gpulease/core/capacity/queue.py)."""
        return [Waiting(t, t.request, reservation=t.reservation, tier=t.tier)
                for t in self.waiting]

    def released(self) -> None:
        """Capacity was released: serve the queue now rather than at the next poll."""
        if self.waiting:
            self._kick()

    # --- what a subclass provides ------------------------------------------------------

    async def serve(self) -> None:
        raise NotImplementedError

    async def _timed_out(self, ticket: Ticket, max_wait: float) -> Refused:
        """The refusal of a spawn that waited `max_wait` seconds for nothing."""
        raise NotImplementedError

    async def give_back(self, user: str, server: str) -> None:
        """Undo an admission whose start is refused after all (gpulease.spawners.spawn_core)."""
        raise NotImplementedError

    async def reservation_use(self) -> dict[int, set[tuple[str, str]]]:
        """The (user, server) on each reservation's units now (spawners/start/admission.py
        on_reservation picks a free one)."""
        raise NotImplementedError

    def _cancelled_after_placing(self, ticket: Ticket) -> None:
        """Give back what was placed for `ticket` just as its spawn was cancelled."""

    # --- waiting -------------------------------------------------------------------------

    async def _enqueue(self, user: str, server: str, profile: str,
                       request: DeviceRequest, tier: str = ON_DEMAND,
                       reservation: int | None = None) -> Ticket:
        """A place at the end of the queue (under the lock), with its `spawn_queue` row."""
        await asyncio.to_thread(self.ctx.queue.add, user, server, profile)
        ticket = Ticket(user, server, profile, request,
                        asyncio.get_running_loop().create_future(), tier=tier,
                        reservation=reservation)
        self.waiting.append(ticket)
        log.info("%s/%s waits for %s at position %d", user, server, request.describe(),
                 len(self.waiting))
        return ticket

    async def _wait_in_queue(self, ticket: Ticket, max_wait: float):
        """What a pass settles `ticket` with; it leaves the queue whatever happens."""
        try:
            return await self._wait(ticket, max_wait)
        finally:
            await self._forget(ticket)

    async def _wait(self, ticket: Ticket, max_wait: float):
        self._kick()  # keep passes coming while it waits
        try:
            return await asyncio.wait_for(asyncio.shield(ticket.future), max_wait)
        except TimeoutError:
            if ticket.future.done():  # served at the very last moment
                return ticket.future.result()
            self._withdraw(ticket)
            raise await self._timed_out(ticket, max_wait) from None
        except asyncio.CancelledError:
            self._withdraw(ticket)
            if ticket.future.done() and not ticket.future.cancelled() \
                    and ticket.future.exception() is None:
                self._cancelled_after_placing(ticket)
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

    def _settle(self, ticket: Ticket, outcome: object) -> None:
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
        # At least one pass after a wake-up, also when the last start just left: a
        # preemption made for it is taken back by that pass (spot_preemption).
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.serve()
            except Exception:  # the database may be away: the next pass tries again
                log.exception("serving the spawn queue failed")
            if not self.waiting:
                return

    def _spawn(self, coro) -> asyncio.Task:
        # The event loop keeps only weak references to tasks.
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


# --- what the user sees -------------------------------------------------------------------


async def queue_progress(
    runner: QueueBase, user: str, server: str, what: str,
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
    """A queued server answers: its user is told (a `queued_started` notice, and their
    channel) through the meter's `announce`, which the hub sets; never raises."""
    meter = ctx.meter
    if meter is not None and meter.announce is not None:
        await meter.announce("queued_started", user, server, profile, waited_s / 60)

