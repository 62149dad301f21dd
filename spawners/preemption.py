"""Which spot servers an on-demand start preempts (pure).

The rule (docs/spot.md): an on-demand request that would otherwise wait may take
devices from spot servers, on one node. gpulease preempts

1. the fewest spot servers that, with the node's free devices, give the request
   what it needs; then
2. among choices of that many, the most recently started ones (the least work
   lost): the latest sum of start times, then the node's name, so the choice is
   the same on every pass.

Within a node the servers holding the most useful devices go first (fewest
servers), the most recently started first among equals. A spot server's
devices that the request cannot use (another kind, a driver too old for its
image) do not count toward it, and a spot server already being preempted is
not in `spot` (its devices come free at the end of its grace period).

Spot requests never preempt: the caller asks only for on-demand ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass

from gpulease.spawners.inventory import Inventory
from gpulease.spawners.placement import DeviceRequest, matches


@dataclass(frozen=True)
class SpotHolding:
    """A running spot server: its devices on one node, and when it started."""

    key: Hashable  # (user, server) to the caller
    node: str
    devices: frozenset[str]  # device UUIDs
    started_at: float  # seconds on any clock the caller uses for all holdings


def spot_holdings(held: Mapping[str, tuple[Hashable, float]], inventory: Inventory,
                  spot: Collection[Hashable]) -> list[SpotHolding]:
    """The holdings of the servers in `spot`, from the held devices
    ({uuid: (server key, claimed at)}), each on its device's node."""
    node_of = {d.uuid: d.node for d in inventory.allocatable()}
    devices: dict[Hashable, set[str]] = defaultdict(set)
    since: dict[Hashable, float] = {}
    for uuid, (key, claimed) in held.items():
        if key in spot and uuid in node_of:
            devices[key].add(uuid)
            since[key] = claimed
    return [SpotHolding(key, node_of[next(iter(uuids))], frozenset(uuids), since[key])
            for key, uuids in devices.items()]


@dataclass(frozen=True)
class Preemption:
    """Stop `victims` (their devices `freed`) and `request` fits on `node`."""

    node: str
    victims: tuple[Hashable, ...]
    freed: frozenset[str]


def _on_node(holdings: Iterable[SpotHolding]) -> dict[str, list[SpotHolding]]:
    by_node: dict[str, list[SpotHolding]] = defaultdict(list)
    for holding in holdings:
        by_node[holding.node].append(holding)
    return by_node


def _node_choice(need: int, usable: set[str], holdings: list[SpotHolding]
                 ) -> list[SpotHolding] | None:
    """The fewest holdings on one node giving `need` usable devices, or None."""
    useful = [(len(h.devices & usable), h) for h in holdings]
    useful = [(n, h) for n, h in useful if n > 0]
    useful.sort(key=lambda pair: (-pair[0], -pair[1].started_at, str(pair[1].key)))
    chosen, got = [], 0
    for count, holding in useful:
        if got >= need:
            break
        chosen.append(holding)
        got += count
    return chosen if got >= need else None


# The usable devices per node of the last inventories and request kinds asked about: an
# inventory never changes once read, and a queue pass asks for many requests over one.
_usable_cache: dict[tuple, tuple[Inventory, dict[str, frozenset[str]]]] = {}


def _usable_by_node(inventory: Inventory, request: DeviceRequest) -> dict[str, frozenset[str]]:
    key = (id(inventory), request.model, request.mig_profile, request.min_driver)
    cached = _usable_cache.get(key)
    if cached is not None and cached[0] is inventory:
        return cached[1]
    by_node: dict[str, set[str]] = defaultdict(set)
    for device in inventory.allocatable():
        if matches(device, request):
            by_node[device.node].add(device.uuid)
    index = {node: frozenset(uuids) for node, uuids in by_node.items()}
    if len(_usable_cache) >= 32:
        _usable_cache.clear()
    _usable_cache[key] = (inventory, index)
    return index


def choose_victims(request: DeviceRequest, inventory: Inventory, held: Collection[str],
                   spot: Iterable[SpotHolding]) -> Preemption | None:
    """The spot servers to preempt so that `request` runs (see the module's rule).

    `held`: every device held now, spot servers' included. None: no choice of spot
    servers makes room (or it fits without preempting anyone: place it instead)."""
    held = held if isinstance(held, (set, frozenset)) else set(held)
    usable_by_node = _usable_by_node(inventory, request)
    if any(len(usable) - len(usable & held) >= request.count
           for usable in usable_by_node.values()):
        return None  # it fits now: nobody needs preempting
    best: tuple[tuple, Preemption] | None = None
    for node, holdings in _on_node(spot).items():
        usable = usable_by_node.get(node)
        if not usable or len(usable) < request.count:
            continue
        chosen = _node_choice(request.count - len(usable - held), usable, holdings)
        if chosen is None:
            continue
        rank = (len(chosen), -sum(h.started_at for h in chosen), node)
        if best is None or rank < best[0]:
            freed = frozenset().union(*(h.devices for h in chosen))
            best = (rank, Preemption(node, tuple(h.key for h in chosen), freed))
    return best[1] if best else None
