"""Billing API of the gpulease service: balance, usage, credits, adjustments, caps, stop."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from sqlalchemy import Engine, select
from tornado.escape import url_escape

from gpulease.core.billing.rules import (
    LOW_BALANCE_MINUTES,
    BillingError,
    minutes_left,
    parse_account,
)
from gpulease.core.billing.sessions import END_REASONS
from gpulease.core.clock import utcnow
from gpulease.core.model.profiles import usable_by
from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown
from gpulease.core.units import parse_credits
from gpulease.hub.servers.notifier import tell
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service import right_sizing_views as rs
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.hub.service.errors import APIError
from gpulease.store import billing_reports
from gpulease.store.db import ledger_entries, reading
from gpulease.store.ledger import Ledger
from gpulease.store.notices import NoticeStore
from gpulease.store.sessions import SessionLedger

log = logging.getLogger("gpulease.service")


def parse_entry_account(text: Any, field: str = "account") -> str:
    """The account of a grant or adjustment ("user:NAME" or "group:NAME"), canonical."""
    if not isinstance(text, str) or not text:
        raise Refusal.of_field(field, 'account must be "user:NAME" or "group:NAME"')
    try:
        return parse_account(text)
    except BillingError as e:
        raise Refusal.of_field(field, e.message) from None


def parse_entry_amount(raw: Any, kind: str) -> int:
    """µcr of a grant (positive) or an adjustment (signed, non-zero) from credits text."""
    if raw is None or raw == "":
        raise Refusal.of_field("amount", "amount is required (credits, e.g. \"12.5\")")
    try:
        amount = parse_credits(raw)
    except ValueError as e:
        raise Refusal.of_field("amount", str(e)) from None
    if amount == 0:
        raise Refusal.of_field("amount", "amount must not be zero")
    if amount < 0 and kind == "grant":
        raise Refusal.of_field("amount", "a grant must be positive; take credits away with "
                                     "an adjustment (api/adjustments, with a note)")
    return amount


def parse_entry_note(note: Any, kind: str) -> str:
    if not isinstance(note, str):
        raise Refusal.of_field("note", "note must be a string")
    if kind == "adjustment" and not note.strip():
        raise Refusal.of_field("note", "an adjustment needs a note saying why")
    return note


def parse_monthly_cap(raw: Any) -> int | None:
    """A member's monthly cap in µcr from credits; None removes the cap."""
    if raw is None:
        return None
    try:
        monthly = parse_credits(raw)
    except ValueError as e:
        raise Refusal.of_field("monthly", str(e)) from None
    if monthly < 0:
        raise Refusal.of_field("monthly", "a monthly cap must not be negative")
    return monthly


class BillingHandler(BaseAPIHandler):
    """Shared helpers: the ledger, the hub's user model, period parameters."""

    @property
    def ledger(self) -> Ledger:
        return self.ctx.ledger

    def period(self) -> tuple[dt.datetime, dt.datetime]:
        """A usage query's since and until: the current UTC month by default, at most
        bv.MAX_USAGE_DAYS long (400 naming what is allowed)."""
        return bv.usage_period(self.get_argument("since", None),
                               self.get_argument("until", None), utcnow())

    async def entry_input(self, kind: str, account: Any, amount: Any, note: Any,
                          field: str = "account") -> tuple[str, int, str]:
        """The checks of a grant or adjustment, shared by the API and the credits page."""
        account = parse_entry_account(account, field)
        if account.startswith("user:"):
            await self.hub_user(account.split(":", 1)[1], field=field, missing=400)
        amount = parse_entry_amount(amount, kind)
        note = parse_entry_note(note, kind)
        if kind == "adjustment" and not await self.run(self.ledger.account_exists, account):
            raise Refusal.of_field("account", f"unknown account {account}: it has no ledger "
                                          "entries yet (grant credits to create it)")
        return account, amount, note

    async def write_entry(self, kind: str, account: str, amount: int, note: str) -> int:
        """Append a grant or adjustment by the caller, and audit it; returns the entry id."""
        actor = self.caller()["name"]
        write = self.ledger.grant if kind == "grant" else self.ledger.adjust
        before = await self.run(self.ledger.balance, account)
        entry_id = await self.run(write, account, amount, note=note, actor=actor)
        after = await self.run(self.ledger.balance, account)
        # The ledger writes in its own transaction: the record follows right after.
        action = "credits.grant" if kind == "grant" else "credits.adjust"
        await self.run(self.ctx.audit.record, actor, action, account,
                       {"balance": bv.money(before)},
                       {"balance": bv.money(after), "amount": bv.money(amount), "note": note,
                        "entry_id": entry_id})
        return entry_id

    async def write_cap(self, account: str, user: str, monthly: int | None) -> None:
        """Set (None: remove) a member's monthly cap on a group account, and audit it."""
        before = await self.run(self.ledger.cap_of, account, user)
        await self.run(self.ledger.set_cap, account, user, monthly)
        await self.run(self.ctx.audit.record, self.caller()["name"], "cap.set", account,
                       _cap_view(account, user, before), _cap_view(account, user, monthly))

    async def advice(self, user: str, me: dict[str, Any],
                     groups: list[str] | None = None) -> list[rs.ProfileAdvice]:
        """Right-sizing advice over `user`'s last 30 days (whatever the period asked), and
        its notice when the researcher asks about themselves (an auditor's look tells them
        nothing). Their groups (`groups`, else the caller's own or the hub's model) decide
        which profiles may be suggested."""
        own = user == me["name"] and me.get("kind", "user") == "user"
        if groups is None:
            try:
                model = me if own else await self.hub_user(user)
            except Refusal:
                # a user the hub no longer knows (or a hub away): their usage is in the
                # database and is answered as it always was; advice needs their groups
                return []
            groups = model.get("groups") or []
        now = utcnow()
        # disabled ones too: sessions on them are judged, though never pointed to
        profiles = await self.run(self.ctx.profiles.list, True)
        advice = await self.run(rs.advice_of, self.ctx.engine, profiles, user, groups, now)
        if own and advice:
            store = NoticeStore(self.ctx.engine)
            try:
                opened = await self.run(rs.raise_notices, store, user, advice, now)
            except Exception:  # telling is a courtesy: the usage asked for is answered
                log.exception("could not raise the right-sizing notices of %s", user)
                opened = []
            for notice in opened:
                tell(store, self.settings.get("gpulease_notify_backends") or {}, notice)
        return advice

    async def run(self, fn, *args, **kwargs) -> Any:
        """Call a ledger function in a thread (its BillingErrors are refusals as they are)."""
        return await asyncio.to_thread(fn, *args, **kwargs)


