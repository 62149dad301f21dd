"""Which spot servers an on-demand start preempts (pure).

The rule (docs/admin.md, "spot"): an on-demand request that would otherwise wait may take
devices from spot servers, on one node. gpulease preempts

1. the fewest spot servers that, with the node's free devices, give the request
   what it needs; then
2. among choices of that many, the most recently started ones (the least work
   lost): the latest sum of start times, then the node's name, so the choice is
   the same on every pass.

Within a node: the fewest servers that give what is needed, and among sets of
that many the most recently started (searched exactly up to 16 spot servers
on the node; past that, the most useful first). kube-scheduler's own choice
(the cluster shape) reprieves the longest-running pods first, which comes to the
same in the common cases.

A spot server's devices that the request cannot use (another kind, a driver too old for its
image) do not count toward it, and a spot server already being preempted is
not in `spot` (its devices come free at the end of its grace period).

Spot requests never preempt: the caller asks only for on-demand ones.

Tiers (gpulease/core/tiers.py): "spot servers" above are those of any preemptible
tier, and "on-demand requests" those of any tier that may preempt one (`may_preempt`:
a preemptible tier of a lower queue rank). A request preempts only servers of the
tiers below its own, and the lowest of them first: a tier's servers are chosen
only where those of the tiers below it cannot make the room (with the built-in tiers,
spot is the one preemptible tier).

Several on-demand starts may wait at once (a lab arriving in the morning):
`plan_preemptions` serves them in order within one pass, each first from the
devices already coming free (servers being preempted) that no earlier one took,
then by preempting for it, so that two waiting starts never count on the same
freed device and none waits a second grace period for want of a pass.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop
from itertools import accumulate, combinations

from gpulease.core.capacity.placement import NoFit, matches
from gpulease.core.capacity.queue import Waiting, plan, usable_devices
from gpulease.core.capacity.reserved_pool import (
    NO_WITHHOLDING,
    SplitsUnits,
    Withholding,
    place_keeping_units,
)
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory
from gpulease.core.tiers import ON_DEMAND, RESERVED, SPOT, tier, yields_to


@dataclass(frozen=True)
class SpotHolding:
    """A running spot server: its devices on one node, and when it started."""

    key: Hashable  # (user, server) to the caller
    node: str
    devices: frozenset[str]  # device UUIDs
    started_at: float  # seconds on any clock the caller uses for all holdings
    tier: str = SPOT  # its (preemptible) tier: only starts of a higher rank preempt it


def spot_holdings(held: Mapping[str, tuple[Hashable, float]], inventory: Inventory,
                  spot: Collection[Hashable],
                  tier_of: Mapping[Hashable, str] | None = None) -> list[SpotHolding]:
    """The holdings of the servers in `spot`, from the held devices
    ({uuid: (server key, claimed at)}), each on its device's node; `tier_of` their tiers
    (spot where it names none)."""
    node_of = {d.uuid: d.node for d in inventory.allocatable()}
    devices: dict[Hashable, set[str]] = defaultdict(set)
    since: dict[Hashable, float] = {}
    for uuid, (key, claimed) in held.items():
        if key in spot and uuid in node_of:
            devices[key].add(uuid)
            since[key] = claimed
    tier_of = tier_of or {}
    return [SpotHolding(key, node_of[next(iter(uuids))], frozenset(uuids), since[key],
                        tier_of.get(key, SPOT))
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


EXACT_UP_TO = 16  # spot servers on one node searched exhaustively (C(16, 8) = 12,870 sets)


@dataclass(frozen=True)
class _Room:
    """One node's spot servers for one request kind, sorted twice for `choose`."""

    node: str
    usable: int  # devices of the kind on the node
    free: int  # of them, not held
    # (devices the request can use, holding), the most useful first
    useful: list[tuple[int, SpotHolding]]
    given: list[int]  # given[i]: devices the i+1 most useful servers give together
    latest: list[tuple[int, SpotHolding]]  # the same, the most recently started first
    latest_sum: list[float]  # latest_sum[i]: start times of the i+1 latest, summed

    def latest_of(self, fewest: int, need: int) -> list[SpotHolding]:
        """Among sets of `fewest` servers giving `need`, the most recently started."""
        if fewest == 1:
            return [next(h for count, h in self.latest if count >= need)]
        if len(self.useful) > EXACT_UP_TO:
            return [h for _, h in self.useful[:fewest]]  # as many, not always the latest
        sets = (chosen for chosen in combinations(self.useful, fewest)
                if sum(count for count, _ in chosen) >= need)
        best = min(sets, key=lambda chosen: (-sum(h.started_at for _, h in chosen),
                                             sorted(str(h.key) for _, h in chosen)))
        return [h for _, h in best]


