"""Which on-demand servers a holder's start displaces from reserved capacity (pure).

A reservation is checked against other reservations when it is made, not
against the on-demand servers that will be running when its period begins:
they were admitted before it, and none can be told how long it will run. From
the period's start no new on-demand start takes the reserved devices
(gpulease/core/capacity/reserved_pool.py), but the servers already on them keep running. When
a holder then starts on an idle unit and no device is free for it (and no spot
server's would do), the capacity must still be there as promised: on-demand
servers standing in reserved capacity are stopped for it, with notice, like a
preempted spot server (spawners/queueing/spot_preemption.py tells them; the meter stops
them at the deadline, reason `preempted`).

The rule, for a start on a reservation needing `count` devices of a kind on one
node:

1. nothing is displaced when some allowed node has room already (free or
   spot-held devices: the start fits, or spot preemption makes room; "spot" here and
   below is any tier that yields to a holder's start, gpulease/core/tiers.py yields_to);
2. the devices that may be displaced (the budget) are the more of: what
   on-demand servers of the kind hold beyond what the reservations leave them
   (`overflow`), and, where the room on the allowed nodes and the overflow
   together would hold the unit if it were on one node, what the best node lacks
   for it (a unit of several cards needs them on one node: on-demand servers
   within their share may still split the nodes so that no unit fits whole);
3. on each node the unit may go to, its on-demand servers of the kind are taken
   until the node's room reaches `count`: first those charged to the
   reservation's own account (`own`: its holders' on-demand servers make way
   before a stranger's), then the newest (the least work lost); a server is
   taken only while the devices displaced so far are fewer than the budget (the
   last one taken may round it up by its own size);
4. of the nodes where that works: the fewest strangers' servers, then the fewest
   servers, the fewest devices, the newest, the node's name, so every pass
   chooses the same.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass

from gpulease.core.capacity.cluster_inventory import ClusterInventory, kinds_offered
from gpulease.core.capacity.cluster_offer import too_old_nodes
from gpulease.core.capacity.placement import matches
from gpulease.core.capacity.reserved_pool import HeldBy, Withholding
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory
from gpulease.core.tiers import ON_DEMAND, RESERVED, yields_to


@dataclass(frozen=True)
class OnDemandServer:
    """A running on-demand server's devices of the start's kind, on one node."""

    key: Hashable  # (user, server) to the caller
    node: str
    devices: int
    started: int  # its session's id: a larger one started later
    own: bool = False  # charged to the reservation's account


@dataclass(frozen=True)
class Displacement:
    """Stop `victims` (`devices` of the kind in all) and the start fits on `node`."""

    node: str
    victims: tuple[Hashable, ...]
    devices: int


def to_displace(count: int, overflow: int, room: Mapping[str, int],
                servers: Iterable[OnDemandServer],
                nodes: Collection[str] | None = None) -> Displacement | None:
    """The on-demand servers a holder's start of `count` devices displaces (the module's
    rule), or None. `room`: per node, the devices of the kind free or held by spot
    servers; `nodes`: the nodes the unit may go to (None: every node in `room`)."""
    allowed = set(room) if nodes is None else set(nodes) & set(room)
    if not allowed or any(room[node] >= count for node in allowed):
        return None
    budget = max(overflow, 0)
    if sum(room[node] for node in allowed) + budget >= count:  # enough, split over nodes
        budget = max(budget, count - max(room[node] for node in allowed))
    on_node: dict[str, list[OnDemandServer]] = defaultdict(list)
    for server in servers:
        if server.node in allowed and server.devices > 0:
            on_node[server.node].append(server)
    best: tuple[tuple, Displacement] | None = None
    for node, here in on_node.items():
        taken: list[OnDemandServer] = []
        given = 0
        for server in sorted(here, key=lambda s: (not s.own, -s.started, str(s.key))):
            if room[node] + given >= count or given >= budget:
                break
            taken.append(server)
            given += server.devices
        if room[node] + given < count:
            continue
        rank = (sum(not s.own for s in taken), len(taken), given,
                -sum(s.started for s in taken), node)
        if best is None or rank < best[0]:
            best = (rank, Displacement(node, tuple(s.key for s in taken), given))
    return None if best is None else best[1]


def on_the_box(request: DeviceRequest, reservation_id: int, inventory: Inventory,
               held: Mapping[str, HeldBy], started: Mapping[Hashable, int],
               withheld: Withholding, own: Collection[Hashable] = ()) -> Displacement | None:
    """The displacement for a waiting holder's start on the embedded box: `held` every
    held device, `started` the running on-demand servers' session ids, `own` those of
    them charged to the reservation's account."""
    if withheld.refusal(request, reservation_id) is not None:
        return None  # no idle unit: its start waits for its own servers
    overflow = -withheld.on_demand_room.get((request.model, request.mig_profile), 0)
    room: dict[str, int] = {}
    holds: dict[tuple[Hashable, str], int] = defaultdict(int)
    for device in inventory.allocatable():
        if not matches(device, request):
            continue
        room.setdefault(device.node, 0)
        by = held.get(device.uuid)
        if by is None or yields_to(by.tier, RESERVED):
            room[device.node] += 1
        elif by.tier == ON_DEMAND and by.server in started:
            holds[(by.server, device.node)] += 1
    servers = [OnDemandServer(key, node, n, started[key], key in own)
               for (key, node), n in holds.items()]
    nodes = set(room) - withheld.splitting_nodes(request, reservation_id)
    return to_displace(request.count, overflow, room, servers, nodes)


def in_the_cluster(request: DeviceRequest, reservation_id: int, inventory: ClusterInventory,
                   started: Mapping[Hashable, int], withheld: Withholding,
                   spot_yields: bool, own: Collection[Hashable] = ()) -> Displacement | None:
    """The displacement for a waiting holder's start in the cluster: counts per node of
    the bound pods (`inventory`, no admitted start unbound), `started` as on_the_box;
    spot pods' devices count as room where they yield."""
    if withheld.refusal(request, reservation_id) is not None:
        return None
    kind = (request.model, request.mig_profile)
    overflow = -withheld.on_demand_room.get(kind, 0)
    resource_on = {node.name: resource for node in inventory.nodes
                   for offered, resource in kinds_offered(node) if offered == kind}
    free = inventory.free()
    room = {node: free[node].get(resource, 0) for node, resource in resource_on.items()}
    servers = []
    for hold in inventory.holds:
        count = hold.resources.get(resource_on.get(hold.node, ""), 0)
        if count and spot_yields and yields_to(hold.on_tier, RESERVED):
            room[hold.node] += count
        elif count and hold.on_tier == ON_DEMAND and (hold.user, hold.server) in started:
            key = (hold.user, hold.server)
            servers.append(OnDemandServer(key, hold.node, count, started[key], key in own))
    nodes = (set(room) - withheld.splitting_nodes(request, reservation_id)
             - too_old_nodes(inventory, request))
    return to_displace(request.count, overflow, room, servers, nodes)
