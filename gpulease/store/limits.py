"""The `limits` table: per-user and per-group limits, read and set (with their audit).

The rules (what a limit is, how a start is checked against them) are
gpulease/core/policy/limits.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlalchemy import Engine, delete, insert, select, update

from gpulease.core.policy.limits import FIELDS, Limit, parse_subject
from gpulease.store.db import limits, reading
from gpulease.store.ledger import advisory_lock

if TYPE_CHECKING:
    from gpulease.store.audit import AuditLog


class LimitStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    @staticmethod
    def _limit(row) -> Limit:
        return Limit(row.subject, row.max_gpus, row.max_slices)

    def all(self) -> dict[str, Limit]:
        with reading(self.engine) as conn:
            rows = conn.execute(select(limits).order_by(limits.c.subject))
            return {row.subject: self._limit(row) for row in rows}

    def get(self, subject: str) -> Limit | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(limits).where(limits.c.subject == subject)).first()
        return self._limit(row) if row else None

    def set(self, subject: str, values: Mapping[str, int | None], *,
            actor: str | None = None, audit: AuditLog | None = None) -> tuple[Limit | None, Limit]:
        """Change the fields in `values`; (before, after). Both null: the row goes.

        With `audit`, the change is recorded as `limits.set` by `actor` in the
        same transaction.
        """
        parse_subject(subject)
        with self.engine.begin() as conn:
            advisory_lock(conn, f"limits:{subject}")
            row = conn.execute(select(limits).where(limits.c.subject == subject)).first()
            before = self._limit(row) if row else None
            base = before.as_dict() if before else {"max_gpus": None, "max_slices": None}
            after = Limit(subject, **{**base, **{k: values[k] for k in FIELDS if k in values}})
            if after.empty:
                conn.execute(delete(limits).where(limits.c.subject == subject))
            elif row is None:
                conn.execute(insert(limits).values(subject=subject, **after.as_dict()))
            else:
                conn.execute(update(limits).where(limits.c.subject == subject)
                             .values(**after.as_dict()))
            if audit is not None:
                audit.record(actor or "", "limits.set", subject,
                             before.as_dict() if before else None,
                             None if after.empty else after.as_dict(), conn=conn)
        return before, after