def _room(node: str, usable: int, free: int, useful: list[tuple[int, SpotHolding]]) -> _Room:
    useful = sorted(useful, key=lambda pair: (-pair[0], -pair[1].started_at, str(pair[1].key)))
    latest = sorted(useful, key=lambda pair: (-pair[1].started_at, str(pair[1].key)))
    return _Room(node, usable, free, useful, list(accumulate(n for n, _ in useful)),
                 latest, list(accumulate(h.started_at for _, h in latest)))


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
        self._kinds: dict[tuple, tuple[int, list[_Room]]] = {}

    def _rooms(self, request: DeviceRequest) -> tuple[int, list[_Room]]:
        """The most free usable devices on any node, and the nodes with spot servers of
        the kind."""
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
                rooms.append(_room(node, len(usable), free, useful))
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
        count = request.count
        fewest, candidates = None, []
        for room in rooms:
            if room.usable < count:
                continue
            # the fewest of its servers giving what the node lacks, by bisection
            i = bisect_left(room.given, count - room.free)
            if i == len(room.given) or (fewest is not None and i + 1 > fewest):
                continue
            if fewest is None or i + 1 < fewest:
                fewest, candidates = i + 1, []
            candidates.append((-room.latest_sum[i], room.node, room))
        if fewest is None:
            return None
        # The nodes where that few suffice, by the latest start times any that many of
        # their servers could have: a node whose bound cannot beat the best so far is not
        # searched (most passes search one node).
        heapify(candidates)
        best: tuple[tuple[float, str], list[SpotHolding]] | None = None
        while candidates:
            bound, node, room = heappop(candidates)
            if best is not None and (bound, node) >= best[0]:
                break
            chosen = room.latest_of(fewest, count - room.free)
            rank = (-sum(h.started_at for h in chosen), node)
            if best is None or rank < best[0]:
                best = (rank, chosen)
        assert best is not None
        (_, node), chosen = best
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


@dataclass
class PreemptionPlan:
    """One pass's decision: `chosen` (waiting key, Preemption) to make now, and
    `unneeded`: servers being preempted whose devices no waiting start will take
    any more (the start they were preempted for has gone): their preemption is
    withdrawn."""

    chosen: list[tuple[Hashable, Preemption]]
    unneeded: list[Hashable]


def plan_preemptions(waiting: Sequence[tuple[Hashable, DeviceRequest]], inventory: Inventory,
                     held: Collection[str], spot: Iterable[SpotHolding],
                     leaving: Mapping[Hashable, frozenset[str]] | None = None,
                     withholding: Withholding = NO_WITHHOLDING,
                     reservation_of: Mapping[Hashable, int | None] | None = None,
                     tier_of: Mapping[Hashable, str] | None = None,
                     ) -> PreemptionPlan:
    """What to preempt, in one pass, for the waiting on-demand requests (in served order).

    `held`: the devices held and not coming free; `leaving`: the servers already
    being preempted and their devices (not in `held`, not in `spot`). As the
    queue's own pass (gpulease/core/capacity/queue.py plan) serves them, a request that fits
    in what is free or coming free takes it (later ones do not count on it);
    else it gets the victims `choose_victims` picks among the spot servers not
    yet chosen, and the devices it will be given are kept from later requests. A
    request that no preemption lets run keeps every device it could use, as the
    queue's pass keeps the free ones, and later requests never preempt a server
    whose devices it could use: the queue would keep them for it, idle.

    Then the check: the queue's own pass is run as it will be once every chosen
    and leaving server's devices are free, and a preemption stands only if the
    devices of each of its victims go to a waiting start there (the queue's
    best fit may place a start elsewhere than it was planned, and a device kept
    for an earlier, blocked start goes to nobody); the rest are dropped and the
    check run again. A leaving server whose devices go to no start is `unneeded`.
    No spot server is preempted for nothing.

    Reservations (`withholding`, and `reservation_of` a start on one): a start its
    tier may not have now (gpulease/core/capacity/reserved_pool.py) preempts nobody; a holder's
    start on its reservation preempts like an on-demand one.

    `tier_of`: the waiting starts' tiers (where it names none: reserved on a
    reservation, else on demand); each preempts only servers of tiers below its own
    (the module's "Tiers")."""
    spot = list(spot)
    leaving = dict(leaving or {})
    reservation_of = dict(reservation_of or {})
    tiers = {key: (tier_of or {}).get(key) or (ON_DEMAND if reservation_of.get(key) is None
                                               else RESERVED) for key, _ in waiting}
    chosen = _tentative(waiting, inventory, held, spot, leaving, withholding, reservation_of,
                        tiers)
    devices_of = {h.key: h.devices for h in spot}
    queue = [Waiting(key, request, reservation=reservation_of.get(key), tier=tiers[key])
             for key, request in waiting]
    while True:
        freed = set().union(*(p.freed for _, p in chosen))
        starts = [(key, set(placement.uuids)) for key, placement in
                  plan(queue, inventory, set(held) - freed, withholding).start]
        used = set().union(*(uuids for _, uuids in starts))
        kept = [(key, p) for key, p in chosen
                if all(devices_of[victim] & used for victim in p.victims)]
        if len(kept) == len(chosen):
            break
        chosen = kept
    # A preemption planned for a start the queue will not serve then is for the start
    # its devices go to (the one its researcher is told of).
    started = {key for key, _ in starts}
    chosen = [(key if key in started else next(k for k, uuids in starts if uuids & p.freed), p)
              for key, p in chosen]
    unneeded = [key for key, devices in leaving.items() if not devices & used]
    return PreemptionPlan(chosen, unneeded)


