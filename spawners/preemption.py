"""Which spot servers an on-demand start preempts (pure).

The rule (docs/admin.md, "spot"): an on-demand request that would otherwise wait may take
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

Several on-demand starts may wait at once (a lab arriving in the morning):
`plan_preemptions` serves them in order within one pass, each first from the
devices already coming free (servers being preempted) that no earlier one took,
then by preempting for it, so that two waiting starts never count on the same
freed device and none waits a second grace period for want of a pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulease.spawners.inventory import Inventory
from gpulease.spawners.placement import DeviceRequest, NoFit, matches, place


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


class SpotIndex:
    """One pass's spot holdings, grouped per node and, once asked, per request kind.

    Within a pass over the queue the held devices and the spot servers do not
    change, while several waiting requests are asked about: the index is built
    once a pass (the devices each node has of a kind, how many are free, its
    spot servers sorted most useful first), and each request's choice is then
    a walk over the nodes holding its kind (bench/tiers.py times both).
    """

    def __init__(self, inventory: Inventory, held: Collection[str],
                 holdings: Iterable[SpotHolding]) -> None:
        self.inventory = inventory
        self.held = held if isinstance(held, (set, frozenset)) else set(held)
        self._by_node = _on_node(holdings)
        self._kinds: dict[tuple, tuple[int, list[tuple[str, int, int, list]]]] = {}

    def _rooms(self, request: DeviceRequest) -> tuple[int, list[tuple[str, int, int, list]]]:
        """The most free usable devices on any node, and per node with spot servers of
        the kind: (node, usable devices, free ones, [(useful devices, holding)] in order)."""
        key = (request.model, request.mig_profile, request.min_driver)
        cached = self._kinds.get(key)
        if cached is not None:
            return cached
        most_free, rooms = 0, []
        for node, usable in _usable_by_node(self.inventory, request).items():
            free = len(usable) - len(usable & self.held)
            most_free = max(most_free, free)
            useful = [(len(h.devices & usable), h) for h in self._by_node.get(node, ())]
            useful = [(n, h) for n, h in useful if n > 0]
            if useful:
                # the most useful first (fewest servers), the most recently started among equals
                useful.sort(key=lambda pair: (-pair[0], -pair[1].started_at, str(pair[1].key)))
                rooms.append((node, len(usable), free, useful))
        self._kinds[key] = most_free, rooms
        return most_free, rooms

    def prepare(self, request: DeviceRequest) -> None:
        """Build the index for the request's kind now (choose builds it when first asked)."""
        self._rooms(request)

    def choose(self, request: DeviceRequest) -> Preemption | None:
        """The spot servers to preempt so that `request` runs (see the module's rule)."""
        most_free, rooms = self._rooms(request)
        if most_free >= request.count:
            return None  # it fits now: nobody needs preempting
        best: tuple[tuple, list[SpotHolding], str] | None = None
        for node, usable, free, useful in rooms:
            if usable < request.count:
                continue
            need, chosen, got = request.count - free, [], 0
            for count, holding in useful:
                if got >= need:
                    break
                chosen.append(holding)
                got += count
            if got < need or (best is not None and len(chosen) > best[0][0]):
                continue
            rank = (len(chosen), -sum(h.started_at for h in chosen), node)
            if best is None or rank < best[0]:
                best = (rank, chosen, node)
        if best is None:
            return None
        _, chosen, node = best
        return Preemption(node, tuple(h.key for h in chosen),
                          frozenset().union(*(h.devices for h in chosen)))


def choose_victims(request: DeviceRequest, inventory: Inventory, held: Collection[str],
                   spot: Iterable[SpotHolding] | SpotIndex) -> Preemption | None:
    """The spot servers to preempt so that `request` runs (see the module's rule).

    `held`: every device held now, spot servers' included. `spot`: the spot
    servers' holdings, or a SpotIndex of this pass (built over the same
    inventory and held devices). None: no choice of spot servers makes room (or
    it fits without preempting anyone: place it instead)."""
    index = spot if isinstance(spot, SpotIndex) else SpotIndex(inventory, held, spot)
    return index.choose(request)


def plan_preemptions(waiting: Sequence[tuple[Hashable, DeviceRequest]], inventory: Inventory,
                     held: Collection[str], spot: Iterable[SpotHolding]
                     ) -> list[tuple[Hashable, Preemption]]:
    """What to preempt, in one pass, for the waiting on-demand requests (in served order).

    `held`: the devices held and not coming free; the devices of servers already
    being preempted are not in it, and those servers are not in `spot`. A request
    that fits in what is free or coming free takes it (later ones do not count on
    it); else it gets the victims `choose_victims` picks among the spot servers not
    yet chosen, and the devices it will be given are kept from later requests. A
    request that no preemption lets run is passed over, and a later, smaller one
    may still preempt (the queue's own pass, spawners/queue.py plan, keeps free
    devices for the earlier one as they come)."""
    taken = set(held)
    remaining = list(spot)
    index: SpotIndex | None = None
    chosen_for: list[tuple[Hashable, Preemption]] = []
    for key, request in waiting:
        try:
            taken |= set(place(request, inventory, taken).uuids)
            index = None
            continue  # it starts once what is coming free has come
        except NoFit as nofit:
            if nofit.status != 503:
                continue
        if index is None:
            index = SpotIndex(inventory, taken, remaining)
        chosen = index.choose(request)
        if chosen is None:
            continue
        chosen_for.append((key, chosen))
        victims = set(chosen.victims)
        remaining = [h for h in remaining if h.key not in victims]
        taken -= chosen.freed
        taken |= set(place(request, inventory, taken).uuids)
        index = None
    return chosen_for
