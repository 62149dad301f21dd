"""Reservations: the rules (pure), over plain dataclasses.

A reservation holds `units` of a profile for an account (user or group) over a
period: one unit is what one server of the profile takes (a MIG slice, or the
profile's cards). The rules, documented for admins in docs/admin.md:

- **Period.** UTC, starting and ending on whole hours, the end after the start,
  the start not before the hour under way: a reservation from the hour under way
  holds at once, and that hour is charged whole.
- **Price.** `reserved_price_per_hour × hours × units`, in integer µcr, charged as
  one ledger row when the reservation is made.
- **Capacity.** Profiles that take the same kind of device (a model, whole cards
  or one MIG profile) share it: at every moment of a new reservation's period, the
  devices of that kind promised to reservations, with the new one's, must not
  exceed the devices of that kind. A request for more than there are at all is
  422; one that others' promises leave no room for is 409, naming the most units
  that are free over the whole period.
- **Refund.** Cancelled before its start: the whole charge. After its start: the
  unused whole hours (those that have not begun), `rate × hours left × units`.
  After its end: nothing. A cancelled reservation's capacity is free again from
  the first hour it refunds.

During a period, what the reservations of a kind hold and their holders do not
use is withheld from everyone else (`withheld`).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpulease.core.refusal import FieldError, Refusal

HOUR = dt.timedelta(hours=1)

# A kind of device: (model, MIG profile), None for whole cards.
DeviceKind = tuple[str, "str | None"]


class ReservationError(Refusal):
    """A reservation refused: its status, why, and the field it is about."""

    def __init__(self, status: int, message: str, field: str = ""):
        super().__init__(message, [FieldError(field, message)], status=status)


@dataclass(frozen=True)
class Reservation:
    """Units of a profile held for an account over [start, end) (UTC, naive)."""

    id: int
    account: str
    profile: str
    kind: DeviceKind
    per_unit: int  # devices of the kind one unit takes (1 for a slice, the profile's cards)
    units: int
    start: dt.datetime
    end: dt.datetime
    rate_per_hour_ucr: int  # the profile's reserved price when it was made
    cancelled_at: dt.datetime | None = None

    @property
    def devices(self) -> int:
        return self.units * self.per_unit

    def holds_until(self) -> dt.datetime:
        """When its capacity is free again: its end, or for a cancelled one the start of
        the first hour it refunded (its start when cancelled before it)."""
        if self.cancelled_at is None:
            return self.end
        return min(self.end, max(self.start, hour_up(self.cancelled_at)))

    def active(self, at: dt.datetime) -> bool:
        return self.start <= at < self.holds_until()


def hour_up(moment: dt.datetime) -> dt.datetime:
    """The whole hour at or after `moment`."""
    whole = moment.replace(minute=0, second=0, microsecond=0)
    return whole if whole == moment else whole + HOUR


def period_errors(start: dt.datetime, end: dt.datetime, now: dt.datetime) -> list[FieldError]:
    """Every problem with a period: on whole hours, not begun, end after start."""
    errors = []
    for field, moment in (("start", start), ("end", end)):
        whole = moment.replace(minute=0, second=0, microsecond=0)
        if moment != whole:  # (the hour before, not after: 9999-12-31T23:30 has no after)
            errors.append(FieldError(field, f"{field} must be on a whole hour (UTC), like "
                                            f"{whole.isoformat()}Z"))
    first = now.replace(minute=0, second=0, microsecond=0)
    if start < first:
        errors.append(FieldError("start", "start must not be in the past: the earliest is "
                                          f"the hour under way, {first.isoformat()}Z (it holds "
                                          "at once, and that hour is charged whole)"))
    if end <= start:
        errors.append(FieldError("end", "end must be after start"))
    return errors


def whole_hours(start: dt.datetime, end: dt.datetime) -> int:
    return max(0, int((end - start) // HOUR))


def reservation_cost(rate_per_hour_ucr: int, units: int, start: dt.datetime,
                     end: dt.datetime) -> int:
    """The one charge of a reservation, µcr (the period is whole hours)."""
    return rate_per_hour_ucr * units * whole_hours(start, end)


def refund_ucr(reservation: Reservation, at: dt.datetime) -> int:
    """What cancelling at `at` gives back (the module's rule)."""
    if at < reservation.start:
        return reservation_cost(reservation.rate_per_hour_ucr, reservation.units,
                                reservation.start, reservation.end)
    return reservation.rate_per_hour_ucr * reservation.units * whole_hours(
        hour_up(at), reservation.end)


def devices_for_units(per_node: Iterable[int], per_unit: int) -> int:
    """The devices of a kind that units of `per_unit` can use: a unit is one server, on
    one node, so a node with 3 cards holds one 2-card unit (2 devices), not 1.5."""
    return sum(count // per_unit * per_unit for count in per_node)


def peak_promised(reservations: Iterable[Reservation], kind: DeviceKind, start: dt.datetime,
                  end: dt.datetime) -> int:
    """The most devices of `kind` promised at any one moment of [start, end)."""
    changes: Counter[dt.datetime] = Counter()
    for r in reservations:
        until = r.holds_until()
        if r.kind != kind or until <= start or r.start >= end:
            continue
        changes[max(r.start, start)] += r.devices
        changes[min(until, end)] -= r.devices
    peak = level = 0
    for moment in sorted(changes):  # an end and a start at one moment: the end first
        level += changes[moment]
        peak = max(peak, level)
    return peak


def capacity_refusal(kind: DeviceKind, per_unit: int, units: int, start: dt.datetime,
                     end: dt.datetime, existing: Iterable[Reservation],
                     devices_of_kind: int, what: str) -> ReservationError | None:
    """Why `units` of a profile taking `per_unit` devices of `kind` cannot be reserved
    over [start, end), or None. `what` names the kind to the reader ("H200 1g.18gb
    slices")."""
    most = devices_of_kind // per_unit
    if units > most:
        return ReservationError(422, f"units: {units} is more than there are: {most} "
                                     f"{what} in all", "units")
    free = (devices_of_kind - peak_promised(existing, kind, start, end)) // per_unit
    if units > free:
        return ReservationError(409, f"units: only {max(free, 0)} of {most} {what} are free "
                                     "over that whole period; other reservations hold the "
                                     "rest", "units")
    return None


def withheld(reservations: Iterable[Reservation], at: dt.datetime,
             in_use: Mapping[int, int]) -> Counter[DeviceKind]:
    """Devices per kind held for reservations at `at` that their holders do not use
    (`in_use`: reservation id -> units its holders run now): nobody else gets them."""
    out: Counter[DeviceKind] = Counter()
    for r in reservations:
        if r.active(at):
            idle = max(0, r.units - in_use.get(r.id, 0))
            if idle:
                out[r.kind] += idle * r.per_unit
    return out
