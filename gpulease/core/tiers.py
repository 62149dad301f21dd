"""The tiers a server runs on: one Tier record each, in one registry.

A Tier record says everything a tier changes, and every place a tier matters reads it:

- its price: `price_field`, the profile's key ("spot_price_per_hour") in the profiles
  file, the REST API and the admin form; the profile's price there is the session's rate
  (gpulease/core/model/profiles.py price_of, gpulease/core/policy/options.py rate_for),
  unless the tier is not `metered` (a reserved unit is paid for by its reservation);
- the queue: a waiting start of a higher `queue_rank` is served first, whenever it
  arrived (gpulease/core/capacity/queue.py served_order);
- preemption: a start preempts, with notice, only servers of a `preemptible` tier of a
  lower rank (`may_preempt`; gpulease/core/capacity/preemption.py and the adapters), and
  a preemptible tier's start takes any free device, reserved ones included
  (gpulease/core/capacity/reserved_pool.py): it yields them when a holder starts;
- the pod: its TIER_LABEL is the name, and its PriorityClass the one configured for
  `priority_class` (spawners/kube/pod_spec.py tier_pod);
- sessions record the name (the `tier` column, 16 characters: no CHECK constraint lists
  the tiers, so a registered one needs no migration); the usage report by tier shows
  `label`;
- a request may name it only if it is `requestable`.

The three built-in tiers:

- on-demand: the profile's price; runs until its user, the culler or credit stops it.
- spot: the profile's lower spot price; preempted, with notice, for an on-demand start.
- reserved: a holder's start on a reservation's unit, paid for by the reservation; the
  hub chooses it, never a request. What ties it to reservations (RESERVED, the
  reservation's label and its withholding) is the reservations' own rule, not the record.

`register` adds one more. A deployment names its tiers in the hub's configuration
(`GPULeaseHub.extra_tiers`, each read by `tier_from_config`); the hub registers them and
hands them to the gpulease service (GPULEASE_EXTRA_TIERS), which registers them alike
(`register_all`), so that both price, queue and report them the same. Tests register
records directly (`registered_tier`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import overload

ON_DEMAND = "on-demand"
SPOT = "spot"
RESERVED = "reserved"

# Every server's pod says its tier; believed in the servers' namespace only, as the user
# label is (gpulease/core/capacity/cluster_inventory.py, hold_from_pod).
TIER_LABEL = "gpulease.io/tier"
# A pod on a reservation's unit (tier reserved) says which (the cluster queue counts the
# units in use by it); believed where the tier label is.
RESERVATION_LABEL = "gpulease.io/reservation"

# A name is a pod label's value and fits the sessions' and assignments' `tier` columns
# (String(16), gpulease/store/db.py).
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?")
# A price field is a profile key beside price_per_hour (gpulease/core/model/profiles.py).
PRICE_FIELD = re.compile(r"([a-z][a-z0-9]*_)*price_per_hour")


@dataclass(frozen=True)
class Tier:
    name: str  # what sessions, pods' TIER_LABEL, requests' "tier" and assignments say
    price_field: str  # the profile's key of its price per hour ("spot_price_per_hour")
    label: str  # what people read for it ("Spot"), e.g. in the usage report by tier
    queue_rank: int  # higher is served first; a start preempts only lower ranks
    preemptible: bool = False  # a higher rank's start may stop it, with notice
    # The PriorityClass its GPU pods take, as the Helm chart names it after the release
    # (<release>-<priority_class>); the spawner maps it to the configured name.
    # None: the cluster's default priority.
    priority_class: str | None = None
    requestable: bool = True  # a request may choose it (reserved is the hub's choice)
    # Its sessions are charged their price per hour; False: they cost nothing as they
    # run (a reserved unit is paid for once, by its reservation).
    metered: bool = True


_BUILT_IN = (
    Tier(ON_DEMAND, "price_per_hour", "On demand", queue_rank=20,
         priority_class="on-demand"),
    Tier(SPOT, "spot_price_per_hour", "Spot", queue_rank=10, preemptible=True,
         priority_class="spot"),
    # At on-demand's rank and PriorityClass: a holder's start is served beside on-demand
    # ones and preempts spot servers on the reserved capacity as they do.
    Tier(RESERVED, "reserved_price_per_hour", "Reserved", queue_rank=20,
         priority_class="on-demand", requestable=False, metered=False),
)
_registry: dict[str, Tier] = {t.name: t for t in _BUILT_IN}


class UnknownTier(ValueError):
    """A tier name no record is registered under."""


def tier(name: str) -> Tier:
    """The record of tier `name`; UnknownTier naming the registered ones."""
    found = _registry.get(name) if isinstance(name, str) else None
    if found is None:
        raise UnknownTier(f"unknown tier {name!r}; allowed: {', '.join(_registry)}")
    return found


def registered() -> tuple[Tier, ...]:
    """Every tier's record, built-in first, then in the order registered."""
    return tuple(_registry.values())


def label_of(name: str) -> str:
    """What people read for tier `name`: its label, or the name itself when no record is
    registered under it (a session recorded by a process that had one)."""
    found = _registry.get(name)
    return found.label if found is not None else name


