"""Device placement for the embedded shape: which free devices a request gets.

Pure: an inventory and the set of held device UUIDs in, a placement or a
NoFit out. The database adapter (assignments.py) calls `place` inside the
transaction that records the result, so "free" is always read and written
together.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from gpulease.core.model.device_request import DeviceRequest, cards_text
from gpulease.core.model.drivers import new_enough, too_old
from gpulease.core.model.inventory import AllocatableDevice, Inventory


@dataclass(frozen=True)
class Placement:
    node: str
    devices: tuple[AllocatableDevice, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)


class NoFit(Exception):
    """No placement: 503 would fit but not now, 422 can never fit here."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _order(device: AllocatableDevice) -> tuple[str, int, int]:
    return device.node, device.gpu_index, device.slot if device.slot is not None else -1


def _devices(inventory: Inventory) -> tuple[AllocatableDevice, ...]:
    return _index(inventory).devices


def matches(device: AllocatableDevice, request: DeviceRequest) -> bool:
    """The device is of the request's kind, and its driver runs the request's image."""
    return (device.model == request.model and device.mig_profile == request.mig_profile
            and new_enough(device.driver, request.min_driver,
                           f"GPU {device.gpu_index} of {device.node}"))


def _matching(inventory: Inventory, request: DeviceRequest) -> tuple[AllocatableDevice, ...]:
    """The devices of the request's kind whose driver runs its image; NoFit 422 if there
    are some of the kind but none new enough."""
    index = _index(inventory)
    kind = index.by_kind.get((request.model, request.mig_profile), ())
    key = (request.model, request.mig_profile, request.min_driver)
    if key not in index.matching:
        index.matching[key] = tuple(d for d in kind if matches(d, request))
    matching = index.matching[key]
    if kind and not matching:
        raise NoFit(422, too_old(request.image, request.min_driver, request.describe(),
                                 (d.driver for d in kind)))
    return matching


def free_summary(inventory: Inventory, held: Collection[str]) -> str:
    """What is free now, in words: '3× H200 slice 1g.18gb, 1× H200 (full card)'."""
    held = set(held)
    counts = Counter((d.model, d.mig_profile) for d in _devices(inventory) if d.uuid not in held)
    if not counts:
        return "nothing"
    keys = sorted(counts, key=lambda k: (k[0], k[1] is not None, k[1] or ""))
    return ", ".join(
        cards_text(counts[k], k[0]) if k[1] is None else f"{counts[k]}× {k[0]} slice {k[1]}"
        for k in keys
    )


@dataclass(frozen=True)
class _Index:
    """An inventory's devices in placement order, and by kind (model, MIG profile or None)."""

    devices: tuple[AllocatableDevice, ...]
    by_kind: dict[tuple[str, str | None], tuple[AllocatableDevice, ...]]
    uuids: dict[tuple[str, str | None], frozenset[str]]
    models: tuple[str, ...]  # of the GPUs, MIG or not
    by_uuid: dict[str, AllocatableDevice]
    # Filled as asked: the devices of a kind whose driver is new enough, by
    # (model, MIG profile, min_driver).
    matching: dict[tuple[str, str | None, str | None], tuple[AllocatableDevice, ...]]


# The index of the last inventories seen, by identity: an inventory never changes once
# read, and the spawn page asks `place` and `availability` about every profile against
# the same one (100 profiles x 4,000 devices sorted and filtered each time took the
# page from 12 ms to 730 ms).
_index_cache: dict[int, tuple[Inventory, _Index]] = {}


def _index(inventory: Inventory) -> _Index:
    cached = _index_cache.get(id(inventory))
    if cached is not None and cached[0] is inventory:
        return cached[1]
    devices = tuple(sorted(inventory.allocatable(), key=_order))
    kinds: dict[tuple[str, str | None], list[AllocatableDevice]] = defaultdict(list)
    for d in devices:
        kinds[(d.model, d.mig_profile)].append(d)
    index = _Index(devices, {k: tuple(v) for k, v in kinds.items()},
                   {k: frozenset(d.uuid for d in v) for k, v in kinds.items()},
                   tuple(sorted({gpu.model for node in inventory.nodes for gpu in node.gpus})),
                   {d.uuid: d for d in devices}, {})
    if len(_index_cache) >= 8:
        _index_cache.clear()
    _index_cache[id(inventory)] = (inventory, index)
    return index


