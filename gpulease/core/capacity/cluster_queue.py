"""The cluster shape's queue decision: which waiting spawns may start now. Pure.

The same fairness rule as the embedded queue (gpulease/core/capacity/queue.py): the queue
is served in order, and a request may start ahead of an earlier waiting one
only if it cannot delay it. In the cluster gpulease never picks devices, only
counts per node and resource (gpulease/core/capacity/cluster_inventory.py), so an earlier
request that does not fit now keeps every node that could ever run it: later
requests of its kind do not start there, and an 8-GPU request at the head is
not overtaken forever by 1-GPU requests taking each GPU as it frees. Requests
of other kinds (another model, a MIG slice) still pass.

Admitted requests whose pods are not bound yet come first (`admitted`): the
scheduler has yet to place them, and they must not be counted twice.

On DynamicMIG nodes, where every kind is carved from the same GPUs, a waiting
request keeps the placement nearest to free instead of whole nodes, and later
requests are admitted only where the scheduler would not carve into it
(gpulease/core/capacity/partitioned_fit.py).

Where spot pods yield (`spot_yields`: both tiers have their PriorityClass), an
on-demand request counts what spot servers hold as free: it is admitted, its pod
is made at the higher priority, and kube-scheduler's preemption picks the spot
pods that make room (gpulease tells them: spawners/kube/cluster_preemption.py). A spot
request only ever takes what is free. Generally, a request counts as free what the
servers of the tiers it may preempt hold (gpulease/core/tiers.py yields_to).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import ClusterInventory, Kind, kinds_offered
from gpulease.core.capacity.cluster_offer import nodes_for
from gpulease.core.capacity.partitioned_fit import keep_for, placed, with_admitted
from gpulease.core.capacity.placement import NoFit
from gpulease.core.capacity.queue import Waiting, served_order
from gpulease.core.capacity.reservation_rules import Reservation
from gpulease.core.capacity.reserved_pool import NO_WITHHOLDING, HeldBy, Withholding, rooms
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.tiers import ON_DEMAND


@dataclass
class ClusterPlan:
    """What a pass decides: `start` (key, the node it fits on now) in queue order, `never`
    (key, why no node can ever run it), `waiting` the rest; `pinned` the starts whose
    pods must go on the node admitted (where they go matters to reserved units)."""

    start: list[tuple[Hashable, str]] = field(default_factory=list)
    never: list[tuple[Hashable, str]] = field(default_factory=list)
    waiting: list[Hashable] = field(default_factory=list)
    pinned: set[Hashable] = field(default_factory=set)


def plan_cluster(queue: Sequence[Waiting], inventory: ClusterInventory,
                 admitted: Sequence[DeviceRequest] = (), spot_yields: bool = False,
                 withholding: Withholding = NO_WITHHOLDING) -> ClusterPlan:
    """Serve `queue` (oldest first), each request after room for those before it.

    `withholding`: what reservations keep from on-demand starts (cluster_withholding);
    a start its tier may not have waits without keeping nodes from those after it."""
    # DynamicMIG: each start is carved into the picture where it is admitted (and pinned
    # there), so that those after it see exactly the devices it will get; the starts
    # admitted in earlier passes go where the allocator would put them.
    carving = inventory.partitioned
    if carving:
        inventory, admitted = with_admitted(inventory, admitted), ()
    pending = list(admitted)
    reserved: dict[Kind, set[str]] = defaultdict(set)
    kept: list[str] = []  # DynamicMIG placements kept for waiting requests (partitioned_fit)
    result = ClusterPlan()
    for entry in served_order(queue):
        request = entry.request
        if withholding.refusal(request, entry.reservation, entry.yields) is not None:
            result.waiting.append(entry.key)
            continue
        seen = inventory.yielding_to(entry.tier) if spot_yields else inventory
        kind = (request.model, request.mig_profile)
        splitting = withholding.splitting_nodes(request, entry.reservation, entry.yields)
        try:
            node = fit(request, seen, tuple(pending),
                       {**reserved, kind: reserved[kind] | splitting} if splitting else reserved,
                       kept)
        except NoFit as nofit:
            if nofit.status == 503 and splitting and _fits(request, seen, pending, reserved,
                                                           kept):
                result.waiting.append(entry.key)  # withheld: it keeps no node from others
                continue
            if nofit.status != 503:
                result.never.append((entry.key, nofit.message))
                continue
            reserved[kind] |= {n for n in nodes_for(request, inventory)
                               if n not in _carving(inventory)}
            if carving:
                kept += keep_for(request, seen, kept, reserved[kind])
            result.waiting.append(entry.key)
            continue
        if carving:
            inventory = placed(inventory, request, node)
        else:
            pending.append(request)
        if withholding.keeps_units_together(request, entry.yields) or (
                node in _carving(inventory)):  # DynamicMIG: admitted where it was carved
            result.pinned.add(entry.key)
        withholding = withholding.take(request, entry.reservation, entry.yields, node)
        result.start.append((entry.key, node))
    return result


def _fits(request: DeviceRequest, inventory: ClusterInventory, pending: list[DeviceRequest],
          reserved: Mapping[Kind, set[str]], kept: list[str]) -> bool:
    try:
        fit(request, inventory, tuple(pending), reserved, kept)
    except NoFit:
        return False
    return True


def _carving(inventory: ClusterInventory) -> set[str]:
    """The DynamicMIG nodes: a waiting request keeps placements there, not whole nodes."""
    return {n.name for n in inventory.nodes if n.partitions is not None}


@dataclass(frozen=True)
class AdmittedStart:
    """A start admitted whose pod is not bound yet: what it asks, on which tier."""

    request: DeviceRequest
    tier: str = ON_DEMAND
    reservation: int | None = None
    node: str | None = None  # where it fits (where it is pinned, or likely to go)


def cluster_withholding(inventory: ClusterInventory,
                        admitted: Mapping[tuple[str, str], AdmittedStart],
                        active: Sequence[Reservation]) -> Withholding:
    """What reservations withhold in the cluster (gpulease/core/capacity/reserved_pool.py's rule):
    the devices of each kind are the spawner's nodes' allocatable; they are held by the bound
    pods (gpulease's by their tier label, anyone else's as on demand) and by the admitted
    starts whose pods are not bound yet."""
    if not active:
        return NO_WITHHOLDING
    total, used = cluster_usage(inventory, admitted)
    return rooms(total, used, active)


def cluster_usage(inventory: ClusterInventory,
                  admitted: Mapping[tuple[str, str], AdmittedStart] | None = None,
                  ) -> tuple[dict[tuple[Kind, str], int], list[tuple[Kind, str | None, HeldBy]]]:
    """The devices of each kind per node, and who holds them (one entry per device): the
    bound pods (gpulease's by their tier label, anyone else's as on demand) and the
    `admitted` starts whose pods are not bound yet (node None where not known)."""
    total: Counter[tuple[Kind, str]] = Counter()
    kind_at: dict[tuple[str, str], Kind] = {}
    for node in inventory.nodes:
        if node.partitions is not None:
            continue  # DynamicMIG: not reserved (its kinds share each GPU); nothing withheld
        for kind, resource in kinds_offered(node):
            total[(kind, node.name)] += node.allocatable.get(resource, 0)
            kind_at[(node.name, resource)] = kind
    used: list[tuple[Kind, str | None, HeldBy]] = []
    for hold in inventory.holds:
        by = HeldBy(hold.on_tier, (hold.user, hold.server) if hold.user else (hold.pod, ""),
                    hold.reservation)
        for resource, count in hold.resources.items():
            kind = kind_at.get((hold.node, resource))
            if kind is not None:
                used += [(kind, hold.node, by)] * count
    for key, start in (admitted or {}).items():
        by = HeldBy(start.tier, key, start.reservation)
        kind = (start.request.model, start.request.mig_profile)
        used += [(kind, start.node, by)] * start.request.count
    return dict(total), used
