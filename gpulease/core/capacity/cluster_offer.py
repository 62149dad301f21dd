"""What the cluster offers a request, and where it could ever run: pure.

The per-kind index of an inventory's nodes (built once per inventory), the
refusals for a request no node could ever run (422: no node offers its kind,
or not enough on one node with a driver new enough), and the nodes whose
driver is too old for its image. Admission (cluster_fit.py, partitioned_fit.py)
and the queue build on these.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from gpulease.core.capacity.cluster_inventory import ClusterInventory, Kind, kinds_offered
from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.drivers import new_enough, too_old


@dataclass
class _Index:
    """Per kind: the nodes offering it, and the schedulable ones bucketed by free count."""

    resource: dict[tuple[str, Kind], str]  # (node, kind) -> resource
    largest: dict[Kind, int]
    buckets: dict[Kind, dict[int, list[str]]]  # free count -> node names (sorted)
    nodes: dict[Kind, int]  # how many nodes offer it

    @classmethod
    def of(cls, inventory: ClusterInventory) -> _Index:
        free = inventory.free()
        index = cls({}, {}, defaultdict(lambda: defaultdict(list)), Counter())
        for node in sorted(inventory.nodes, key=lambda n: n.name):
            for kind, resource in kinds_offered(node):
                index.resource[(node.name, kind)] = resource
                index.largest[kind] = max(index.largest.get(kind, 0), node.allocatable[resource])
                index.nodes[kind] += 1
                if node.schedulable:
                    index.buckets[kind][max(free[node.name][resource], 0)].append(node.name)
        return index


def index_of(inventory: ClusterInventory) -> _Index:
    if "index" not in inventory._derived:
        inventory._derived["index"] = _Index.of(inventory)
    return inventory._derived["index"]


def offered_somewhere(request: DeviceRequest, inventory: ClusterInventory) -> frozenset[str]:
    """NoFit 422 when no node could ever run `request` (none offers its kind, or enough of
    it on one node with a driver new enough); else the nodes whose driver is too old."""
    index = index_of(inventory)
    kind: Kind = (request.model, request.mig_profile)
    if kind not in index.largest:
        offered = sorted(f"{k[0]} {'slice ' + k[1] if k[1] else 'full cards'}"
                         for k in index.largest)
        raise NoFit(422, f"No node offers {request.describe()}, so it can never run here "
                         f"(offered: {', '.join(offered) or 'no GPU on any node'}).")
    old = too_old_nodes(inventory, request)
    largest = _largest_new_enough(inventory, index, request, kind, old)
    if request.count > largest:
        raise NoFit(422, f"{request.describe()} needs {request.count} on one node; the largest "
                         f"{request.model} node{' with a driver new enough' if old else ''} "
                         f"has {largest}.")
    return old


def _largest_new_enough(inventory: ClusterInventory, index: _Index, request: DeviceRequest,
                        kind: Kind, old: frozenset[str]) -> int:
    """The most of `kind` one node with a driver new enough for `request` offers; NoFit 422
    when no such node. Without too-old nodes that is the index's figure; with them it is
    worked out once per inventory, kind and driver."""
    if not old:
        return index.largest[kind]
    key = ("largest new enough", kind, request.min_driver)
    if key not in inventory._derived:
        usable = [n for n in inventory.nodes
                  if (n.name, kind) in index.resource and n.name not in old]
        inventory._derived[key] = max(
            (n.allocatable[index.resource[(n.name, kind)]] for n in usable), default=None)
    if inventory._derived[key] is None:
        raise NoFit(422, too_old(request.image, str(request.min_driver), request.describe(),
                                 (n.driver for n in inventory.nodes
                                  if (n.name, kind) in index.resource)))
    return inventory._derived[key]


def nodes_for(request: DeviceRequest, inventory: ClusterInventory) -> set[str]:
    """Every node that could ever run `request`: it offers the kind, enough of it."""
    index = index_of(inventory)
    kind: Kind = (request.model, request.mig_profile)
    old = too_old_nodes(inventory, request)
    return {n.name for n in inventory.nodes
            if (n.name, kind) in index.resource and n.name not in old
            and n.allocatable[index.resource[(n.name, kind)]] >= request.count}


def too_old_nodes(inventory: ClusterInventory, request: DeviceRequest) -> frozenset[str]:
    """Nodes whose driver is older than the request's image needs (none if it needs none)."""
    if not request.min_driver:
        return frozenset()
    key = ("too old", request.min_driver)
    if key not in inventory._derived:
        inventory._derived[key] = frozenset(
            n.name for n in inventory.nodes if n.model is not None
            and not new_enough(n.driver, request.min_driver, f"node {n.name}"))
    return inventory._derived[key]


def base_free(index: _Index, kind: Kind, name: str) -> int:
    for free, names in index.buckets[kind].items():
        if name in names:
            return free
    return 0


def pick(index: _Index, kind: Kind, count: int,
          moved: dict[str, int]) -> tuple[str, int] | None:
    """(node, its free count) of the fullest node with room: packing keeps whole nodes free."""
    best: tuple[int, str, int] | None = None  # (left, name, free)
    buckets = index.buckets.get(kind, {})
    for free in range(count, index.largest.get(kind, 0) + 1):
        name = next((n for n in buckets.get(free, ()) if n not in moved), None)
        if name is not None:
            best = (free - count, name, free)
            break
    for name, free in moved.items():
        if free >= count and (best is None or (free - count, name) < best[:2]):
            best = (free - count, name, free)
    return (best[1], best[2]) if best else None
