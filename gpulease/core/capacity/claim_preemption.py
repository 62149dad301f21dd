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
never preempts twice.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpulease.core.capacity.cluster_inventory import (
    ClusterInventory,
    fit,
    kinds_offered,
    too_old_nodes,
)
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
        have = max(free[node.name].get(resource, 0), 0)
        # the most devices first, and of equals the most recently started (the least work
        # lost, as kube-scheduler and the embedded box choose)
        newest_first = sorted((h for h in gone.holds if h.node == node.name and h.user
                               and h.resources.get(resource) and yields_to(h.on_tier, tier)
                               and (may_stop is None or (h.user, h.server) in may_stop)),
                              key=lambda h: (h.since, h.user, h.server), reverse=True)
        yielding = sorted(newest_first, key=lambda h: -h.resources[resource])
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
