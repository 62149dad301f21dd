"""The hub's periodic work, started once the hub is up (GPULeaseHub.start).

- the heartbeat: reservations' ends first (a suspend it orders is pushed by the
  same beat), then the meter's beat over the servers (billing, credit and caps,
  preemption deadlines); one at a time, the regular beats and those the meter asks
  for at a deadline (`beat_at`) alike;
- audit-log pruning, once a day (a retention counted in days);
- on the embedded box, out-of-service devices returned once their last server's
  cgroup is empty (a spawn waiting for one gets it at the queue's next poll).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from functools import partial
from typing import TYPE_CHECKING

from tornado.ioloop import PeriodicCallback

from gpulease.hub.billing.metering import beat_at
from gpulease.hub.billing.reservation_ends import end_reservations
from gpulease.hub.billing.server_control import HubServerControl

if TYPE_CHECKING:
    from gpulease.spawners.context import GPULeaseContext

AUDIT_PRUNE_EVERY_MS = 24 * 3600 * 1000


class HubTasks:
    """Starts and stops the hub's periodic callbacks over one gpulease context."""

    def __init__(self, app, ctx: GPULeaseContext, *, heartbeat_s: float,
                 end_notice: dt.timedelta, audit_retention: dt.timedelta | None,
                 embedded: bool, log: logging.Logger) -> None:
        self.ctx, self.log = ctx, log
        self.end_notice, self.audit_retention = end_notice, audit_retention
        # What the heartbeat sees of the servers and how it stops them (credit, caps).
        self.servers = HubServerControl(app, ctx)
        self._beat_lock = asyncio.Lock()
        self._callbacks = [PeriodicCallback(self.heartbeat_once, heartbeat_s * 1000),
                           PeriodicCallback(self._prune_audit, AUDIT_PRUNE_EVERY_MS)]
        if embedded:
            self._callbacks.append(PeriodicCallback(self._recheck_out_of_service,
                                                    heartbeat_s * 1000))

    def start(self) -> None:
        for callback in self._callbacks:
            callback.start()
        # Preempted servers stop at their deadlines, restored ones included.
        self.ctx.meter.beat_at = partial(beat_at, beat=self.heartbeat_once)
        for told in list(self.ctx.meter.preempting.values()):
            self.ctx.meter.beat_for(told.deadline)

    def stop(self) -> None:
        for callback in self._callbacks:
            callback.stop()

    async def heartbeat_once(self) -> None:
        async with self._beat_lock:
            try:  # reservations' ends first: a suspend it orders is pushed by this beat
                await end_reservations(self.ctx, self.end_notice)
            except Exception:
                self.log.exception("ending reservations failed (tried again next beat)")
            try:
                await self.ctx.meter.heartbeat(self.servers)
            except Exception:
                self.log.exception("billing heartbeat failed")

    async def _prune_audit(self) -> None:
        try:
            await asyncio.to_thread(prune_audit, self.ctx, self.audit_retention, self.log)
        except Exception:
            self.log.exception("audit log pruning failed")

    async def _recheck_out_of_service(self) -> None:
        from gpulease.spawners.local import isolation, quarantine

        try:
            await asyncio.to_thread(quarantine.recheck, self.ctx.assignments,
                                    lambda cgroup: isolation.cleanup(cgroup, wait_s=1.0))
        except Exception:
            self.log.exception("checking out-of-service devices failed")


def prune_audit(ctx: GPULeaseContext, retention: dt.timedelta | None,
                log: logging.Logger) -> None:
    """Delete audit entries older than `retention` (None: "0", keep every entry)."""
    if retention is None:
        return
    pruned = ctx.audit.prune(retention)
    if pruned:
        log.info("Audit log: pruned %d entries older than %s", pruned, retention)