class BalanceHandler(BillingHandler):
    async def get(self):
        me = self.caller()
        name = self.get_argument("user", None) or _own_name(me)
        if name != me["name"] and not self.is_auditor():
            raise APIError(403, "Only gpulease admins and auditors may see another user's "
                                "balance")
        model = await self.hub_user(name)
        self.write_json(await self.run(balance_of, self.ctx, name, model.get("groups") or []))


def balance_of(ctx, name: str, groups: list[str]) -> dict[str, Any]:
    """`api/balance` for user `name` in hub groups `groups` (blocking: run in a thread)."""
    ledger = ctx.ledger
    personal = f"user:{name}"
    accounts = [personal] + [f"group:{g}" for g in sorted(groups)
                             if ledger.account_exists(f"group:{g}")]
    balances = ledger.balances(accounts)
    own = int(balances.get(personal, 0))
    minutes = {
        p.slug: minutes_left(own, p.price_per_hour_ucr)
        for p in ctx.profiles.list(False)
        if p.enabled and usable_by(p, set(groups)) and p.price_per_hour_ucr > 0
    }
    return bv.balance_view(name, own, {a: int(balances.get(a, 0)) for a in accounts},
                           minutes, LOW_BALANCE_MINUTES)


def _own_name(model: dict[str, Any]) -> str:
    if model.get("kind", "user") != "user":
        raise Refusal.of_field("user", f"{model.get('name')} is a service, with no balance of "
                                   "its own: pass ?user=NAME")
    return model["name"]


class UsageHandler(BillingHandler):
    async def get(self):
        me = self.caller()
        user = self.get_argument("user", None)
        account = self.get_argument("account", None)
        fmt = self.get_argument("format", "json")
        if fmt not in ("json", "csv"):
            raise Refusal.of_field("format", f"format must be json or csv, got {fmt!r}")
        if not self.is_auditor():
            if user not in (None, me["name"]):
                raise APIError(403, "Only gpulease admins and auditors may see another "
                                    "user's usage")
            user = me["name"]  # a member sees only their own sessions, on any account
        elif user is None and account is None and me.get("kind", "user") == "user":
            user = me["name"]  # people see their own by default; services (the CLI) all
        if account is not None:
            account = parse_account(account)  # a BillingError naming the account field
        since, until = self.period()
        report = await self.run(billing_reports.usage, self.ctx.engine, user=user,
                                account=account, since=since, until=until)
        view = bv.usage_view(report.sessions, report.totals)
        if fmt == "csv":
            who = user or (account or "all").replace(":", "-")
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition",
                            f'attachment; filename="gpulease-usage-{bv.safe_filename(who)}.csv"')
            self.finish(billing_reports.to_csv(bv.csv_rows(view["sessions"]), bv.USAGE_COLUMNS))
            return
        advice = await self.advice(user, me) if user is not None and account is None else []
        self.write_json({**view, "advice": rs.advice_view(advice)})


