"""What reservations withhold from other starts (pure), on the embedded box.

During its period a reservation holds `units × per_unit` devices of its kind
(gpulease.hub.reservation_rules). Per kind of device with a reservation active:

- an on-demand start (one of no holder, or of a holder whose units are all in
  use) may take only what the reservations leave: the devices of the kind,
  less those reserved, less those held by on-demand servers (and out of
  service): `on_demand_room`;
- a start on a reservation (tier reserved) needs an idle unit of it
  (`reservation_room`) and a free device, whoever else waits;
- a spot start takes any free device, reserved ones included: while holders do
  not use them, reserved devices earn spot's rate, and a holder's start preempts
  the spot servers on them (spawners/spot_preemption.py) like an on-demand one.

Kinds without an active reservation have no room limit: absent from the maps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpulease.hub.reservation_rules import DeviceKind, Reservation
from gpulease.spawners.inventory import Inventory
from gpulease.spawners.placement import DeviceRequest

ON_DEMAND, SPOT, RESERVED = "on-demand", "spot", "reserved"


@dataclass(frozen=True)
class HeldBy:
    """One held device, as withholding counts it."""

    tier: str  # ON_DEMAND | SPOT | RESERVED; out-of-service devices count as ON_DEMAND
    server: tuple[str, str]  # (user, server)
    reservation_id: int | None = None


@dataclass(frozen=True)
class Withholding:
    on_demand_room: Mapping[DeviceKind, int]
    reservation_room: Mapping[int, int]  # idle units of each active reservation
    reserved: Mapping[DeviceKind, int]  # devices promised now, for messages

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
             spot: bool = False) -> Withholding:
        """After `request` starts on its tier."""
        if spot:
            return self
        if reservation_id is not None:
            rooms = dict(self.reservation_room)
            rooms[reservation_id] = rooms.get(reservation_id, 0) - 1
            return replace(self, reservation_room=rooms)
        kind = (request.model, request.mig_profile)
        if kind not in self.on_demand_room:
            return self
        rooms = dict(self.on_demand_room)
        rooms[kind] -= request.count
        return replace(self, on_demand_room=rooms)


NO_WITHHOLDING = Withholding({}, {}, {})


def withholding(inventory: Inventory, held: Mapping[str, HeldBy],
                active: Iterable[Reservation]) -> Withholding:
    """The rooms now: `held` every held device (uuid -> who), `active` the reservations
    holding capacity now."""
    active = list(active)
    if not active:
        return NO_WITHHOLDING
    kind_of = {d.uuid: (d.model, d.mig_profile) for d in inventory.allocatable()}
    total = Counter(kind_of.values())
    used = [(kind_of[uuid], by) for uuid, by in held.items() if uuid in kind_of]
    return rooms(total, used, active)


def rooms(total: Mapping[DeviceKind, int], used: Iterable[tuple[DeviceKind, HeldBy]],
          active: Sequence[Reservation]) -> Withholding:
    """The rooms from the devices of each kind (`total`) and what holds them (`used`: one
    (kind, holder) per device), in either shape. A server still marked reserved on a
    reservation no longer active (its end is being handled) counts as on demand."""
    reserved: Counter[DeviceKind] = Counter()
    for r in active:
        reserved[r.kind] += r.devices
    ids = {r.id for r in active}
    on_demand: Counter[DeviceKind] = Counter()
    servers_on: dict[int, set[tuple[str, str]]] = {}
    for kind, by in used:
        if by.tier == RESERVED and by.reservation_id in ids:
            servers_on.setdefault(by.reservation_id, set()).add(by.server)
        elif by.tier != SPOT:
            on_demand[kind] += 1
    return Withholding(
        {kind: total.get(kind, 0) - reserved[kind] - on_demand[kind] for kind in reserved},
        {r.id: r.units - len(servers_on.get(r.id, ())) for r in active},
        dict(reserved))