def availability(
    inventory: Inventory, held: Collection[str], request: DeviceRequest
) -> tuple[int, int]:
    """(free, total) devices of the kind `request` asks for (cards, not placements)."""
    uuids = _index(inventory).uuids.get((request.model, request.mig_profile), frozenset())
    taken = sum(1 for uuid in held if uuid in uuids)
    return len(uuids) - taken, len(uuids)


def place(request: DeviceRequest, inventory: Inventory, held: Collection[str],
          avoid_nodes: Collection[str] = ()) -> Placement:
    """Devices for `request` that nobody holds; NoFit (422 or 503) otherwise.

    `avoid_nodes`: full cards are not placed there (gpulease/core/capacity/reserved_pool.py keeps
    reserved units of several cards together); a MIG slice is one device, never avoided."""
    held = set(held)
    devices = _devices(inventory)
    # Models of the GPUs, not of the devices: a GPU in MIG mode with no MIG
    # device offers nothing, yet its model is here.
    models = _index(inventory).models
    if request.model not in models:
        here = f"GPU models here: {', '.join(models)}" if models else "this host has no GPU"
        raise NoFit(422, f"No {request.model} GPU here, so {request.describe()} can never be "
                         f"placed ({here}).")
    matching = _matching(inventory, request)
    if request.mig_profile is not None:
        return _place_mig(request, devices, matching, held, inventory)
    return _place_cards(request, matching, held, inventory, frozenset(avoid_nodes))


def _free_now(inventory: Inventory, held: set[str]) -> str:
    return f"Free now: {free_summary(inventory, held)}"


def _place_mig(request: DeviceRequest, devices: tuple[AllocatableDevice, ...],
               matching: tuple[AllocatableDevice, ...], held: set[str],
               inventory: Inventory) -> Placement:
    """`matching`: the slices of the request's profile with a driver new enough."""
    if not matching:
        offered = sorted({d.mig_profile for d in devices
                          if d.model == request.model and d.mig_profile})
        why = (f"{request.model} slices here: {', '.join(offered)}" if offered
               else f"no {request.model} here is in MIG mode")
        raise NoFit(422, f"No {request.model} here offers slice {request.mig_profile}, so it can "
                         f"never be placed ({why}). {_free_now(inventory, held)}")
    free = [d for d in matching if d.uuid not in held]
    if not free:
        raise NoFit(503, f"No free {request.describe()}: 0 of {len(matching)} free. "
                         f"{_free_now(inventory, held)}")
    # Pack: take the slice on the GPU that is already the busiest, so whole
    # GPUs stay free for large requests. Ties go to the first in order (`free` is
    # in order: with nothing held, the first).
    by_uuid = _index(inventory).by_uuid
    busy = Counter(by_uuid[uuid].gpu_uuid for uuid in held if uuid in by_uuid)
    best = min(free, key=lambda d: (-busy[d.gpu_uuid], _order(d))) if busy else free[0]
    return Placement(best.node, (best,))


def _place_cards(request: DeviceRequest, cards: tuple[AllocatableDevice, ...], held: set[str],
                 inventory: Inventory, avoid: frozenset[str] = frozenset()) -> Placement:
    """`cards`: the full cards of the request's model with a driver new enough."""
    per_node: dict[str, list[AllocatableDevice]] = defaultdict(list)
    for card in cards:
        per_node[card.node].append(card)
    largest = max((len(c) for c in per_node.values()), default=0)
    if largest < request.count:
        why = (f"the largest node has {largest} {request.model} full card"
               f"{'s' if largest != 1 else ''}" if largest
               else f"every {request.model} here is in MIG mode")
        raise NoFit(422, f"{request.describe()} on one node can never be placed ({why}). "
                         f"{_free_now(inventory, held)}")
    free_per_node = {node: [c for c in node_cards if c.uuid not in held]
                     for node, node_cards in per_node.items()}
    fitting = [node for node, free in free_per_node.items()
               if len(free) >= request.count and node not in avoid]
    if not fitting:
        free_total = sum(len(f) for f in free_per_node.values())
        most = max(len(f) for f in free_per_node.values())
        raise NoFit(503, f"No node has {request.describe()} free: {free_total} of {len(cards)} "
                         f"free, at most {most} on one node. {_free_now(inventory, held)}")
    # Best fit: the node with the fewest free cards that still fits, so nodes
    # with many free cards stay available for larger requests.
    node = min(fitting, key=lambda n: (len(free_per_node[n]), n))
    return Placement(node, tuple(free_per_node[node][: request.count]))
