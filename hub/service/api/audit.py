"""Audit log API (api/audit): admin changes, newest first, for admins and auditors."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

from tornado import web

from gpulease.core.refusal import Refusal
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service.base import BaseAPIHandler
from gpulease.store.audit import entry_view

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_OFFSET = 2**62  # beyond a database's integer, not an error of the database's own


@dataclass(frozen=True)
class AuditQuery:
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    actor: str | None = None
    target: str | None = None
    action: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0


def _field_error(field: str, message: str) -> Refusal:
    # a query argument's refusal names it in the message too: "limit: must be ..."
    return Refusal(f"{field}: {message}", [(field, message)])


def _whole(text: str | None, field: str, default: int, low: int, high: int) -> int:
    if text is None or text == "":
        return default
    allowed = f"a whole number from {low} to {high}"
    try:
        value = int(text)
    except ValueError:
        raise _field_error(field, f"must be {allowed}, got {text!r}") from None
    if not low <= value <= high:
        raise _field_error(field, f"must be {allowed}, got {value}")
    return value


def parse_audit_query(args: dict[str, str | None]) -> AuditQuery:
    """The filters of `GET api/audit` from its query arguments; 400 naming a bad one."""
    try:
        since, until = bv.parse_period(args.get("since"), args.get("until"))
    except bv.PeriodError as e:
        raise _field_error(e.field, e.message) from None
    return AuditQuery(
        since=since, until=until,
        actor=args.get("actor") or None, target=args.get("target") or None,
        action=args.get("action") or None,
        limit=_whole(args.get("limit"), "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        offset=_whole(args.get("offset"), "offset", 0, 0, MAX_OFFSET),
    )


class AuditHandler(BaseAPIHandler):
    async def get(self):
        self.require_auditor()
        names = ("since", "until", "actor", "target", "action", "limit", "offset")
        query = parse_audit_query({n: self.get_argument(n, None) for n in names})
        entries, total = await asyncio.to_thread(
            self.ctx.audit.entries, since=query.since, until=query.until, actor=query.actor,
            target=query.target, action=query.action, limit=query.limit, offset=query.offset,
        )
        self.write_json({"entries": [entry_view(e) for e in entries], "total": total})


# (path relative to the service prefix, handler class); app.make_app mounts them.
ROUTES: list[tuple[str, type[web.RequestHandler]]] = [
    ("api/audit", AuditHandler),
]
