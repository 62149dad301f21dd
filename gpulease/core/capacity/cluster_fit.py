"""Whether a request fits the cluster now, and on which node: gpulease's admission. Pure.

A request fits when some schedulable node of its model has that many free of
its resource, after the requests already admitted but not yet bound are given
room (first fit, the fullest node first, as the packing scheduler would).
Kubernetes then decides where. Where a node carves DynamicMIG slices, kinds
share its GPUs and partitioned_fit.py decides instead, by the fit rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping

from gpulease.core.capacity.cluster_inventory import ClusterInventory, Kind
from gpulease.core.capacity.cluster_offer import (
    base_free,
    index_of,
    offered_somewhere,
    pick,
    too_old_nodes,
)
from gpulease.core.capacity.partitioned_fit import partitioned_fit
from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest

__all__ = ["fit"]


def fit(request: DeviceRequest, inventory: ClusterInventory,
        pending: tuple[DeviceRequest, ...] = (),
        reserved: Mapping[Kind, Collection[str]] | None = None,
        kept: Collection[str] = ()) -> str:
    """The node `request` would fit on now (after room for `pending`); NoFit 422 or 503.

    `kept`: DynamicMIG devices (partition keys) kept for earlier waiting requests
    (partitioned_fit.py); a request is not admitted where it would overlap one.

    `reserved`: per kind, nodes whose free capacity is kept for earlier waiting
    requests (the fair queue, gpulease/core/capacity/cluster_queue.py); `request` is not
    placed there.

    O(largest free count + pending) per decision: the index is built once per
    inventory (the watch adapter makes a new one as pods and nodes change).
    """
    if inventory.partitioned:  # DynamicMIG: kinds share GPUs
        return partitioned_fit(request, inventory, pending, reserved, kept)
    old = offered_somewhere(request, inventory)
    index = index_of(inventory)
    kind: Kind = (request.model, request.mig_profile)
    moved: dict[Kind, dict[str, int]] = defaultdict(dict)  # room given to pending requests
    for earlier in pending:  # admitted, not yet bound: they come first
        earlier_kind: Kind = (earlier.model, earlier.mig_profile)
        chosen = pick(index, earlier_kind, earlier.count, {
            **moved[earlier_kind], **dict.fromkeys(too_old_nodes(inventory, earlier), 0)})
        if chosen:
            name, free = chosen
            moved[earlier_kind][name] = free - earlier.count
    room = dict(moved[kind])
    for name in set((reserved or {}).get(kind, ())) | old:
        room[name] = 0  # kept for an earlier request, or its driver is too old
    chosen = pick(index, kind, request.count, room)
    if chosen is None:
        free = sum(v * len(names) for v, names in index.buckets[kind].items())
        free -= sum(base_free(index, kind, n) - left for n, left in moved[kind].items())
        raise NoFit(503, f"No {request.model} node has {request.count} free for "
                         f"{request.describe()} now ({free} free across "
                         f"{index.nodes[kind]} node(s)).")
    return chosen[0]
