"""The audit log: every admin change, who made it, when, before and after.

Append-only like the ledger: rows are only ever inserted, except that rows
older than the retention (`GPULeaseHub.audit_retention`, default 180 days)
are pruned. `before` is None for a creation and `after` None for a deletion;
both are JSON-able dicts (amounts as decimal strings of credits).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select

from gpulease.core.clock import iso_z, utcnow
from gpulease.core.units import DURATION_HINT, parse_duration
from gpulease.store.db import audit_log, reading

DEFAULT_RETENTION = dt.timedelta(days=180)
RETENTION_HINT = f'a number of days like "180d", or {DURATION_HINT}; "0" keeps every entry'
_DAYS = re.compile(r"(\d+)d")


class RetentionError(ValueError):
    """`audit_retention` is not a duration: `gpulease up` stops and says so."""


def parse_retention(text: str) -> dt.timedelta | None:
    """`GPULeaseHub.audit_retention`: "180d", "2h", "0" (None: keep forever)."""
    value = text.strip() if isinstance(text, str) else text
    days = _DAYS.fullmatch(value) if isinstance(value, str) else None
    try:
        seconds = int(days.group(1)) * 86_400 if days else parse_duration(value)
    except ValueError:
        raise RetentionError(f"audit_retention: {text!r} is not a retention; "
                         f"{RETENTION_HINT}") from None
    return dt.timedelta(seconds=seconds) if seconds else None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: dt.datetime
    actor: str
    action: str  # e.g. "profile.update", "credits.grant", "limits.set"
    target: str  # e.g. "profile:h200-1g", "user:alice", "group:vision"
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def _dump(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def _load(text: str | None) -> dict[str, Any] | None:
    return None if text is None else json.loads(text)


class AuditLog:
    def __init__(self, engine: Engine):
        self.engine = engine

    def record(
        self,
        actor: str,
        action: str,
        target: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        *,
        conn=None,
        at: dt.datetime | None = None,
    ) -> None:
        """Append one entry; pass `conn` to write it in the change's own transaction."""
        row = dict(at=at or utcnow(), actor=actor, action=action, target=target,
                   before=_dump(before), after=_dump(after))
        if conn is not None:
            conn.execute(insert(audit_log).values(**row))
            return
        with self.engine.begin() as c:
            c.execute(insert(audit_log).values(**row))

    def entries(
        self,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        actor: str | None = None,
        target: str | None = None,
        action: str | None = None,
        limit: int = 200,
        offset: int = 0,
    ) -> tuple[list[AuditEntry], int]:
        """Newest first, with the total count matching the filters."""
        query = select(audit_log)
        if since is not None:
            query = query.where(audit_log.c.at >= since)
        if until is not None:
            query = query.where(audit_log.c.at < until)
        if actor:
            query = query.where(audit_log.c.actor == actor)
        if target:
            query = query.where(audit_log.c.target == target)
        if action:
            query = query.where(audit_log.c.action == action)
        count = select(func.count()).select_from(query.subquery())
        newest_first = query.order_by(audit_log.c.at.desc(), audit_log.c.id.desc())
        page = newest_first.limit(limit).offset(offset)
        with reading(self.engine) as conn:
            total = conn.execute(count).scalar_one()
            rows = conn.execute(page).all()
        return [
            AuditEntry(r.id, r.at, r.actor, r.action, r.target, _load(r.before), _load(r.after))
            for r in rows
        ], total

    def prune(self, retention: dt.timedelta, now: dt.datetime | None = None) -> int:
        """Delete entries older than `retention`; returns how many went."""
        cutoff = (now or utcnow()) - retention
        with self.engine.begin() as conn:
            return conn.execute(delete(audit_log).where(audit_log.c.at < cutoff)).rowcount


def entry_view(entry: AuditEntry) -> dict[str, Any]:
    """One entry as `GET api/audit` writes it (time in ISO 8601 UTC with Z)."""
    return {"id": entry.id, "at": iso_z(entry.at), "actor": entry.actor,
            "action": entry.action, "target": entry.target,
            "before": entry.before, "after": entry.after}
