"""Reservations API (api/reservations) of the gpulease service.

- `GET api/reservations[?account=&past=true]`: admins and auditors see every
  reservation; anyone else those of their own account and their groups'.
- `POST api/reservations` `{"account", "profile", "units", "start", "end",
  "on_end", "note"}`: admins; a researcher for their own account `user:NAME`
  where `reservations_by_researchers` allows. One `reservation` ledger row, and
  an audit entry. 400 bad input, 402 the balance cannot pay, 409 capacity
  promised to others (naming what is free), 422 more than exists or a profile
  without reservations.
- `GET api/reservations/{id}`, `DELETE api/reservations/{id}` (cancel: a
  `refund` row by the documented rule; admins, or the researcher who may make
  it).

The body's checks, the write and its audit entry are ReservationBase's
(reservation_input, make_reservation, cancel_reservation), shared with the
admin page admin/reservations (pages/reservations.py), so that both accept,
refuse and record alike.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from tornado import web

from gpulease.core.billing.rules import parse_account
from gpulease.core.capacity.cluster_inventory import kinds_offered
from gpulease.core.capacity.cluster_queue import cluster_usage
from gpulease.core.capacity.reservation_rules import (
    DeviceKind,
    devices_for_units,
    hour_up,
    whole_hours,
)
from gpulease.core.capacity.reserved_pool import HeldBy, units_free_now
from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import Profile, usable_by
from gpulease.core.refusal import Refusal
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.store.assignments import held_by
from gpulease.store.reservations import ON_END, Booked, kind_of, kind_words

FIELDS = ("account", "profile", "units", "start", "end", "on_end", "note")
MAX_NOTE = 500


@dataclass(frozen=True)
class ReservationInput:
    """A reservation body that passed the handlers' checks (ReservationBase.reservation_input)."""

    account: str
    profile: Profile
    units: int
    start: dt.datetime
    end: dt.datetime
    on_end: str
    note: str


def offering_reservations(profiles: Iterable[Profile]) -> list[Profile]:
    """The enabled profiles with a reserved_price_per_hour: those one may reserve."""
    return [p for p in profiles if p.enabled and p.offers_reservations]


def reservation_view(b: Booked, now) -> dict[str, Any]:
    r = b.reservation
    if r.cancelled_at is not None:
        state = "cancelled"
    elif now >= r.end:
        state = "ended"
    elif now >= r.start:
        state = "active"
    else:
        state = "upcoming"
    return {
        "id": r.id, "account": r.account, "profile": r.profile, "units": r.units,
        "devices": kind_words(r.kind), "devices_per_unit": r.per_unit,
        "start": bv.iso(r.start), "end": bv.iso(r.end), "hours": whole_hours(r.start, r.end),
        "rate_per_hour": bv.money(r.rate_per_hour_ucr), "cost": bv.money(b.cost_ucr),
        "on_end": b.on_end, "note": b.note, "state": state,
        "created": bv.iso(b.created_at), "created_by": b.created_by,
        "cancelled": bv.iso(r.cancelled_at), "cancelled_by": b.cancelled_by,
    }


def _reservation_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 12:  # "²" is a digit too
        raise Refusal.of_field("id", f"a reservation id is a whole number, got {text!r}")
    return int(text)