class _EntryHandler(BillingHandler):
    """POST api/credits and api/adjustments share the body and its checks."""

    kind = "grant"

    async def post(self):
        self.require_admin()
        body = self.json_body()
        if not isinstance(body, dict):
            raise APIError(400, 'The body must be {"account": ..., "amount": ..., "note": ...}')
        unknown = set(body) - {"account", "user", "amount", "note"}
        if unknown:
            raise APIError(400, f"Unknown fields: {', '.join(sorted(unknown))}; "
                                "allowed: account (or user), amount, note")
        if "account" in body and "user" in body:
            raise Refusal.of_field("account", "give either account or user, not both")
        field = "user" if "user" in body else "account"
        raw = body.get(field)
        text = f"user:{raw}" if field == "user" and isinstance(raw, str) and raw else raw
        account, amount, note = await self.entry_input(
            self.kind, text, body.get("amount"), body.get("note", ""), field=field)
        entry_id = await self.write_entry(self.kind, account, amount, note)
        balance = await self.run(self.ledger.balance, account)
        entry = await self.run(_entry, self.ctx.engine, entry_id)
        self.write_json(bv.entry_view(entry, balance), 201)


def _entry(engine: Engine, entry_id: int) -> dict[str, Any]:
    """One ledger row as written, with its time (read back: the ledger stamps it)."""
    with reading(engine) as conn:
        row = conn.execute(select(ledger_entries).where(ledger_entries.c.id == entry_id)).one()
    return {**row._mapping, "created": row.created_at}


class CreditsHandler(_EntryHandler):
    kind = "grant"


class AdjustmentsHandler(_EntryHandler):
    kind = "adjustment"


class CapHandler(BillingHandler):
    async def get(self, group: str, user: str):
        self.require_auditor()
        account = await self._group_account(group)
        cap = await self.run(self.ledger.cap_of, account, user)
        self.write_json(_cap_view(account, user, cap))

    async def put(self, group: str, user: str):
        self.require_admin()
        account = await self._group_account(group)
        body = self.json_body()
        if not isinstance(body, dict) or set(body) != {"monthly"}:
            raise APIError(400, 'The body must be {"monthly": CREDITS} (null removes the cap)')
        monthly = parse_monthly_cap(body["monthly"])
        await self.hub_user(user)
        await self.write_cap(account, user, monthly)
        self.write_json(_cap_view(account, user, monthly))

    async def _group_account(self, group: str) -> str:
        account = f"group:{group}"
        if not await self.run(self.ledger.account_exists, account):
            raise APIError(404, f"unknown account {account}: grant credits to create it")
        return account


def _cap_view(account: str, user: str, monthly: int | None) -> dict[str, Any]:
    return {"account": account, "user": user,
            "monthly": None if monthly is None else bv.money(monthly)}


class StopHandler(BillingHandler):
    async def post(self):
        me = self.caller()
        body = self.json_body()
        if not isinstance(body, dict) or set(body) - {"user", "server", "reason"}:
            raise APIError(400, 'The body must be {"user": NAME, "server": NAME, "reason": ...}')
        user, server, reason = body.get("user"), body.get("server", ""), body.get("reason")
        if not isinstance(user, str) or not user:
            raise Refusal.of_field("user", "user is required")
        if not isinstance(server, str):
            raise Refusal.of_field("server", 'server must be a name ("" for the default server)')
        allowed = ", ".join(END_REASONS)
        if reason not in END_REASONS:
            raise Refusal.of_field("reason", f"unknown reason {shown(reason)}; allowed: {allowed}")
        if not self.is_admin() and (user != me["name"] or reason != "user"):
            raise APIError(403, 'Users may stop only their own servers, with reason "user"; '
                                "other stops need a gpulease admin")
        model = await self.hub_user(user)
        spawner = (model.get("servers") or {}).get(server)
        label = f"{user}/{server or '(default)'}"
        if spawner is None:
            raise APIError(404, f"no server {label}")
        if not spawner.get("ready") or spawner.get("stopped") or spawner.get("pending"):
            state = spawner.get("pending") or "stopped"
            raise APIError(409, f"server {label} is not running ({state})")
        sessions = SessionLedger(self.ctx.engine)
        await self.run(sessions.request_end_reason, user, server, reason)
        path = f"/users/{url_escape(user, plus=False)}/" + (
            f"servers/{url_escape(server, plus=False)}" if server else "server")
        def refused(message: str) -> Refusal:
            return Refusal(f"The hub refused to stop {label}: {message}", status=409)

        await self.hub_call("DELETE", path, doing=f"stop {label}",
                            answers={400: refused, 409: refused})
        self.write_json({"user": user, "server": server, "reason": reason}, 202)
