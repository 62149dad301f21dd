"""Admission in the cluster shape: limits, then room on some node now, or a place in the queue.

gpulease decides whether and when a GPU pod may be made; kube-scheduler then
decides where. A start is admitted when some schedulable node of its model
(and of the spawner's node selector) has that many free of its resource, as
the cluster inventory counts them (gpulease/core/capacity/cluster_fit.py `fit`, over
the ClusterWatch's picture); only then does GPUKubeSpawner make the pod. A
start that does not fit waits in the fair queue (gpulease/core/capacity/cluster_queue.py
decides who goes first); the watch wakes a pass whenever a pod or node
changes, so capacity a stop frees goes to the head of the queue within
seconds.

Between its admission and its pod being bound to a node, a start holds
nothing the API server can see: the runner keeps it as `admitted` and every
decision gives it room first. A pod admitted but still Pending (capacity
taken meanwhile by something outside gpulease) stays admitted, counted as
queued by the limits, with the scheduler's reason in its progress
(kubespawner's pod events). When its start ends, in success or failure,
`done` forgets it: from then on only a pod the API server has counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubernetes_asyncio import client

from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import ClusterInventory, select_nodes
from gpulease.core.capacity.cluster_offer import too_old_nodes
from gpulease.core.capacity.cluster_queue import AdmittedStart, cluster_withholding, plan_cluster
from gpulease.core.capacity.displacement import in_the_cluster
from gpulease.core.capacity.placement import NoFit
from gpulease.core.capacity.queue import Waiting, queue_places_refusal, start_tier
from gpulease.core.capacity.reserved_pool import Withholding
from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.policy.limits import Holding, check_limits
from gpulease.core.tiers import ON_DEMAND, RESERVED
from gpulease.core.units import format_duration
from gpulease.spawners.kube.cluster_preemption import preempted_pod
from gpulease.spawners.kube.cluster_watch import ClusterWatch
from gpulease.spawners.kube.dra_preemption import CLAIMS_CLEARED_S, ClaimPreemptions
from gpulease.spawners.queueing.base import QueueBase, Refused, Ticket, log
from gpulease.spawners.queueing.runner import asks
from gpulease.spawners.queueing.spot_preemption import (
    SPOT_GRACE_S,
    displace_first,
    displacing,
    tell_preempted,
    withdraw,
)

if TYPE_CHECKING:
    from gpulease.spawners.context import GPULeaseContext

WATCH_READY_S = 10.0  # how long a start waits for the watches' first lists


@dataclass(frozen=True)
class ClusterAdmitted:
    node: str  # where it fits now (kube-scheduler still decides)
    waited_s: float = 0.0  # > 0: it waited in the queue
    queued: bool = False
    avoid: frozenset[str] = frozenset()  # nodes whose driver is too old for its image
    pinned: bool = False  # its pod goes on `node` only (it matters to reserved units)


def cluster_holdings(inventory: ClusterInventory,
                     unbound: Mapping[tuple[str, str], DeviceRequest]) -> list[Holding]:
    """Full GPUs and MIG slices per gpulease server: its pod's requests, or what an
    admitted start whose pod is not bound yet asks (counted as queued)."""
    single = {n.name for n in inventory.nodes if n.mig_strategy == "single"}
    counts: dict[tuple[str, str], list[int]] = {}
    for hold in inventory.holds:
        if not hold.user:
            continue
        row = counts.setdefault((hold.user, hold.server), [0, 0])
        for resource, count in hold.resources.items():
            is_slice = resource.startswith("nvidia.com/mig-") or hold.node in single
            row[1 if is_slice else 0] += count
    held = [Holding(user, server, gpus, slices) for (user, server), (gpus, slices)
            in counts.items()]
    return held + [Holding(user, server, *asks(request), queued=True)
                   for (user, server), request in unbound.items()]


class ClusterQueueRunner(QueueBase):
    """The cluster's queue: starts admitted to counted capacity (see the module doc)."""

    def __init__(self, ctx: GPULeaseContext, api: client.CoreV1Api,
                 selector: Mapping[str, str] = {},
                 tolerations: Sequence[Mapping[str, str]] = (), poll_s: float = 5.0, *,
                 namespace: str | None = None, dra: client.ResourceV1Api | None = None):
        super().__init__(ctx, poll_s)
        self.api = api
        self.dra = dra  # DRA mode: the inventory is NVIDIA's slices and the claims
        self.namespace = namespace  # the servers' (only there is a pod gpulease's)
        self.selector = dict(selector)
        self.tolerations = [dict(t) for t in tolerations]
        self.watch: ClusterWatch | None = None
        self.admitted: dict[tuple[str, str], DeviceRequest] = {}
        self.admitted_as: dict[tuple[str, str], AdmittedStart] = {}  # with their tiers
        self._running: set[tuple[str, str]] = set()  # started; admitted until seen bound
        # Both tiers have a PriorityClass (GPUKubeSpawner.spot_preempts): an on-demand
        # start counts what spot pods hold as free, and kube-scheduler preempts them.
        self.spot_yields = False
        # DRA mode with spot preemption configured: kube-scheduler does not preempt for
        # claims, so this runner stops the victims itself (dra_preemption.py).
        self.claims_preempt = False
        self.spot_grace_s = SPOT_GRACE_S  # the spawners' spot_grace_period (displacement's)
        self.claim_preemptions = ClaimPreemptions(ctx, SPOT_GRACE_S)
        self._told: set[str] = set()  # uids of preempted pods whose users were told

    # --- the picture -------------------------------------------------------------------

    async def inventory(self) -> ClusterInventory:
        """The nodes of this runner's selector and every pod's holds, as watched now."""
        if self.watch is None:
            self.watch = ClusterWatch(self.api, on_change=self._changed,
                                      servers_namespace=self.namespace, on_pod=self._pod_seen,
                                      dra=self.dra)
            for w in self.watch.watches:
                w.start()
        for w in self.watch.watches:
            if not w.first_list.done() and w.failures:  # pausing, up to 30 s: list now
                await w.stop()
                w.start()
        lists = asyncio.gather(*(w.first_list for w in self.watch.watches))
        try:
            await asyncio.wait_for(asyncio.shield(lists), WATCH_READY_S)
        except TimeoutError:
            why = next((w.last_error for w in self.watch.watches if w.last_error), "no answer")
            kinds = [w.kind for w in self.watch.watches]
            what = f"{', '.join(kinds[:-1])} and {kinds[-1]}"
            raise Refused(503, f"Cannot read the cluster's {what} from the Kubernetes "
                               f"API server ({why}); try again shortly.") from None
        return select_nodes(self.watch.inventory(), self.selector, self.tolerations)

    def unbound(self, inventory: ClusterInventory) -> dict[tuple[str, str], DeviceRequest]:
        """Admitted starts whose pod is not bound to a node yet (as this picture shows).

        A start whose pod runs is forgotten only once this watch, too, sees its pod
        bound: until then its admission is what counts it (the watch may lag the
        spawner's own, or be failing)."""
        bound = {(h.user, h.server) for h in inventory.holds if h.node and h.user}
        for key in self._running & bound:
            self._running.discard(key)
            self.admitted.pop(key, None)
            self.admitted_as.pop(key, None)
        return {key: r for key, r in self.admitted.items() if key not in bound}

    def _changed(self) -> None:
        if self.waiting:  # a pod or node changed: capacity may have come free
            self._kick()

    def _pod_seen(self, pod: dict) -> None:
        """A spot server's pod kube-scheduler started preempting: its user is told, once."""
        preempted = preempted_pod(pod, self.namespace)
        if preempted is None or preempted.uid in self._told:
            return
        self._told.add(preempted.uid)
        self._spawn(tell_preempted(self.ctx, preempted))

    # --- admission ---------------------------------------------------------------------

    async def admit(
        self, user: str, server: str, profile: str, request: DeviceRequest, *,
        user_groups: Collection[str] = (), group_members: Mapping[str, Collection[str]] = {},
        max_wait: float = 0.0, max_length: int = 1000, max_per_user: int = 0,
        spot: bool = False, reservation: int | None = None, tier: str | None = None,
    ) -> ClusterAdmitted:
        """Check the limits, then admit now or wait in the queue for room.

        Raises Refused as QueueRunner.admit does: 409 over a limit or the queue
        places, 422 no node could ever run it (naming what exists), 503 no room
        and no queueing, the queue full, `max_wait` passed, or the API server away.
        """
        key = (user, server)
        tier = start_tier(spot, reservation, tier)
        # Outside the lock: while the API server is away, concurrent starts each wait
        # WATCH_READY_S at most, not one after another.
        await self.inventory()
        async with self._lock:
            inventory = await self.inventory()
            limit_table = await asyncio.to_thread(self.ctx.limits.all)
            unbound = self.unbound(inventory)
            holdings = cluster_holdings(inventory, unbound) + [
                Holding(t.user, t.server, *asks(t.request), queued=True) for t in self.waiting]
            refusal = check_limits(user, server, *asks(request), user_groups, group_members,
                                   limit_table, holdings)
            if refusal is not None:
                raise Refused(409, refusal.message)
            me: Hashable = object()
            queue = self.entries() + [Waiting(me, request, reservation=reservation, tier=tier)]
            decision = plan_cluster(queue, inventory, tuple(unbound.values()), self.spot_yields,
                                    await self._withholding(inventory))
            never = dict(decision.never)
            if me in never:
                raise Refused(422, never[me] + self._no_driver(inventory))
            node = dict(decision.start).get(me)
            if node is not None:
                self._admit(key, request, tier, reservation, node)
                log.info("%s/%s admitted for %s (fits on %s)", user, server,
                         request.describe(), node)
                return ClusterAdmitted(node, avoid=too_old_nodes(inventory, request),
                                       pinned=me in decision.pinned)
            if max_wait <= 0 and self.claims_preempt and self.claim_preemptions.would_preempt(
                    request, tier, inventory, tuple(unbound.values())):
                # waits, without a queue otherwise, for the servers it preempts to go
                max_wait = self.spot_grace_s + CLAIMS_CLEARED_S
            if max_wait <= 0:
                raise Refused(503, self._no_room(request, inventory))
            theirs = queue_places_refusal(user, [(t.user, t.server) for t in self.waiting],
                                          max_per_user)
            if theirs is not None:
                raise Refused(409, theirs)
            if len(self.waiting) >= max_length:
                raise Refused(503, f"No free {request.describe()}, and the queue is full "
                                   f"({len(self.waiting)} spawns waiting). Try again later.")
            ticket = await self._enqueue(user, server, profile, request, tier, reservation)
        node, pinned = await self._wait_in_queue(ticket, max_wait)
        # The picture as watched now (no wait: the admission is made, and counted)
        picture = select_nodes(self.watch.inventory(), self.selector, self.tolerations)
        avoid = too_old_nodes(picture, request)
        return ClusterAdmitted(node, (utcnow() - ticket.enqueued_at).total_seconds(), True,
                               avoid, pinned)

    def done(self, user: str, server: str, running: bool = False) -> None:
        """The start of user/server ended. Failed, or its server stopped (`running`
        False): forget its admission now. Its pod runs: forget it once the watch sees
        the pod bound (`unbound`); from then on the pod is what counts."""
        key = (user, server)
        if running and key in self.admitted:
            self._running.add(key)
            return
        self._running.discard(key)
        self.admitted_as.pop(key, None)
        if self.admitted.pop(key, None) is not None:
            self.released()

    def _admit(self, key: tuple[str, str], request: DeviceRequest, tier: str,
               reservation: int | None, node: str) -> None:
        self.admitted[key] = request
        self.admitted_as[key] = AdmittedStart(request, tier, reservation, node)
        self._running.discard(key)

    async def _withholding(self, inventory: ClusterInventory) -> Withholding:
        """What the reservations active now withhold, as the cluster is watched now."""
        active = await asyncio.to_thread(self.ctx.reservations.active)
        unbound = self.unbound(inventory)
        return cluster_withholding(
            inventory, {k: s for k, s in self.admitted_as.items() if k in unbound}, active)

    async def reservation_use(self) -> dict[int, set[tuple[str, str]]]:
        """The servers on each reservation's units: pods labelled with it, and admitted
        starts on it whose pods are not bound yet."""
        inventory = await self.inventory()
        used: dict[int, set[tuple[str, str]]] = {}
        for hold in inventory.holds:
            if hold.user and hold.tier == RESERVED and hold.reservation is not None:
                used.setdefault(hold.reservation, set()).add((hold.user, hold.server))
        for key, start in self.admitted_as.items():
            if start.reservation is not None:
                used.setdefault(start.reservation, set()).add(key)
        return used

    def _no_driver(self, inventory: ClusterInventory) -> str:
        """DRA mode with no device published on any node: what an operator must look at."""
        if self.dra is None or any(n.devices for n in inventory.nodes):
            return ""
        return (" NVIDIA's DRA driver publishes no GPU on this cluster's nodes: is it "
                "installed, with its GPU kubelet plugin on them? (docs/deploy.md, GPUs "
                "through DRA)")

    def _no_room(self, request: DeviceRequest, inventory: ClusterInventory) -> str:
        try:
            fit(request, inventory, tuple(self.unbound(inventory).values()))
        except NoFit as nofit:
            return nofit.message
        return f"No {request.describe()} is free for this start now."

    # --- serving the queue -----------------------------------------------------------------

    async def serve(self) -> None:
        """One pass: admit every waiting start that fits now, in the queue's order."""
        async with self._lock:
            await self._withdraw_displacement()
            if self.claims_preempt:  # DRA: preemptions for starts that left are taken back
                await self.claim_preemptions.withdraw_unneeded(self.waiting)
            if not self.waiting:
                return
            inventory = await self.inventory()
            withheld = await self._withholding(inventory)
            decision = plan_cluster(self.entries(), inventory,
                                    tuple(self.unbound(inventory).values()), self.spot_yields,
                                    withheld)
            for ticket, message in decision.never:  # a node left the cluster
                self._settle(ticket, Refused(422, message))
            for ticket, node in decision.start:
                self._admit((ticket.user, ticket.server), ticket.request, ticket.tier,
                            ticket.reservation, node)
                log.info("%s/%s admitted from the queue for %s (fits on %s)", ticket.user,
                         ticket.server, ticket.request.describe(), node)
                self._settle(ticket, (node, ticket in decision.pinned))
            if self.claims_preempt and not decision.start:
                if await self.claim_preemptions.serve(
                        decision.waiting, inventory, tuple(self.unbound(inventory).values())):
                    return
            if not decision.start and not self.unbound(inventory):
                await self._displace_for(decision.waiting, inventory, withheld)

    async def _displace_for(self, waiting: Sequence[Ticket], inventory: ClusterInventory,
                            withheld: Withholding) -> None:
        """The first waiting holder's start that on-demand pods in reserved capacity keep
        out displaces them (gpulease/core/capacity/displacement.py), one displacement at a time:
        their servers are stopped at the deadline through the hub, and the pods go."""
        meter = self.ctx.meter
        if meter is None or displacing(meter) or meter.queue_resuming:
            return
        await displace_first(self.ctx, waiting, self.spot_grace_s, lambda t, started, own:
                             in_the_cluster(t.request, t.reservation, inventory, started,
                                            withheld, self.spot_yields, own))

    async def _withdraw_displacement(self) -> None:
        """A displacement no holder's start waits for any more (it was cancelled, gave up,
        or found room) is taken back before its deadline."""
        meter = self.ctx.meter
        if meter is None or not displacing(meter):
            return
        if any(ticket.reservation is not None for ticket in self.waiting):
            return
        for key in [k for k in meter.preempting
                    if k in meter.live and meter.live[k].tier == ON_DEMAND]:
            await withdraw(self.ctx, key, "no holder's start waits for its GPU any more")

    async def _timed_out(self, ticket: Ticket, max_wait: float) -> Refused:
        try:
            now = self._no_room(ticket.request, await self.inventory())
        except Refused as away:
            now = away.message
        return Refused(503, f"Waited {format_duration(int(max_wait))} in the queue "
                            f"(queue_max_wait) and no {ticket.request.describe()} came free "
                            f"for this start; it is given up. Try again later. {now}")

    async def give_back(self, user: str, server: str) -> None:
        self.done(user, server)

    def _cancelled_after_placing(self, ticket: Ticket) -> None:
        self.done(ticket.user, ticket.server)