class ReservationBase(BaseAPIHandler):
    def may_reserve_for(self, account: str) -> None:
        """Admins reserve for any account; a researcher for their own, where allowed."""
        if self.is_admin():
            return
        me = self.caller()["name"]
        if not self.settings.get("gpulease_reservations_by_researchers"):
            raise APIError(403, "Only gpulease admins make and cancel reservations on this hub "
                                "(reservations_by_researchers is off)")
        if account != f"user:{me}":
            raise APIError(403, f"You may reserve for your own account user:{me} only, not "
                                f"{account}")

    async def devices_of_kind(self) -> dict[DeviceKind, list[int]]:
        """The devices of each kind per node the shape has in service: the box's (less
        those out of service), or the cluster's spawner nodes' allocatable."""
        source = self.settings.get("gpulease_cluster")
        per_node: dict[DeviceKind, Counter[str]] = {}
        if source is None:
            out = await asyncio.to_thread(self.ctx.assignments.out_of_service)
            for d in self.ctx.inventory.allocatable():
                if d.uuid not in out:
                    per_node.setdefault((d.model, d.mig_profile), Counter())[d.node] += 1
        else:
            listed = await source.listed()
            for node in source.spawner_nodes(listed.inventory).nodes:
                if node.partitions is not None:
                    continue  # DynamicMIG: its kinds share each GPU (carved_refusal)
                for kind, resource in kinds_offered(node):
                    per_node.setdefault(kind, Counter())[node.name] += node.allocatable.get(
                        resource, 0)
        return {kind: list(nodes.values()) for kind, nodes in per_node.items()}

    async def carved_refusal(self, profile: Profile) -> None:
        """422 for a profile whose devices the cluster carves on demand only (DynamicMIG):
        every kind is carved from the same GPUs there, so a count of one kind promises
        nothing of another; only fixed devices (static MIG, full cards) are reserved."""
        source = self.settings.get("gpulease_cluster")
        if source is None or profile.gpu is None:
            return
        kind, _per_unit = kind_of(profile)
        nodes = source.spawner_nodes((await source.listed()).inventory).nodes
        carved = [n.name for n in nodes if n.partitions is not None
                  and kind in dict(kinds_offered(n))]
        fixed = [n for n in nodes if n.partitions is None and kind in dict(kinds_offered(n))]
        if carved and not fixed:
            raise APIError(422, f"profile: {profile.slug}'s {kind_words(kind)} are carved on "
                                f"demand (DynamicMIG, on {', '.join(sorted(carved)[:3])}"
                                f"{'…' if len(carved) > 3 else ''}): reservations are taken "
                                "only for devices of a fixed layout or full cards of nodes "
                                "without DynamicMIG (docs/cluster.md, \"MIG slices carved on "
                                "demand\")")

    async def running_now(self) -> tuple[dict[tuple[DeviceKind, str], int],
                                         list[tuple[DeviceKind, str | None, HeldBy]]]:
        """The devices of each kind per node and what holds them now (who, on which
        tier): the box's assignments, or the cluster's pods on the spawner's nodes."""
        total: Counter[tuple[DeviceKind, str]] = Counter()
        used: list[tuple[DeviceKind, str | None, HeldBy]] = []
        source = self.settings.get("gpulease_cluster")
        if source is None:
            held = held_by(await asyncio.to_thread(self.ctx.assignments.held))
            for d in self.ctx.inventory.allocatable():
                kind = (d.model, d.mig_profile)
                total[(kind, d.node)] += 1
                if d.uuid in held:
                    used.append((kind, d.node, held[d.uuid]))
            return dict(total), used
        return cluster_usage(source.spawner_nodes((await source.listed()).inventory))

    async def booked(self, text: str) -> Booked:
        """The reservation of the URL, if the caller may see it (404 otherwise)."""
        model = self.caller()
        found = await asyncio.to_thread(self.ctx.reservations.get, _reservation_id(text))
        if found is None or not (self.is_auditor()
                                 or found.reservation.account in _own_accounts(model)):
            raise APIError(404, f"No reservation {text} that you may see")
        return found

    async def reservation_input(self, body: Any) -> ReservationInput:
        """The checks of a reservation's body, in order, shared by `POST api/reservations`
        and the admin page's form (which sends the same body): a Refusal naming the field,
        before anything is written. The store checks the rest (period, capacity, balance)
        when it adds."""
        if not isinstance(body, dict):
            raise APIError(400, "The body must be an object: " + ", ".join(FIELDS))
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise Refusal(f"Unknown fields: {', '.join(unknown)}; allowed: {', '.join(FIELDS)}",
                          [(name, "unknown field") for name in unknown])
        account = _account_text(body.get("account"))
        # Who may reserve for it before whether it exists: a researcher learns nothing
        # about other accounts (a 403 for all of them, not a 400 for unknown ones).
        self.may_reserve_for(account)
        await self._known_account(account)
        profile = await self._profile(body.get("profile"))
        groups = set(self.caller().get("groups") or ())
        if not self.is_admin() and not usable_by(profile, groups):
            raise Refusal.of_field("profile", f"profile {profile.slug} is for the groups "
                                              f"{', '.join(profile.groups)} only: you may not "
                                              "reserve what you may not start", status=403)
        units = body.get("units")
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= 10_000:
            raise Refusal.of_field("units", "units is a whole number from 1 to 10000 (no "
                                            f"decimal point), got {json_text(units)}")
        start = _time(body, "start")
        end = _time(body, "end")
        on_end = body.get("on_end", "continue")
        if on_end not in ON_END:
            raise Refusal.of_field("on_end", f"on_end is one of {', '.join(ON_END)} (its servers "
                                             f"at its end: on demand, or suspended), got "
                                             f"{on_end!r}")
        note = body.get("note", "")
        if not isinstance(note, str) or len(note) > MAX_NOTE:
            raise Refusal.of_field("note", f"note is text of at most {MAX_NOTE} characters")
        return ReservationInput(account, profile, units, start, end, on_end, note)

    async def make_reservation(self, asked: ReservationInput) -> dict[str, Any]:
        """Add it (the store's checks, its charge) by the caller, and audit it: its view."""
        await self.carved_refusal(asked.profile)
        counts = await self.devices_of_kind()
        # Sooner than the lead time, running servers are not made to make way for it.
        lead = dt.timedelta(seconds=self.settings.get("gpulease_reservation_lead_s", 86400))
        soon = asked.start < utcnow() + lead
        total, used = await self.running_now() if soon else ({}, [])
        actor = self.caller()["name"]
        booked = await asyncio.to_thread(
            self.ctx.reservations.add, account=asked.account, profile=asked.profile,
            units=asked.units, start=asked.start, end=asked.end, on_end=asked.on_end,
            note=asked.note, actor=actor,
            devices_of_kind=lambda kind, per_unit: devices_for_units(counts.get(kind, ()),
                                                                     per_unit),
            free_now=(lambda kind, per_unit, active: units_free_now(
                total, used, active, kind, per_unit, asked.units)) if soon else None,
            soonest=hour_up(utcnow() + lead))
        view = reservation_view(booked, utcnow())
        await asyncio.to_thread(self.ctx.audit.record, actor, "reservation.add",
                                asked.account, None, view)
        return view

    async def cancel_reservation(self, found: Booked) -> tuple[dict[str, Any], int]:
        """Cancel it by the caller (a refund by the rule), and audit it: its view, the refund."""
        self.may_reserve_for(found.reservation.account)
        actor = self.caller()["name"]
        before = reservation_view(found, utcnow())
        cancelled, refund = await asyncio.to_thread(self.ctx.reservations.cancel, found.id,
                                                    actor)
        view = reservation_view(cancelled, utcnow())
        await asyncio.to_thread(self.ctx.audit.record, actor, "reservation.cancel",
                                found.reservation.account, before,
                                {**view, "refund": bv.money(refund)})
        return view, refund

    async def _known_account(self, account: str) -> None:
        if account.startswith("user:"):
            await self.hub_user(account.split(":", 1)[1], field="account", missing=400)
        elif not await asyncio.to_thread(self.ctx.ledger.account_exists, account):
            raise Refusal.of_field("account", f"unknown account {account}: it has no ledger "
                                              "entries yet (grant credits to create it)")

    async def _profile(self, raw: Any) -> Profile:
        if not isinstance(raw, str) or not raw:
            raise Refusal.of_field("profile", "profile is required: the slug of a profile "
                                              "with a reserved_price_per_hour")
        profile = await asyncio.to_thread(self.ctx.profiles.get, raw)
        offering = await asyncio.to_thread(self._offering)
        if profile is None or not profile.enabled:
            raise Refusal.of_field("profile", f"no enabled profile {raw!r}; profiles offering "
                                              f"reservations: {offering or 'none'}")
        if not profile.offers_reservations:
            raise Refusal.of_field("profile", f"profile {raw} offers no reservations; those "
                                              f"that do: {offering or 'none'}", status=422)
        return profile

    def _offering(self) -> str:
        return ", ".join(p.slug for p in offering_reservations(self.ctx.profiles.list(False)))


