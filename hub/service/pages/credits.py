"""Admin pages: credit balances with grant/adjust forms; member caps and GPU limits.

The forms run the API's own checks and writes (BillingHandler.entry_input,
write_entry, write_cap; gpulease/core/policy/limits.py's parsers), so the page and
`POST api/credits|adjustments`, `PUT api/accounts/.../caps/...` and
`PUT api/limits/...` accept the same input and audit the same way.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from sqlalchemy import Engine, select
from tornado import web

from gpulease.core.policy.limits import FIELDS as LIMIT_FIELDS
from gpulease.core.policy.limits import LimitError, parse_limit_body, parse_subject
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service.api.billing import parse_monthly_cap
from gpulease.hub.service.api.profiles import ProfileHandler
from gpulease.hub.service.errors import APIError
from gpulease.hub.service.pages.admin_base import AdminPage
from gpulease.store.db import account_caps, ledger_entries, reading
from gpulease.store.identities import IdentityStore
from gpulease.store.limits import LimitStore

ENTRY_KINDS = {"grant": "Grant", "adjustment": "Adjustment"}
ENTRY_FORMS = (
    ("grant", "Grant credits",
     "a positive amount; a group account is created by its first grant"),
    ("adjustment", "Adjust a balance",
     "a signed amount (-5 takes 5 credits away); a note saying why is required"),
)


def ledger_accounts(engine: Engine) -> list[str]:
    """Every account with a ledger row (users the hub forgot included)."""
    with reading(engine) as conn:
        return list(conn.execute(select(ledger_entries.c.account).distinct()).scalars())


def all_caps(engine: Engine) -> list[dict[str, Any]]:
    query = select(account_caps).order_by(account_caps.c.account, account_caps.c.user_name)
    with reading(engine) as conn:
        return [{"account": r.account, "user": r.user_name, "monthly": bv.money(r.monthly_ucr)}
                for r in conn.execute(query)]


class CreditsPage(AdminPage):
    @web.authenticated
    async def get(self):
        self.viewer()
        await self.show()

    async def show(self, kind: str = "", values: dict[str, str] | None = None,
                   errors: dict[str, list[str]] | None = None, status: int = 200) -> None:
        users = await ProfileHandler._all_users(self)  # only needs self.hub_api
        names = [f"user:{u['name']}" for u in users if u.get("kind", "user") == "user"]
        accounts = sorted(set(names) | set(await self.run(ledger_accounts, self.ctx.engine)),
                          key=lambda a: (not a.startswith("user:"), a))
        balances = await self.run(self.ledger.balances, accounts)
        # who a provider's user signed in as (issuer and e-mail), beside the name they got
        shown = await self.run(IdentityStore(self.ctx.engine).shown_by_user)
        message = ""
        entry_id = self.get_argument("entry", "")
        if entry_id.isdigit() and not errors:
            entry = await self.run(_entry_or_none, self.ctx.engine, int(entry_id))
            if entry is not None:
                message = (f"{ENTRY_KINDS.get(entry['kind'], entry['kind'])} of "
                           f"{bv.money(entry['amount_ucr'])} credits to {entry['account']} "
                           f"recorded; its balance is now "
                           f"{bv.money(balances.get(entry['account'], 0))}.")
        self.set_status(status)
        self.render("admin_credits.html",
                    rows=[{"account": a, "balance": bv.money(balances.get(a, 0)),
                           "identity": shown.get(a.removeprefix("user:"), "")
                           if a.startswith("user:") else ""}
                          for a in accounts],
                    message=message, kind=kind, values=values or {}, errors=errors or {},
                    entry_forms=ENTRY_FORMS)

    async def post(self):
        self.editor()
        await self.dispatch_form("kind", {kind: partial(self._entry, kind)
                                          for kind in ENTRY_KINDS})

    async def _entry(self, kind: str) -> None:
        values = {n: self.get_body_argument(n, "") for n in ("account", "amount", "note")}

        async def save() -> str:
            account, amount, note = await self.entry_input(
                kind, values["account"].strip(), values["amount"].strip(), values["note"])
            return f"admin/credits?entry={await self.write_entry(kind, account, amount, note)}"

        await self.submit(kind, values, save, status=400)


def _entry_or_none(engine: Engine, entry_id: int) -> dict[str, Any] | None:
    with reading(engine) as conn:
        row = conn.execute(select(ledger_entries).where(ledger_entries.c.id == entry_id)).first()
    return dict(row._mapping) if row is not None else None


class LimitsPage(AdminPage):
    """Monthly caps of group-account members, and concurrent GPU/slice limits."""

    @property
    def limits(self) -> LimitStore:
        return self.ctx.limits

    @web.authenticated
    async def get(self):
        self.viewer()
        await self.show()

    async def show(self, form: str = "", values: dict[str, str] | None = None,
                   errors: dict[str, list[str]] | None = None, status: int = 200) -> None:
        caps = await self.run(all_caps, self.ctx.engine)
        groups = await self.run(self.ledger.group_accounts)
        limits = await asyncio.to_thread(self.limits.all)
        done = self.get_argument("done", "")
        message = {"cap": "Cap saved.", "limit": "Limit saved."}.get(done, "") if not errors else ""
        self.set_status(status)
        self.render("admin_limits.html", caps=caps, group_accounts=groups,
                    limits=[{"subject": s, **{k: "" if v is None else v
                                              for k, v in lim.as_dict().items()}}
                            for s, lim in sorted(limits.items())],
                    message=message, form=form, values=values or {}, errors=errors or {})

    async def post(self):
        self.editor()
        await self.dispatch_form("form", {"cap": self._set_cap, "limit": self._set_limit})

    async def _set_cap(self) -> None:
        values = {n: self.get_body_argument(n, "").strip() for n in ("account", "user", "monthly")}

        async def save() -> str:
            account = values["account"]
            if not account.startswith("group:") or not await self.run(
                    self.ledger.account_exists, account):
                raise APIError(400, f"unknown group account {account!r}: grant credits to "
                                    "create it", [{"field": "account", "message":
                                                   f"unknown group account {account!r}"}])
            if not values["user"]:
                raise APIError(400, "user is required",
                               [{"field": "user", "message": "user is required"}])
            monthly = parse_monthly_cap(values["monthly"] or None)
            await self.hub_user(values["user"], missing=400)
            await self.write_cap(account, values["user"], monthly)
            return "admin/limits?done=cap"

        await self.submit("cap", values, save, status=400)

    async def _set_limit(self) -> None:
        values = {n: self.get_body_argument(n, "").strip() for n in ("subject", *LIMIT_FIELDS)}
        body: dict[str, Any] = {}
        errors: dict[str, list[str]] = {}
        for name in LIMIT_FIELDS:  # a form sends text: "" removes the limit
            text = values[name]
            body[name] = None if text == "" else int(text) if text.isdigit() else text
        subject, parsed = values["subject"], {}
        for check in (lambda: parse_subject(subject), lambda: parse_limit_body(body)):
            try:  # both checked, so every problem shows at once
                result = check()
            except LimitError as e:
                for error in e.errors:
                    errors.setdefault(error.field, []).append(error.message)
            else:
                parsed = result if isinstance(result, dict) else parsed
        if not errors:
            await self.write_limit(subject, parsed)
            self.see_other("admin/limits?done=limit")
            return
        await self.show("limit", values, errors, 400)

    async def write_limit(self, subject: str, values: dict[str, int | None]) -> None:
        """As PUT api/limits/{subject}: the store records limits.set in its transaction."""
        await asyncio.to_thread(self.limits.set, subject, values,
                                actor=self.caller()["name"], audit=self.ctx.audit)


ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    (r"admin/credits", CreditsPage),
    (r"admin/limits", LimitsPage),
]
