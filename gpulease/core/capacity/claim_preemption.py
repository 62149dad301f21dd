"""Spot preemption in DRA mode: which servers go for a waiting start, pure.

kube-scheduler (1.36) does not preempt pods for DRA devices: a pod whose claim
cannot be allocated stays Pending, whatever its PriorityClass. So in DRA mode
gpulease chooses, as on the embedded box: for a waiting start of a tier that
may preempt (on demand; a holder's start on its reservation), the node where
stopping the fewest servers of the tiers it may preempt (gpulease/core/tiers.py
yields_to) frees enough of its kind. Those are stopped at the spot deadline
through the hub; the start stays in the queue until their claims' allocations
are cleared (the inventory shows the devices free), and the ordinary fit then
admits it. Servers already being preempted count as gone, so that one start
never preempts twice. On a DynamicMIG node what a server frees depends on where
its slice sits, so there the victims are the fewest whose slices, once gone,
let the allocator carve the start's (partitions.carve).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpulease.core.capacity.cluster_fit import fit
from gpulease.core.capacity.cluster_inventory import ClusterInventory, Hold, kinds_offered
from gpulease.core.capacity.cluster_offer import too_old_nodes
from gpulease.core.capacity.partitioned_fit import with_admitted
from gpulease.core.capacity.partitions import Partition, PartitionedNode, carve, overlap
from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.tiers import yields_to

Key = tuple[str, str]  # (user, server)


@dataclass(frozen=True)
class ClaimPreemption:
    node: str
    victims: tuple[Key, ...]


def without(inventory: ClusterInventory, leaving: Collection[Key]) -> ClusterInventory:
    """The inventory once the servers `leaving`, and every pod already ending, are gone."""
    return ClusterInventory(inventory.nodes, tuple(
        h for h in inventory.holds
        if not (h.leaving or (h.user and (h.user, h.server) in leaving))))


def claim_victims(request: DeviceRequest, tier: str, inventory: ClusterInventory,
                  leaving: Collection[Key] = (), pending: tuple[DeviceRequest, ...] = (),
                  may_stop: Collection[Key] | None = None) -> ClaimPreemption | None:
    """The fewest servers a start of `tier` would preempt for `request`, and where; None
    when it fits once `leaving` (and pods already ending) are gone (nothing to preempt),
    when it could never run (422), or when preempting all it may would not make room.

    `may_stop`: the servers that can be preempted now (running sessions of a preemptible
    tier not being stopped already); None: every server of a tier `tier` may preempt. A
    hold of no such server (a session just closed whose claim is clearing, a pod left
    over) is never chosen: choosing it would stop nothing, or a second server for one
    start."""
    gone = without(inventory, leaving)
    try:
        fit(request, gone, pending)
        return None
    except NoFit as nofit:
        if nofit.status == 422:
            return None
    free = gone.free()
    old = too_old_nodes(gone, request)  # its image's CUDA would not run there
    best: tuple[tuple[int, int, str], ClaimPreemption] | None = None
    for node in gone.nodes:
        resource = dict(kinds_offered(node)).get((request.model, request.mig_profile))
        if resource is None or not node.schedulable or node.name in old:
            continue
        # the most recently started first (the least work lost, as kube-scheduler and the
        # embedded box choose)
        newest_first = sorted((h for h in gone.holds if h.node == node.name and h.user
                               and h.resources and yields_to(h.on_tier, tier)
                               and (may_stop is None or (h.user, h.server) in may_stop)),
                              key=lambda h: (h.since, h.user, h.server), reverse=True)
        if node.partitions is not None and resource in node.partitions.resources():
            found = _carving_victims(node.partitions, resource, request.count,
                                     with_admitted(gone, pending).allocated_on(node.name),
                                     newest_first)
            if found is not None:
                rank = (len(found), 0, node.name)
                if best is None or rank < best[0]:
                    best = (rank, ClaimPreemption(node.name, found))
            continue
        have = max(free[node.name].get(resource, 0), 0)
        # of those, the most devices first
        yielding = sorted((h for h in newest_first if h.resources.get(resource)),
                          key=lambda h: -h.resources[resource])
        chosen: list[Key] = []
        for hold in yielding:
            if have >= request.count:
                break
            chosen.append((hold.user, hold.server))
            have += hold.resources[resource]
        if not chosen or have < request.count:
            continue
        rank = (len(chosen), have - request.count, node.name)  # fewest stopped, least spare
        if best is None or rank < best[0]:
            best = (rank, ClaimPreemption(node.name, tuple(chosen)))
    return best[1] if best else None


def _carving_victims(partitions: PartitionedNode, resource: str, count: int,
                     allocated: set[str], newest_first: list[Hold]) -> tuple[Key, ...] | None:
    """DynamicMIG: the fewest of `newest_first` whose slices, once gone, let the allocator
    carve `count` of `resource` (of equals, the most recently started); None if no
    placement can be freed by stopping only them. Per placement of the kind, the servers
    in its way are those whose slices overlap it: a placement anything else overlaps
    (an on-demand server, a start admitted) is not a choice."""
    holder_of = {d: i for i, h in enumerate(newest_first) for d in h.devices}
    in_place = [d for k in allocated if (d := partitions.device(k)) is not None]
    options = []
    for device in partitions.of_kind(resource):
        blockers = [a.key for a in in_place if overlap(device, a, partitions)]
        if all(b in holder_of for b in blockers):
            victims = sorted({holder_of[b] for b in blockers})
            options.append((len(victims), victims, device))
    options.sort(key=lambda o: (o[0], o[1]))
    chosen: list[Partition] = []
    victims: set[int] = set()
    for _n, stopped, device in options:
        if len(chosen) == count:
            break
        if not any(overlap(device, c, partitions) for c in chosen):
            chosen.append(device)
            victims.update(stopped)
    if len(chosen) < count:
        return None
    freed = allocated - {d for i in victims for d in newest_first[i].devices}
    if carve(partitions, [resource] * count, freed) is None:
        return None
    return tuple((newest_first[i].user, newest_first[i].server) for i in sorted(victims))