_runners: dict[tuple, tuple[GPULeaseContext, ClusterQueueRunner]] = {}


def cluster_runner_for(ctx: GPULeaseContext, api: client.CoreV1Api,
                       selector: Mapping[str, str], tolerations: Sequence[Mapping[str, str]],
                       poll_s: float = 5.0, *, namespace: str | None = None,
                       dra: client.ResourceV1Api | None = None) -> ClusterQueueRunner:
    """The one runner of this context, servers' namespace, node selector, tolerations and
    GPU allocation (device plugin, or DRA) in this process."""
    key = (id(ctx), namespace, frozenset(selector.items()),
           tuple(sorted(tuple(sorted(t.items())) for t in tolerations)), dra is not None)
    entry = _runners.get(key)
    if entry is None or entry[0] is not ctx:
        entry = (ctx, ClusterQueueRunner(ctx, api, selector, tolerations, poll_s,
                                         namespace=namespace, dra=dra))
        _runners[key] = entry
    entry[1].poll_s = poll_s
    return entry[1]


def runners_of(ctx: GPULeaseContext) -> list[ClusterQueueRunner]:
    """The runners of this context in this process (a hub restart serves them once its
    queued starts are back: DRA preemptions no start needs are taken back then)."""
    return [runner for owner, runner in _runners.values() if owner is ctx]