def _own_accounts(model: dict) -> set[str]:
    return {f"user:{model['name']}"} | {f"group:{g}" for g in model.get("groups") or []}


class ReservationsHandler(ReservationBase):
    async def get(self):
        model = self.caller()
        past = self.get_argument("past", "false").lower()
        if past not in ("true", "false", "1", "0"):
            raise Refusal.of_field("past", f"past must be true or false, got {past!r}")
        account = self.get_argument("account", None)
        accounts = None if self.is_auditor() else _own_accounts(model)
        if account:
            account = parse_account(account)
            accounts = {account} if accounts is None or account in accounts else set()
        now = utcnow()
        found = await asyncio.to_thread(self.ctx.reservations.listed, accounts,
                                        past=past in ("true", "1"), now=now)
        self.write_json({"reservations": [reservation_view(b, now) for b in found]})

    async def post(self):
        asked = await self.reservation_input(self.json_body())
        self.write_json(await self.make_reservation(asked), 201)


def _account_text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise Refusal.of_field("account", 'account is required: "user:NAME" or "group:NAME"')
    return parse_account(raw)  # a BillingError (400) naming the account field


def _time(body: dict, field: str):
    raw = body.get(field)
    if not isinstance(raw, str) or not raw:
        raise Refusal.of_field(field, f"{field} is required: an ISO 8601 UTC time on a whole "
                                      "hour, like 2026-12-24T09:00:00Z")
    return bv.parse_time(raw, field)


class ReservationHandler(ReservationBase):
    async def get(self, text: str):
        self.write_json(reservation_view(await self.booked(text), utcnow()))

    async def delete(self, text: str):
        view, refund = await self.cancel_reservation(await self.booked(text))
        self.write_json({"reservation": view, "refund": bv.money(refund)})


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"api/reservations", ReservationsHandler),
    (r"api/reservations/([^/]+)", ReservationHandler),
]


def json_text(value: Any) -> str:
    """A value of a JSON body as its sender wrote it (numbers with decimals are Decimal)."""
    return str(value) if isinstance(value, Decimal) else repr(value)
