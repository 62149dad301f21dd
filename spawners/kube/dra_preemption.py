"""ClaimPreemptions: spot preemption in DRA mode, for the cluster's queue runner.

kube-scheduler (1.36) does not preempt pods for DRA devices, so in DRA mode
with spot preemption configured the runner preempts itself, as the embedded
box does: for each waiting start of a tier that may preempt, the rule
(gpulease/core/capacity/claim_preemption.py) chooses the fewest spot servers on
one node; they are told and stopped at the deadline through the hub
(spawners/queueing/spot_preemption.py preempt_chosen). The start stays in the
queue until their claims' allocations are cleared, and the ordinary fit admits
it then.

Bookkeeping keeps it to one preemption per start: a start's victims are
remembered, no others are chosen for it while they are going (their stop,
then the controller's deallocation), and a start that leaves the queue
(admitted elsewhere, cancelled, given up) takes its victims' preemptions
back before their deadlines. After a hub restart, preemptions restored from
the sessions that no waiting start may need are taken back too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpulease.core.capacity.claim_preemption import claim_victims
from gpulease.core.capacity.cluster_inventory import ClusterInventory
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.tiers import is_preemptible, preempts_any
from gpulease.spawners.queueing.base import Ticket
from gpulease.spawners.queueing.spot_preemption import preempt_chosen, withdraw

if TYPE_CHECKING:
    from gpulease.spawners.context import GPULeaseContext

Key = tuple[str, str]
# Beyond the spot grace period: how long a start's victims may take to be gone (their
# stop, their pods' ends, the controller clearing their claims) before it may choose again.
CLAIMS_CLEARED_S = 60.0


class ClaimPreemptions:
    def __init__(self, ctx: GPULeaseContext, grace_s: float):
        self.ctx = ctx
        self.grace_s = grace_s
        self.chosen: dict[Ticket, tuple[frozenset[Key], float]] = {}  # -> (victims, when)

    def may_stop(self) -> set[Key]:
        """Servers that can be preempted now: running, of a preemptible tier, not being
        preempted or stopped already."""
        meter = self.ctx.meter
        return {key for key, live in meter.live.items() if is_preemptible(live.tier)
                and key not in meter.preempting and key not in meter.stopping}

    def would_preempt(self, request: DeviceRequest, tier: str, inventory: ClusterInventory,
                      pending: tuple[DeviceRequest, ...]) -> bool:
        meter = self.ctx.meter
        if meter is None or not preempts_any(tier):
            return False
        return claim_victims(request, tier, inventory, set(meter.preempting), pending,
                             self.may_stop()) is not None

    async def serve(self, waiting: Sequence[Ticket], inventory: ClusterInventory,
                    pending: tuple[DeviceRequest, ...]) -> bool:
        """Preempt for the waiting starts that need it; True while any server is being
        preempted (nothing else is decided until it is gone)."""
        meter = self.ctx.meter
        if meter is None or meter.queue_resuming:
            return False
        await self.withdraw_unneeded(waiting)
        now = time.monotonic()
        for ticket in waiting:
            if not preempts_any(ticket.tier):
                continue
            earlier = self.chosen.get(ticket)
            if earlier is not None and now - earlier[1] < self.grace_s + CLAIMS_CLEARED_S:
                continue  # its victims are going
            chosen = claim_victims(ticket.request, ticket.tier, inventory,
                                   set(meter.preempting), pending, self.may_stop())
            if chosen is None:
                continue
            told = await preempt_chosen(self.ctx, ticket, chosen.victims, self.grace_s)
            if told:
                self.chosen[ticket] = (frozenset(chosen.victims), now)
        return bool(meter.preempting)

    async def withdraw_unneeded(self, waiting: Sequence[Ticket]) -> None:
        """Take back the preemptions made for starts no longer waiting, and (after a
        restart) those of preemptible servers no waiting start may need."""
        meter = self.ctx.meter
        if meter is None or meter.queue_resuming:
            return
        still = set(waiting)
        for ticket in [t for t in self.chosen if t not in still]:
            victims, _when = self.chosen.pop(ticket)
            for key in victims:
                await withdraw(self.ctx, key, "the start it was preempted for no longer waits")
        ours = set().union(*(victims for victims, _ in self.chosen.values()))
        if not any(preempts_any(t.tier) for t in waiting):
            for key in [k for k in meter.preempting if k not in ours and k in meter.live
                        and is_preemptible(meter.live[k].tier)]:
                await withdraw(self.ctx, key, "no waiting start needs its GPU any more")