def is_preemptible(name: str) -> bool:
    """Whether servers on tier `name` yield (False for a name not registered)."""
    found = _registry.get(name)
    return found is not None and found.preemptible


def may_preempt(by: Tier, victim: Tier) -> bool:
    """Whether a start on `by` may preempt a server on `victim`."""
    return victim.preemptible and by.queue_rank > victim.queue_rank


def yields_to(victim: str, by: str) -> bool:
    """`may_preempt` by names: whether a server on tier `victim` yields to a start on tier
    `by` (False where either is not registered)."""
    found, starting = _registry.get(victim), _registry.get(by)
    return found is not None and starting is not None and may_preempt(starting, found)


def preempts_any(name: str) -> bool:
    """Whether a start on tier `name` may preempt the servers of some registered tier."""
    starting = _registry.get(name)
    return starting is not None and any(may_preempt(starting, t) for t in _registry.values())


def register(record: Tier) -> Tier:
    """Add one more tier; returns it. ValueError: a name or price field that is taken or
    malformed."""
    if not NAME.fullmatch(record.name):
        raise ValueError(f"tier name {record.name!r}: 1-16 lower-case letters, digits and "
                         "'-', starting and ending with a letter or digit")
    if record.name in _registry:
        raise ValueError(f"tier {record.name!r} is registered already")
    if not PRICE_FIELD.fullmatch(record.price_field):
        raise ValueError(f"price field {record.price_field!r}: a profile key ending in "
                         "price_per_hour, like preview_price_per_hour")
    on_demand = _registry[ON_DEMAND].queue_rank
    if record.preemptible and record.queue_rank >= on_demand:
        raise ValueError(f"tier {record.name!r} is preemptible, so it ranks below on-demand "
                         f"(queue_rank below {on_demand}), got {record.queue_rank}: an "
                         "on-demand start must be able to preempt it")
    taken = {t.price_field: t.name for t in _registry.values()}
    if record.price_field in taken:
        raise ValueError(f"price field {record.price_field!r} is tier "
                         f"{taken[record.price_field]}'s")
    _registry[record.name] = record
    return record


# What an admin's tier says (GPULeaseHub.extra_tiers), each key with the type it takes.
CONFIG_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,), "price_field": (str,), "label": (str,), "queue_rank": (int,),
    "preemptible": (bool,), "priority_class": (str, type(None)), "requestable": (bool,),
    "metered": (bool,),
}
REQUIRED_KEYS = ("name", "price_field", "label", "queue_rank")


def tier_from_config(data: object) -> Tier:
    """A Tier from one entry of an admin's configuration: a mapping of CONFIG_KEYS (those
    of REQUIRED_KEYS required). ValueError naming what is wrong and what is allowed."""
    if not isinstance(data, dict):
        raise ValueError(f"a tier is a mapping of {', '.join(CONFIG_KEYS)}, got "
                         f"{type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(CONFIG_KEYS)}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (required: "
                         f"{', '.join(REQUIRED_KEYS)})")
    for key, value in data.items():
        types = CONFIG_KEYS[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"{key} takes {wanted}, got {value!r}")
    return Tier(**data)


def register_all(entries: Sequence[object]) -> list[Tier]:
    """Register each configured tier (tier_from_config); one already registered with the
    same record is kept (a process that registers its configuration twice). ValueError
    naming the entry: nothing of the list is registered then."""
    records = []
    for i, data in enumerate(entries):
        try:
            record = tier_from_config(data)
        except ValueError as e:
            raise ValueError(f"tier {i + 1}: {e}") from None
        records.append(record)
    new = [r for r in records if _registry.get(r.name) != r]
    done: list[Tier] = []
    for record in new:
        try:
            done.append(register(record))
        except ValueError as e:
            for earlier in done:
                unregister(earlier.name)
            raise ValueError(f"tier {record.name!r}: {e}") from None
    return records


def as_config(record: Tier) -> dict:
    """The mapping tier_from_config reads back into `record`."""
    return {key: getattr(record, key) for key in CONFIG_KEYS}


def unregister(name: str) -> None:
    """Remove a registered tier (never a built-in one)."""
    if any(t.name == name for t in _BUILT_IN):
        raise ValueError(f"tier {name!r} is built in")
    _registry.pop(name, None)


@contextmanager
def registered_tier(record: Tier) -> Iterator[Tier]:
    """`record` registered for the block (tests)."""
    register(record)
    try:
        yield record
    finally:
        unregister(record.name)


class _Names(Sequence[str]):
    """The names of the registered tiers that `keep`, read from the registry when used."""

    def __init__(self, keep: Callable[[Tier], bool]):
        self._keep = keep

    def _now(self) -> tuple[str, ...]:
        return tuple(t.name for t in _registry.values() if self._keep(t))

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index):
        return self._now()[index]

    def __len__(self) -> int:
        return len(self._now())

    def __eq__(self, other: object) -> bool:
        return self._now() == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(self._now())

    def __repr__(self) -> str:
        return repr(self._now())


# Every tier a session or a pod may carry.
ALL_TIERS: Sequence[str] = _Names(lambda t: True)
# What a request may choose (user_options' "tier"): reserved is the hub's choice.
REQUESTABLE: Sequence[str] = _Names(lambda t: t.requestable)
