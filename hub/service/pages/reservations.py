"""Admin page: reservations (admin/reservations), with forms to make and cancel them.

The page lists the reservations now and to come (`?past=true`: ended and
cancelled ones too), states each reservable profile's price per unit-hour
before anything is paid, and (admins) posts two forms: `form=add`, the body of
`POST api/reservations` as text, and `form=cancel` with a reservation's `id`,
as `DELETE api/reservations/{id}`. Both run the API's own code path
(ReservationBase.reservation_input, make_reservation and cancel_reservation:
the same checks, the same store, the same `reservation.add` and
`reservation.cancel` audit entries), so the page accepts and refuses exactly
what the API does. A refusal (400, 402, 409, 422; 404 for a cancel) is shown
beside its field with what was typed kept, and nothing is written; a success
redirects (post/redirect/get) to a message that says what was charged, or
refunded, read back from the ledger.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine, func, select
from tornado import web

from gpulease.core.capacity.reservation_rules import (
    HOUR,
    devices_for_units,
    refund_ucr,
    whole_hours,
)
from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import Profile
from gpulease.core.refusal import Refusal
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service.api.reservations import (
    FIELDS,
    MAX_NOTE,
    ReservationBase,
    offering_reservations,
    reservation_view,
)
from gpulease.hub.service.pages.admin_base import AdminPage
from gpulease.hub.service.pages.credits import ledger_accounts
from gpulease.store.db import ledger_entries, reading
from gpulease.store.reservations import ON_END, Booked, kind_of, kind_words

PAST = {"true": True, "1": True, "false": False, "0": False}
ON_END_WORDS = {
    "continue": "continue: its servers go on on demand from its end, billed to its account",
    "suspend": "suspend: its servers are suspended at its end (homes kept)",
}


def ledger_rows_of(engine: Engine, reservation_id: int) -> list[dict[str, Any]]:
    """The ledger rows of one reservation: its charge, and a cancellation's refund."""
    query = (select(ledger_entries).where(ledger_entries.c.reservation_id == reservation_id)
             .order_by(ledger_entries.c.id))
    with reading(engine) as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def refunded_by_reservation(engine: Engine, ids: list[int]) -> dict[int, int]:
    """What the `refund` rows gave back, per reservation (µcr)."""
    if not ids:
        return {}
    query = (select(ledger_entries.c.reservation_id, func.sum(ledger_entries.c.amount_ucr))
             .where(ledger_entries.c.kind == "refund",
                    ledger_entries.c.reservation_id.in_(ids))
             .group_by(ledger_entries.c.reservation_id))
    with reading(engine) as conn:
        return {int(rid): int(total) for rid, total in conn.execute(query)}


def _units_text(units: int) -> str:
    return f"{units} unit{'' if units == 1 else 's'}"


def price_row(profile: Profile, counts: dict | None) -> dict[str, Any]:
    """One reservable profile: what a unit is, its prices, and how many units exist."""
    kind, per_unit = kind_of(profile)
    words = kind_words(kind)
    return {
        "slug": profile.slug,
        "display_name": profile.display_name,
        "unit": f"{per_unit} {words if per_unit > 1 else words.removesuffix('s')}",
        "reserved": bv.money(profile.reserved_price_per_hour_ucr),
        "on_demand": bv.money(profile.price_per_hour_ucr),
        "units_in_all": "" if counts is None else devices_for_units(
            counts.get(kind, ()), per_unit) // per_unit,
    }


def reservation_row(b: Booked, now, refunded: dict[int, int]) -> dict[str, Any]:
    """One line of the table: the API's view, and what a cancellation gives back."""
    view = reservation_view(b, now)
    open_ = view["state"] in ("upcoming", "active")
    per_unit = b.reservation.per_unit
    return {
        **view,
        "devices_text": view["devices"] + (f" ({per_unit} per unit)" if per_unit > 1 else ""),
        "can_cancel": open_,
        "refund_now": bv.money(refund_ucr(b.reservation, now)) if open_ else "",
        "refunded": (bv.money(refunded[b.id]) if b.id in refunded
                     else "0.000000" if view["state"] == "cancelled" else ""),
    }


def form_body(values: dict[str, str]) -> dict[str, Any]:
    """The posted add form as the API's JSON body: text, with units a number when it is
    one (anything else goes through as text, for the API's check to name)."""
    units = values["units"]
    body: dict[str, Any] = {**values,
                            "units": int(units) if units.isascii() and units.isdigit()
                            and len(units) < 7 else units}
    return body