def _tentative(waiting: Sequence[tuple[Hashable, DeviceRequest]], inventory: Inventory,
               held: Collection[str], spot: list[SpotHolding],
               leaving: Mapping[Hashable, frozenset[str]], withholding: Withholding,
               reservation_of: Mapping[Hashable, int | None], tier_of: Mapping[Hashable, str],
               ) -> list[tuple[Hashable, Preemption]]:
    """The preemptions each waiting request gets in turn (plan_preemptions, before its check)."""
    taken = set(held)
    remaining = list(spot)
    blocked: set[str] = set()  # every device an earlier, blocked request could use
    # This state's SpotIndex of the servers of the tiers up to a queue rank, by that rank
    index: dict[int, SpotIndex] = {}
    chosen_for: list[tuple[Hashable, Preemption]] = []
    for key, request in waiting:
        reservation = reservation_of.get(key)
        yields = yields_to(tier_of[key], RESERVED)  # reservations withhold nothing from it
        if withholding.refusal(request, reservation, yields) is not None:
            continue  # its tier may not have them: the queue keeps nothing for it either
        split: frozenset[str] = frozenset()  # nodes where it would break up reserved units
        try:
            placement = place_keeping_units(request, inventory, taken | blocked, withholding,
                                            reservation, yields)
            taken |= set(placement.uuids)
            withholding = withholding.take(request, reservation, yields, placement.node)
            index = {}
            continue  # it starts once what is coming free has come
        except SplitsUnits:
            split = withholding.splitting_nodes(request, reservation, yields)
        except NoFit as nofit:
            if nofit.status != 503:
                continue
        chosen = None
        # The tiers it may preempt, the lowest first: a tier's servers only where those
        # below cannot make the room. Devices kept for a blocked request are neither free
        # nor to be preempted.
        for rank in _ranks_below(tier_of[key], remaining):
            candidates = [h for h in remaining if not h.devices & blocked
                          and yields_to(h.tier, tier_of[key])
                          and tier(h.tier).queue_rank <= rank]
            if split:  # free devices there are not for it: victims only on the other nodes
                off = {d.uuid for d in inventory.allocatable() if d.node in split}
                chosen = SpotIndex(inventory, taken | blocked | off,
                                   [h for h in candidates if h.node not in split]
                                   ).choose(request)
            else:
                if rank not in index:
                    index[rank] = SpotIndex(inventory, taken | blocked, candidates)
                chosen = index[rank].choose(request)
            if chosen is not None:
                break
        if chosen is not None:
            try:  # where the freed devices put it: not where reserved units break up
                placement = place_keeping_units(request, inventory,
                                                (taken - chosen.freed) | blocked,
                                                withholding, reservation, yields)
            except NoFit:
                chosen = None
        if chosen is None:
            if not split:  # blocked: the queue keeps what it could use (a withheld start,
                blocked |= usable_devices(request, inventory)  # nothing)
            index = {}
            continue
        chosen_for.append((key, chosen))
        victims = set(chosen.victims)
        remaining = [h for h in remaining if h.key not in victims]
        taken = (taken - chosen.freed) | set(placement.uuids)
        withholding = withholding.take(request, reservation, yields, placement.node)
        index = {}
    return chosen_for


def _ranks_below(start_tier: str, holdings: Iterable[SpotHolding]) -> list[int]:
    """The queue ranks of the holdings' tiers a start on `start_tier` may preempt,
    lowest first."""
    return sorted({tier(h.tier).queue_rank for h in holdings if yields_to(h.tier, start_tier)})
