"""Reservations: the database adapter around their rules
(gpulease/core/capacity/reservation_rules.py).

Making one is one transaction: the period and capacity checks (against every
other reservation, under one lock, so two cannot both take the last units), the
balance check (402), the reservation row and its one `reservation` ledger row.
Cancelling is one transaction too: `cancelled_at` and the `refund` row. Rows
are never deleted; the ledger stays append-only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update

from gpulease.core.capacity.reservation_rules import (
    DeviceKind,
    Reservation,
    ReservationError,
    capacity_refusal,
    period_errors,
    refund_ucr,
    reservation_cost,
)
from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import Profile
from gpulease.core.refusal import Refusal
from gpulease.core.units import format_credits
from gpulease.store.db import reading, reservations
from gpulease.store.ledger import Ledger, advisory_lock

ON_END = ("continue", "suspend")  # its servers at its end: on demand, or suspended
_LOCK = "reservations"


@dataclass(frozen=True)
class Booked:
    """A reservation as stored: the rules' dataclass and what only the record keeps."""

    reservation: Reservation
    cost_ucr: int
    on_end: str
    note: str
    created_at: dt.datetime
    created_by: str
    cancelled_by: str | None = None
    end_noticed_at: dt.datetime | None = None

    @property
    def id(self) -> int:
        return self.reservation.id


def kind_of(profile: Profile) -> tuple[DeviceKind, int]:
    """The kind of device a profile takes and how many of them one unit is."""
    if profile.gpu is None:
        raise ReservationError(422, f"profile: {profile.slug} is CPU only; reservations hold "
                                    "GPUs", "profile")
    if profile.gpu.mig:
        return (profile.gpu.model, profile.gpu.mig), 1
    return (profile.gpu.model, None), profile.gpu.count


def kind_words(kind: DeviceKind) -> str:
    model, mig = kind
    return f"{model} {mig} slices" if mig else f"{model} full cards"


def _row(r) -> Booked:
    return Booked(
        Reservation(r.id, r.account, r.profile_slug, (r.model, r.mig_profile), r.per_unit,
                    r.units, r.starts_at, r.ends_at, r.rate_per_hour_ucr, r.cancelled_at),
        r.cost_ucr, r.on_end, r.note, r.created_at, r.created_by, r.cancelled_by,
        r.end_noticed_at)


def _lasting(conn: Connection, now: dt.datetime) -> list[Reservation]:
    """Every reservation that holds capacity at or after `now`."""
    rows = conn.execute(select(reservations).where(reservations.c.ends_at > now))
    return [b.reservation for b in map(_row, rows) if b.reservation.holds_until() > now]


def _running_refusal(units: int, free: int, most: int, what: str,
                     soonest: dt.datetime | None) -> ReservationError | None:
    if units <= free:
        return None
    later = (f"; a period from {soonest.isoformat()}Z on is promised against other "
             "reservations only" if soonest is not None else "")
    return ReservationError(409, f"units: only {free} of {most} {what} are free now, and the "
                                 "period begins sooner than the hub's reservation_lead_time: "
                                 "running servers and other reservations hold the rest (they "
                                 f"are not stopped for a reservation made so late){later}",
                            "units")


def active_in(conn: Connection, now: dt.datetime) -> list[Reservation]:
    """The reservations holding capacity at `now`, read in the caller's transaction (a
    device claim)."""
    return [r for r in _lasting(conn, now) if r.active(now)]


class ReservationStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, *, account: str, profile: Profile, units: int, start: dt.datetime,
            end: dt.datetime, on_end: str, note: str, actor: str,
            devices_of_kind: Callable[[DeviceKind, int], int],
            now: dt.datetime | None = None,
            free_now: Callable[[DeviceKind, int, list[Reservation]], int] | None = None,
            soonest: dt.datetime | None = None) -> Booked:
        """Check, charge and record a reservation (ReservationError / BillingError).

        `devices_of_kind(kind, per_unit)`: the devices of that kind the shape has in
        service that units of `per_unit` devices can use (reservation_rules
        devices_for_units). `free_now(kind, per_unit, active)`, given for a period that
        begins within the hub's reservation_lead_time: the units it could hold now
        beside the running servers and the `active` reservations
        (reserved_pool.units_free_now); it must fit in them (one made further ahead
        has on-demand servers make way at its start instead). `soonest`: the first
        start that may, for the refusal's message."""
        now = now or utcnow()
        if not profile.offers_reservations:
            raise ReservationError(422, f"profile: {profile.slug} offers no reservations (it "
                                        "has no reserved_price_per_hour)", "profile")
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ReservationError(400, f"units: a whole number of at least 1, got {units!r}",
                                   "units")
        if on_end not in ON_END:
            raise ReservationError(400, f"on_end: {on_end!r} is not one of {', '.join(ON_END)}",
                                   "on_end")
        errors = period_errors(start, end, now)
        if errors:
            raise Refusal("; ".join(e.message for e in errors), errors, status=400)
        kind, per_unit = kind_of(profile)
        rate = profile.reserved_price_per_hour_ucr
        cost = reservation_cost(rate, units, start, end)
        with self.engine.begin() as conn:
            advisory_lock(conn, _LOCK)
            advisory_lock(conn, f"ledger:{account}")
            refusal = capacity_refusal(kind, per_unit, units, start, end, _lasting(conn, now),
                                       devices_of_kind(kind, per_unit), kind_words(kind))
            if refusal is None and free_now is not None:
                refusal = _running_refusal(units, free_now(kind, per_unit, active_in(conn, now)),
                                           devices_of_kind(kind, per_unit) // per_unit,
                                           kind_words(kind), soonest)
            if refusal is not None:
                raise refusal
            balance = Ledger.balance_in(conn, account)
            if balance < cost:
                raise ReservationError(
                    402, f"account: {account} has {format_credits(balance)} credits and the "
                         f"reservation costs {format_credits(cost)} ({units} × "
                         f"{format_credits(rate)} credits per unit-hour × "
                         f"{int((end - start).total_seconds()) // 3600} h)", "account")
            new_id = conn.execute(insert(reservations).values(
                account=account, profile_slug=profile.slug, model=kind[0], mig_profile=kind[1],
                per_unit=per_unit, units=units, starts_at=start, ends_at=end,
                rate_per_hour_ucr=rate, cost_ucr=cost, on_end=on_end, note=note.strip(),
                created_at=now, created_by=actor)).inserted_primary_key[0]
            Ledger.append_in(conn, account, "reservation", -cost,
                             f"reservation {new_id}: {units} × {profile.slug}, "
                             f"{start.isoformat()}Z to {end.isoformat()}Z", actor, now,
                             reservation_id=new_id)
            return _row(conn.execute(select(reservations)
                                     .where(reservations.c.id == new_id)).one())

    def cancel(self, reservation_id: int, actor: str,
               now: dt.datetime | None = None) -> tuple[Booked, int]:
        """Cancel it and refund by the rule; returns it as cancelled and the refund (µcr)."""
        now = now or utcnow()
        with self.engine.begin() as conn:
            advisory_lock(conn, _LOCK)
            row = conn.execute(select(reservations)
                               .where(reservations.c.id == reservation_id)).first()
            if row is None:
                raise ReservationError(404, f"no reservation {reservation_id}", "id")
            booked = _row(row)
            if booked.reservation.cancelled_at is not None:
                raise ReservationError(409, f"reservation {reservation_id} was cancelled at "
                                            f"{booked.reservation.cancelled_at.isoformat()}Z",
                                       "id")
            if now >= booked.reservation.end:
                raise ReservationError(409, f"reservation {reservation_id} ended at "
                                            f"{booked.reservation.end.isoformat()}Z; nothing "
                                            "is left to cancel", "id")
            advisory_lock(conn, f"ledger:{booked.reservation.account}")
            refund = refund_ucr(booked.reservation, now)
            conn.execute(update(reservations).where(reservations.c.id == reservation_id)
                         .values(cancelled_at=now, cancelled_by=actor))
            if refund:
                Ledger.append_in(conn, booked.reservation.account, "refund", refund,
                                 f"reservation {reservation_id} cancelled", actor, now,
                                 reservation_id=reservation_id)
            row = conn.execute(select(reservations)
                               .where(reservations.c.id == reservation_id)).one()
        return _row(row), refund

    def get(self, reservation_id: int) -> Booked | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(reservations)
                               .where(reservations.c.id == reservation_id)).first()
        return None if row is None else _row(row)

    def listed(self, accounts: set[str] | None = None, *, past: bool = False,
               now: dt.datetime | None = None) -> list[Booked]:
        """Reservations (of `accounts`; None: all), by start; ended ones only with `past`."""
        now = now or utcnow()
        query = select(reservations).order_by(reservations.c.starts_at, reservations.c.id)
        if accounts is not None:
            query = query.where(reservations.c.account.in_(sorted(accounts)))
        with reading(self.engine) as conn:
            rows = [_row(r) for r in conn.execute(query)]
        return [b for b in rows if past or b.reservation.holds_until() > now]

    def active(self, now: dt.datetime | None = None) -> list[Reservation]:
        """Those holding capacity now."""
        now = now or utcnow()
        with reading(self.engine) as conn:
            return active_in(conn, now)


    def mark_end_noticed(self, reservation_id: int, at: dt.datetime) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(reservations).where(reservations.c.id == reservation_id)
                         .values(end_noticed_at=at))
