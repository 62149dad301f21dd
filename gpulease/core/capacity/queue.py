"""The admission queue's decision: which waiting spawns may start now.

Pure: the waiting requests (oldest first), the inventory and the held device
UUIDs in; the requests that may start, each with its placement, out.

Fairness rule: the queue is served in order, and a request may start ahead of
an earlier waiting one only if it cannot delay it — it takes no device that
the earlier one could use. An earlier request that does not fit now reserves
every free device it could use, so a large request at the head (two full
GPUs) is not starved by a stream of small ones taking each card as it frees;
requests for other kinds of devices (another model, a MIG slice) still pass.

Requests are served by their tier's queue rank (gpulease/core/tiers.py), then in
arrival order: spot requests (the interruptible tier) after every on-demand one,
whenever it arrived, so a spot start takes only what no waiting on-demand start
could use (`served_order`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from gpulease.core.capacity.placement import NoFit, Placement, matches
from gpulease.core.capacity.reserved_pool import (
    NO_WITHHOLDING,
    SplitsUnits,
    Withholding,
    place_keeping_units,
)
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory
from gpulease.core.tiers import ON_DEMAND, RESERVED, SPOT, tier, yields_to

# The default of GPULeaseHub.queue_places_per_user (and the spawner's trait), here only.
QUEUE_PLACES_PER_USER = 3


@dataclass(frozen=True)
class Waiting:
    """One spawn in the queue; `key` identifies it to the caller (e.g. (user, server))."""

    key: Hashable
    request: DeviceRequest
    spot: bool = False  # tier spot (as tier="spot" says; True when the tier is spot)
    reservation: int | None = None  # tier reserved: the reservation whose unit it takes
    # Its tier's name; "": spot where `spot`, reserved on a reservation, else on demand.
    tier: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tier", start_tier(self.spot, self.reservation, self.tier))
        object.__setattr__(self, "spot", self.tier == SPOT)

    @property
    def yields(self) -> bool:
        """Whether its tier yields to a holder's start: reservations withhold nothing
        from it (gpulease/core/capacity/reserved_pool.py's `spot` arguments)."""
        return yields_to(self.tier, RESERVED)


def start_tier(spot: bool, reservation: int | None, named: str | None = "") -> str:
    """A start's tier: `named`, else spot where `spot`, reserved on a reservation, else on
    demand (the older spelling of the queue's callers, which had no other tiers)."""
    return named or (SPOT if spot else RESERVED if reservation is not None else ON_DEMAND)


class _Tiered(Protocol):
    tier: str


T = TypeVar("T", bound=_Tiered)


def served_order(queue: Sequence[T]) -> list[T]:
    """The order a queue is served in: by the tiers' queue rank, highest first, each in
    arrival order (a spot start never delays an on-demand one)."""
    return sorted(queue, key=lambda entry: -tier(entry.tier).queue_rank)


@dataclass
class Plan:
    """What a pass over the queue decides.

    `start`: (key, placement) in queue order, each placed after those before
    it. `never`: keys whose request can never fit here any more (the
    inventory changed under them), with the reason. `waiting`: the rest.
    """

    start: list[tuple[Hashable, Placement]] = field(default_factory=list)
    never: list[tuple[Hashable, str]] = field(default_factory=list)
    waiting: list[Hashable] = field(default_factory=list)


def usable_devices(request: DeviceRequest, inventory: Inventory) -> set[str]:
    """Every device `request` could ever be given: its kind, on a node large enough."""
    matching = [d for d in inventory.allocatable() if matches(d, request)]
    per_node = Counter(d.node for d in matching)
    return {d.uuid for d in matching if per_node[d.node] >= request.count}


def plan(queue: Sequence[Waiting], inventory: Inventory, held: Collection[str],
         withholding: Withholding = NO_WITHHOLDING) -> Plan:
    """Serve `queue` (oldest first) from the free devices, never delaying an earlier request.

    A request its tier may not have now (what reservations withhold: `withholding`)
    waits without keeping devices from the requests after it: only a stop of its own
    tier's servers, or a reservation's end, lets it start."""
    taken = set(held)  # held now, plus what this pass hands out
    kept: set[str] = set()  # free devices an earlier, blocked request could use
    result = Plan()
    for entry in served_order(queue):
        if withholding.refusal(entry.request, entry.reservation, entry.yields) is not None:
            result.waiting.append(entry.key)
            continue
        try:
            placement = place_keeping_units(entry.request, inventory, taken | kept,
                                            withholding, entry.reservation, entry.yields)
        except SplitsUnits:
            result.waiting.append(entry.key)  # withheld: it keeps nothing
            continue
        except NoFit as nofit:
            if nofit.status != 503:
                result.never.append((entry.key, nofit.message))
                continue
            kept |= usable_devices(entry.request, inventory) - taken
            result.waiting.append(entry.key)
            continue
        taken |= set(placement.uuids)
        withholding = withholding.take(entry.request, entry.reservation, entry.yields,
                                       placement.node)
        result.start.append((entry.key, placement))
    return result


def queue_places_refusal(user: str, waiting: Sequence[tuple[str, str]], most: int) -> str | None:
    """Why `user` may not take another place in the queue, or None.

    `waiting`: (user, server) of every spawn in the queue. One user holds at
    most `most` places at once (0: no limit), so that nobody fills the shared
    queue (queue_max_length) and keeps everyone else's starts out of it.
    """
    theirs = [server for who, server in waiting if who == user]
    if most <= 0 or len(theirs) < most:
        return None
    names = ", ".join(f"{user}/{server or '(default)'}" for server in theirs)
    return (f"Over the queue limit of user:{user}: queue_places_per_user {most}; "
            f"{len(theirs)} place{'s' if len(theirs) != 1 else ''} held by {names}. Wait until "
            "one of them starts, or stop one, before queueing another start.")


def position(queue: Sequence[Waiting], key: Hashable) -> int | None:
    """1-based place of `key` in the queue as it is served; None when it is not waiting."""
    for index, entry in enumerate(served_order(queue), start=1):
        if entry.key == key:
            return index
    return None


def restricted(inventory: Inventory, uuids: Collection[str]) -> Inventory:
    """The inventory with only the devices in `uuids`.

    A queued spawn is claimed on exactly the devices its plan chose: the
    claim's own choice (packing, best fit) could otherwise pick a device that
    the plan kept for an earlier request.
    """
    keep = set(uuids)
    nodes = []
    for node in inventory.nodes:
        gpus = []
        for gpu in node.gpus:
            if gpu.mig_enabled:
                migs = tuple(m for m in gpu.mig_devices if m.uuid in keep)
                if migs:
                    gpus.append(replace(gpu, mig_devices=migs))
            elif gpu.uuid in keep:
                gpus.append(gpu)
        if gpus:
            nodes.append(replace(node, gpus=tuple(gpus)))
    return replace(inventory, nodes=tuple(nodes))
