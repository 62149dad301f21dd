"""What reservations withhold from other starts (pure), on the embedded box.

During its period a reservation holds `units × per_unit` devices of its kind
(gpulease.core.capacity.reservation_rules). Per kind of device with a reservation active:

- an on-demand start (one of no holder, or of a holder whose units are all in
  use) may take only what the reservations leave: the devices of the kind,
  less those reserved, less those held by on-demand servers (and out of
  service): `on_demand_room`;
- a start on a reservation (tier reserved) needs an idle unit of it
  (`reservation_room`) and a free device, whoever else waits;
- a spot start takes any free device, reserved ones included: while holders do
  not use them, reserved devices earn spot's rate, and a holder's start preempts
  the spot servers on them (spawners/queueing/spot_preemption.py) like an on-demand one. So
  does the start of any tier whose servers yield to a holder's (a preemptible tier of
  a lower queue rank: gpulease/core/tiers.py yields_to); the `spot` arguments below
  say that of a start.

A unit of several cards is one server, so it needs its cards on one node. An
on-demand start may therefore also not take cards where that would break up the
room the idle units need: counted per node (`node_room`: the cards of the kind
no on-demand or reserved server holds), the idle units that fit on the nodes
must not become fewer (`units_fitting`, best fit, largest units first). A start
on a reservation may make them fewer by its own unit only. The placement avoids
such nodes (`splitting_nodes`, `place_keeping_units`); in the cluster the pod is
kept to the node admitted (spawners/kube/cluster_runner.py).

Kinds without an active reservation have no room limit: absent from the maps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpulease.core.capacity.placement import NoFit, Placement, place
from gpulease.core.capacity.reservation_rules import DeviceKind, Reservation
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory
from gpulease.core.tiers import RESERVED, yields_to


@dataclass(frozen=True)
class HeldBy:
    """One held device, as withholding counts it."""

    tier: str  # a tier's name; out-of-service devices count as ON_DEMAND
    server: tuple[str, str]  # (user, server)
    reservation_id: int | None = None


def units_fitting(room: Mapping[str, int], sizes: Iterable[int]) -> int:
    """How many units of `sizes` devices each fit on nodes with `room` free devices each
    (a unit on one node): largest first, each on the node it leaves the least room on."""
    left = dict(room)
    fitted = 0
    for size in sorted(sizes, reverse=True):
        fits = [node for node, free in left.items() if free >= size]
        if fits:
            node = min(fits, key=lambda n: (left[n], n))
            left[node] -= size
            fitted += 1
    return fitted


@dataclass(frozen=True)
class Withholding:
    on_demand_room: Mapping[DeviceKind, int]
    reservation_room: Mapping[int, int]  # idle units of each active reservation
    reserved: Mapping[DeviceKind, int]  # devices promised now, for messages
    # Per kind with a reservation, per node: the devices idle units could use (free, or
    # held by spot servers).
    node_room: Mapping[DeviceKind, Mapping[str, int]] = field(default_factory=dict)
    unit_of: Mapping[int, tuple[DeviceKind, int]] = field(default_factory=dict)  # id: kind, size

    def _idle_sizes(self, kind: DeviceKind) -> list[int]:
        return [size for rid, (of, size) in self.unit_of.items() if of == kind
                for _ in range(max(self.reservation_room.get(rid, 0), 0))]

    def splitting_nodes(self, request: DeviceRequest, reservation_id: int | None = None,
                        spot: bool = False) -> frozenset[str]:
        """Nodes where `request` would leave fewer idle reserved units fitting (more fewer,
        for a start on a reservation, than its own unit)."""
        kind = (request.model, request.mig_profile)
        sizes = self._idle_sizes(kind)
        if spot or kind not in self.node_room or all(size <= 1 for size in sizes):
            return frozenset()  # units of one device fit wherever the count says
        room = self.node_room[kind]
        before = units_fitting(room, sizes)
        own = 0
        if reservation_id is not None and reservation_id in self.unit_of:
            sizes.remove(self.unit_of[reservation_id][1])
            own = 1
        return frozenset(node for node, free in room.items() if free >= request.count
                         and units_fitting({**room, node: free - request.count}, sizes)
                         < before - own)

    def keeps_units_together(self, request: DeviceRequest, spot: bool = False) -> bool:
        """Whether where `request` goes matters to reserved units (idle ones of several
        devices of its kind): then the cluster keeps its pod to the node admitted."""
        kind = (request.model, request.mig_profile)
        return not spot and any(size > 1 for size in self._idle_sizes(kind))

    def split_refusal(self, request: DeviceRequest) -> str:
        """Why no node may take `request`: each with room would break up reserved units."""
        kind = (request.model, request.mig_profile)
        sizes = sorted(set(self._idle_sizes(kind)), reverse=True)
        return (f"on every node with room for it, it would break up the cards that idle "
                f"reserved units need together ({' or '.join(map(str, sizes))} "
                f"{request.model} cards on one node)")

    def refusal(self, request: DeviceRequest, reservation_id: int | None = None,
                spot: bool = False) -> str | None:
        """Why `request` may not start now for its tier (a reason to wait), or None."""
        if spot:
            return None
        if reservation_id is not None:
            if self.reservation_room.get(reservation_id, 0) < 1:
                return (f"every unit of reservation {reservation_id} is in use or it is not "
                        "active; stop one of its servers, or start on demand")
            return None
        kind = (request.model, request.mig_profile)
        room = self.on_demand_room.get(kind)
        if room is None or room >= request.count:
            return None
        return (f"the rest of the {request.describe()} kind is reserved: "
                f"{self.reserved[kind]} held for reservations now, {max(room, 0)} left for "
                "on-demand starts")

    def take(self, request: DeviceRequest, reservation_id: int | None = None,
             spot: bool = False, node: str | None = None) -> Withholding:
        """After `request` starts on its tier (on `node`, where it is known)."""
        if spot:
            return self
        kind = (request.model, request.mig_profile)
        after = self
        if node is not None and kind in self.node_room:
            per_node = {**self.node_room[kind]}
            per_node[node] = per_node.get(node, 0) - request.count
            after = replace(after, node_room={**self.node_room, kind: per_node})
        if reservation_id is not None:
            rooms = dict(self.reservation_room)
            rooms[reservation_id] = rooms.get(reservation_id, 0) - 1
            return replace(after, reservation_room=rooms)
        if kind not in self.on_demand_room:
            return after
        rooms = dict(self.on_demand_room)
        rooms[kind] -= request.count
        return replace(after, on_demand_room=rooms)


NO_WITHHOLDING = Withholding({}, {}, {})


class SplitsUnits(NoFit):
    """NoFit 503: the request fits only where it would break up idle reserved units. It
    waits as a start its tier may not have now, keeping nothing from those after it."""


def place_keeping_units(request: DeviceRequest, inventory: Inventory, taken: Collection[str],
                        withheld: Withholding, reservation_id: int | None = None,
                        spot: bool = False) -> Placement:
    """`place`, on a node that does not break up idle reserved units; SplitsUnits when
    only such nodes have room."""
    avoid = withheld.splitting_nodes(request, reservation_id, spot)
    if not avoid:
        return place(request, inventory, taken)
    try:
        return place(request, inventory, taken, avoid_nodes=avoid)
    except NoFit as nofit:
        if nofit.status != 503:
            raise
    place(request, inventory, taken)  # its own NoFit when nothing is free at all
    raise SplitsUnits(503, f"No {request.describe()} for this start: "
                           f"{withheld.split_refusal(request)}")


def withholding(inventory: Inventory, held: Mapping[str, HeldBy],
                active: Iterable[Reservation]) -> Withholding:
    """The rooms now: `held` every held device (uuid -> who), `active` the reservations
    holding capacity now."""
    active = list(active)
    if not active:
        return NO_WITHHOLDING
    where = {d.uuid: ((d.model, d.mig_profile), d.node) for d in inventory.allocatable()}
    total = Counter(where.values())
    used = [(*where[uuid], by) for uuid, by in held.items() if uuid in where]
    return rooms(total, used, active)


def rooms(total: Mapping[tuple[DeviceKind, str], int],
          used: Iterable[tuple[DeviceKind, str | None, HeldBy]],
          active: Sequence[Reservation]) -> Withholding:
    """The rooms from the devices of each kind on each node (`total`) and what holds them
    (`used`: one (kind, node, holder) per device; node None where not known yet), in
    either shape. A server still marked reserved on a reservation no longer active (its
    end is being handled) counts as on demand."""
    reserved: Counter[DeviceKind] = Counter()
    for r in active:
        reserved[r.kind] += r.devices
    ids = {r.id for r in active}
    on_demand: Counter[DeviceKind] = Counter()
    node_room: dict[DeviceKind, Counter[str]] = {kind: Counter() for kind in reserved}
    for (kind, node), count in total.items():
        if kind in node_room:
            node_room[kind][node] += count
    servers_on: dict[int, set[tuple[str, str]]] = {}
    for kind, node, by in used:
        if yields_to(by.tier, RESERVED):
            continue
        if by.tier == RESERVED and by.reservation_id in ids:
            servers_on.setdefault(by.reservation_id, set()).add(by.server)
        else:
            on_demand[kind] += 1
        if kind in node_room and node is not None:
            node_room[kind][node] -= 1
    kinds_total: Counter[DeviceKind] = Counter()
    for (kind, _node), count in total.items():
        kinds_total[kind] += count
    return Withholding(
        {kind: kinds_total.get(kind, 0) - reserved[kind] - on_demand[kind] for kind in reserved},
        {r.id: r.units - len(servers_on.get(r.id, ())) for r in active},
        dict(reserved),
        {kind: dict(per_node) for kind, per_node in node_room.items()},
        {r.id: (r.kind, r.per_unit) for r in active})


def units_free_now(total: Mapping[tuple[DeviceKind, str], int],
                   used: Iterable[tuple[DeviceKind, str | None, HeldBy]],
                   active: Sequence[Reservation], kind: DeviceKind, per_unit: int,
                   most: int) -> int:
    """How many units of `per_unit` devices of `kind` (up to `most`) a reservation that
    begins now could hold at once, beside what runs now: per node, the devices no
    on-demand or reserved server holds (spot servers yield), less the idle units the
    `active` reservations already promise, each unit whole on one node.

    A reservation beginning now is refused what only displacing running servers would
    give: only a period that begins later displaces (gpulease/core/capacity/displacement.py), so
    nobody can stop others' servers by reserving the hour under way."""
    room: dict[str, int] = {}
    for (of, node), count in total.items():
        if of == kind:
            room[node] = room.get(node, 0) + count
    servers_on: dict[int, set[tuple[str, str]]] = {}
    for of, node, by in used:
        if yields_to(by.tier, RESERVED):
            continue
        if by.tier == RESERVED and by.reservation_id is not None:
            servers_on.setdefault(by.reservation_id, set()).add(by.server)
        if of == kind and node in room:
            room[node] -= 1
    idle = [r.per_unit for r in active if r.kind == kind
            for _ in range(max(r.units - len(servers_on.get(r.id, ())), 0))]
    free = 0
    while free < most and (units_fitting(room, idle + [per_unit] * (free + 1))
                           == len(idle) + free + 1):
        free += 1
    return free
