"""Admission on DynamicMIG nodes: whether a request fits now, and what a waiting one keeps. Pure.

On a DynamicMIG node every kind of slice is carved from the same GPUs, so the
counts per kind that cluster_fit.fit works on do not add up: a 3g
carved on a GPU takes room from its 1g's, 2g's and full card alike. Here a
request fits where kube-scheduler's own allocator would give it devices
(partitions.carve, first fit in its order) after the starts admitted but not
bound yet have been given theirs, on the nodes it may use.

The queue's fairness rule (cluster_queue.py: a request may start ahead of an
earlier waiting one only if it cannot delay it) becomes, per device: a request
that waits keeps the placement it is nearest to (`keep_for`: the fewest carved
slices in its way, then the allocator's order), and a later request is not
admitted if the device the allocator would give it overlaps a kept one. Later
starts still fill every hole that delays nobody; the kept placement only
empties, so the waiting request starts once its blockers have ended.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from gpulease.core.capacity.cluster_inventory import (
    ClusterInventory,
    ClusterNode,
    Hold,
    Kind,
    kinds_offered,
)
from gpulease.core.capacity.cluster_offer import offered_somewhere
from gpulease.core.capacity.partitions import Partition, carve, overlap
from gpulease.core.capacity.placement import NoFit
from gpulease.core.model.device_request import DeviceRequest

ADMITTED = "(admitted, not yet bound)"


def _devices_for(node: ClusterNode, request: DeviceRequest, inventory: ClusterInventory,
                 allocated: Collection[str]) -> list[Partition] | None | bool:
    """The devices kube-scheduler would give `request` on `node` now (partitioned), True
    when a static node has room, None/False when it has not."""
    resource = dict(kinds_offered(node)).get((request.model, request.mig_profile))
    if resource is None:
        return None
    if node.partitions is not None and resource in node.partitions.resources():
        return carve(node.partitions, [resource] * request.count, allocated)
    return inventory.free()[node.name].get(resource, 0) >= request.count


def _candidates(request: DeviceRequest, inventory: ClusterInventory,
                skip: Collection[str]) -> list[ClusterNode]:
    kind: Kind = (request.model, request.mig_profile)
    return sorted((n for n in inventory.nodes if n.schedulable and n.name not in skip
                   and kind in dict(kinds_offered(n))), key=lambda n: n.name)


def with_admitted(inventory: ClusterInventory,
                  pending: Sequence[DeviceRequest]) -> ClusterInventory:
    """The inventory once the starts admitted but not bound yet have their devices: each
    as a Hold on the first node (by name) where it fits, in order; one that fits
    nowhere now is left out (it will wait for the scheduler as it would).

    Worked out once per inventory and list: the queue's pass asks for longer and longer
    lists of the same starts, so each prefix is kept and the next start added to it."""
    pending = tuple(pending)
    done = len(pending)
    while done and ("with admitted", pending[:done]) not in inventory._derived:
        done -= 1
    seen = inventory._derived[("with admitted", pending[:done])] if done else inventory
    for i in range(done, len(pending)):
        hold = _admitted_hold(pending[i], inventory, seen)
        if hold is not None:
            seen = ClusterInventory(seen.nodes, (*seen.holds, hold))
        inventory._derived[("with admitted", pending[:i + 1])] = seen
    return seen


def placed(inventory: ClusterInventory, request: DeviceRequest, node: str) -> ClusterInventory:
    """The inventory once `request`, admitted and pinned to `node`, has its devices there
    (the allocator's first fit on that node)."""
    where = next(n for n in inventory.nodes if n.name == node)
    resource = dict(kinds_offered(where))[(request.model, request.mig_profile)]
    devices: tuple[str, ...] = ()
    if where.partitions is not None and resource in where.partitions.resources():
        got = carve(where.partitions, [resource] * request.count, inventory.allocated_on(node))
        devices = tuple(d.key for d in got or ())
    hold = Hold(ADMITTED, node, {resource: request.count}, devices=devices)
    return ClusterInventory(inventory.nodes, (*inventory.holds, hold))


def _admitted_hold(request: DeviceRequest, base: ClusterInventory,
                   seen: ClusterInventory) -> Hold | None:
    """Where one admitted start goes once `seen`'s have theirs (`base` without them)."""
    try:
        old = offered_somewhere(request, base)
    except NoFit:
        return None
    added = seen.holds[len(base.holds):]
    for node in _candidates(request, base, old):
        resource = dict(kinds_offered(node))[(request.model, request.mig_profile)]
        if node.partitions is not None and resource in node.partitions.resources():
            got = carve(node.partitions, [resource] * request.count,
                        seen.allocated_on(node.name))
            if got:
                return Hold(ADMITTED, node.name, {resource: request.count},
                            devices=tuple(d.key for d in got))
            continue
        room = base.free()[node.name].get(resource, 0) - sum(
            h.resources.get(resource, 0) for h in added if h.node == node.name)
        if room >= request.count:
            return Hold(ADMITTED, node.name, {resource: request.count})
    return None


def partitioned_fit(request: DeviceRequest, inventory: ClusterInventory,
                    pending: tuple[DeviceRequest, ...] = (),
                    reserved: Mapping[Kind, Collection[str]] | None = None,
                    kept: Collection[str] = ()) -> str:
    """cluster_fit.fit for an inventory with DynamicMIG nodes; NoFit 422 or 503."""
    old = offered_somewhere(request, inventory)
    seen = with_admitted(inventory, pending)
    skip = set(old) | set((reserved or {}).get((request.model, request.mig_profile), ()))
    kept_devices = _kept(seen, kept)
    for node in _candidates(request, seen, skip):
        got = _devices_for(node, request, seen, seen.allocated_on(node.name))
        if isinstance(got, list) and node.partitions is not None:
            if any(overlap(d, k, node.partitions) for d in got
                   for k in kept_devices.get(node.name, ())):
                continue  # it would take room an earlier waiting request is kept
            return node.name
        if got:
            return node.name
    raise NoFit(503, f"No {request.model} GPU has room to carve {request.describe()} now "
                     f"({_carved_summary(seen, request)}).")


def _kept(inventory: ClusterInventory, kept: Collection[str]) -> dict[str, list[Partition]]:
    out: dict[str, list[Partition]] = {}
    for node in inventory.nodes:
        if node.partitions is not None:
            out[node.name] = [d for k in kept if (d := node.partitions.device(k)) is not None]
    return out


def _carved_summary(inventory: ClusterInventory, request: DeviceRequest) -> str:
    carved: Counter[str] = Counter()
    for node in inventory.nodes:
        if node.partitions is None or node.model != request.model:
            continue
        for key in inventory.allocated_on(node.name):
            device = node.partitions.device(key)
            if device is not None:
                carved[device.profile or "full GPU"] += 1
    return ("carved now: " + ", ".join(f"{n} x {p}" for p, n in sorted(carved.items()))
            if carved else "nothing carved, but no GPU a start may use has room")


def keep_for(request: DeviceRequest, inventory: ClusterInventory,
             kept: Collection[str] = (), skip: Collection[str] = ()) -> list[str]:
    """What a waiting `request` keeps on DynamicMIG nodes (not those in `skip`, nor where
    its image's driver is too old): the placement(s) of its kind nearest to free (the
    fewest carved devices overlapping them) that overlap nothing an earlier request
    keeps; of equals the LAST in the allocator's order, since later starts are carved
    first fit from the front and so keep clear of it longest. [] where it has none."""
    kind: Kind = (request.model, request.mig_profile)
    kept_devices = _kept(inventory, kept)
    try:
        old = offered_somewhere(request, inventory)
    except NoFit:
        return []
    best: tuple[int, int, list[str]] | None = None  # (blockers, -order, keys)
    order = 0
    for node in _candidates(request, inventory, set(skip) | set(old)):
        partitions, resource = node.partitions, dict(kinds_offered(node)).get(kind)
        if partitions is None or resource not in partitions.resources():
            continue
        allocated = [d for k in inventory.allocated_on(node.name)
                     if (d := partitions.device(k)) is not None]
        free_of_kept = [d for d in partitions.of_kind(resource)
                        if not any(overlap(d, k, partitions)
                                   for k in kept_devices.get(node.name, ()))]
        for first in free_of_kept:  # each placement as the first of the request's devices
            order += 1
            chosen = [first]
            for device in free_of_kept:
                if len(chosen) == request.count:
                    break
                if not any(overlap(device, c, partitions) for c in chosen):
                    chosen.append(device)
            if len(chosen) < request.count:
                continue
            blockers = {a.key for a in allocated for c in chosen if overlap(c, a, partitions)}
            if best is None or (len(blockers), -order) <= best[:2]:
                best = (len(blockers), -order, [c.key for c in chosen])
    return best[2] if best else []