class ReservationsPage(AdminPage, ReservationBase):
    @web.authenticated
    async def get(self):
        self.viewer()
        await self.show()

    async def show(self, form: str = "", values: dict[str, str] | None = None,
                   errors: dict[str, list[str]] | None = None, status: int = 200) -> None:
        past_arg = self.get_argument("past", "false").lower()
        if past_arg not in PAST:
            raise Refusal.of_field("past", f"past must be true or false, got {past_arg!r}")
        past = PAST[past_arg]
        now = utcnow()
        found = await asyncio.to_thread(self.ctx.reservations.listed, None, past=past,
                                        now=now)
        refunded = await self.run(refunded_by_reservation, self.ctx.engine,
                                  [b.id for b in found if b.reservation.cancelled_at])
        profiles = offering_reservations(await asyncio.to_thread(self.ctx.profiles.list, False))
        try:  # the units that exist; in the cluster shape the API server may be away
            counts: dict | None = await self.devices_of_kind() if profiles else {}
        except Refusal:
            counts = None
        accounts = sorted(await self.run(ledger_accounts, self.ctx.engine),
                          key=lambda a: (not a.startswith("user:"), a))
        message = "" if errors else await self._message()
        hour = now.replace(minute=0, second=0, microsecond=0)
        self.set_status(status)
        self.render("admin_reservations.html",
                    rows=[reservation_row(b, now, refunded) for b in found], past=past,
                    prices=[price_row(p, counts) for p in profiles], accounts=accounts,
                    message=message, form=form, values=values or {}, errors=errors or {},
                    on_end_choices=[(k, ON_END_WORDS[k]) for k in ON_END],
                    fields=FIELDS, max_note=MAX_NOTE, first_start=bv.iso(hour),
                    first_end=bv.iso(hour + HOUR))

    async def _message(self) -> str:
        """After a post: what was charged, or refunded, as the ledger has it."""
        for arg in ("added", "cancelled"):
            text = self.get_argument(arg, "")
            if text.isascii() and text.isdigit() and len(text) <= 12:
                booked = await asyncio.to_thread(self.ctx.reservations.get, int(text))
                if booked is not None:
                    rows = await self.run(ledger_rows_of, self.ctx.engine, booked.id)
                    return await (self._added(booked, rows) if arg == "added"
                                  else self._cancelled(booked, rows))
        return ""

    async def _added(self, b: Booked, rows: list[dict[str, Any]]) -> str:
        r = b.reservation
        charged = -sum(x["amount_ucr"] for x in rows if x["kind"] == "reservation")
        balance = await self.run(self.ledger.balance, r.account)
        hours = whole_hours(r.start, r.end)
        return (f"Reservation {r.id} made for {r.account}: {_units_text(r.units)} of "
                f"{r.profile} ({kind_words(r.kind)}), {bv.iso(r.start)} to {bv.iso(r.end)} "
                f"({hours} h). Charged {bv.money(charged)} credits to {r.account} "
                f"({_units_text(r.units)} × {bv.money(r.rate_per_hour_ucr)} credits per "
                f"unit-hour × {hours} h), one reservation ledger row; its balance is now "
                f"{bv.money(balance)}.")

    async def _cancelled(self, b: Booked, rows: list[dict[str, Any]]) -> str:
        r = b.reservation
        if r.cancelled_at is None:
            return ""
        refund = sum(x["amount_ucr"] for x in rows if x["kind"] == "refund")
        balance = await self.run(self.ledger.balance, r.account)
        if not refund:
            return (f"Reservation {r.id} cancelled: nothing refunded (every hour of it has "
                    f"begun); the balance of {r.account} is {bv.money(balance)}.")
        return (f"Reservation {r.id} cancelled: refunded {bv.money(refund)} credits to "
                f"{r.account} (a refund ledger row); its balance is now "
                f"{bv.money(balance)}.")

    async def post(self):
        self.editor()
        await self.dispatch_form("form", {"add": self._add, "cancel": self._cancel})

    async def _add(self) -> None:
        values = {n: self.get_body_argument(n, "") for n in FIELDS}
        for name in ("account", "profile", "units", "start", "end", "on_end"):
            values[name] = values[name].strip()

        async def save() -> str:
            view = await self.make_reservation(await self.reservation_input(form_body(values)))
            return f"admin/reservations?added={view['id']}"

        await self.submit("add", values, save)

    async def _cancel(self) -> None:
        text = self.get_body_argument("id", "").strip()

        async def save() -> str:
            view, _refund = await self.cancel_reservation(await self.booked(text))
            return f"admin/reservations?cancelled={view['id']}"

        await self.submit("cancel", {"id": text}, save)


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"admin/reservations", ReservationsPage),
]
