"""Members' monthly caps on group accounts, read for many members at once (the heartbeat's).

`Ledger.cap_of` and `Ledger.member_spend` answer for one member at a start;
the heartbeat needs the same figures for every running member on a group
account, every interval: a few queries for all of them, none when no running
member has a cap. Spend is counted as `member_spend` counts it: this month's
charges of the member on the account plus what their open sessions there
have accrued up to their last confirmation.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterator

from sqlalchemy import Engine, func, select

from gpulease.core.billing.rules import billed_ms
from gpulease.core.units import ms_cost
from gpulease.store.db import account_caps, ledger_entries, reading, sessions

Pair = tuple[str, str]  # (group account, user)
_CHUNK = 900  # under SQLite's old limit of 999 bound parameters


def _chunks(items: list[str]) -> Iterator[list[str]]:
    return (items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK))


def capped_spends(engine: Engine, pairs: Collection[Pair],
                  month_start: dt.datetime) -> dict[Pair, tuple[int, int]]:
    """(cap, spent) in µcr of each (group account, user) pair of `pairs` that has a cap."""
    wanted = {(a, u) for a, u in pairs if a.startswith("group:")}
    if not wanted:
        return {}
    c, e, s = account_caps.c, ledger_entries.c, sessions.c
    caps: dict[Pair, int] = {}
    spent: dict[Pair, int] = {}
    with reading(engine) as conn:
        for chunk in _chunks(sorted({a for a, _ in wanted})):
            for row in conn.execute(select(c.account, c.user_name, c.monthly_ucr)
                                    .where(c.account.in_(chunk))):
                if (row.account, row.user_name) in wanted:
                    caps[(row.account, row.user_name)] = int(row.monthly_ucr)
        for chunk in _chunks(sorted({a for a, _ in caps})):
            charged = conn.execute(
                select(e.account, e.user_name, func.sum(e.amount_ucr))
                .where(e.account.in_(chunk), e.kind == "charge", e.created_at >= month_start)
                .group_by(e.account, e.user_name))
            for account, user, total in charged:
                if (account, user) in caps:
                    spent[(account, user)] = spent.get((account, user), 0) - int(total or 0)
            running = conn.execute(
                select(s.account, s.user_name, s.started_at, s.last_confirmed_at,
                       s.rate_per_hour_ucr).where(s.ended_at.is_(None), s.account.in_(chunk)))
            for row in running:
                key = (row.account, row.user_name)
                if key in caps:
                    accrued = ms_cost(billed_ms(row.started_at, row.last_confirmed_at),
                                      int(row.rate_per_hour_ucr))
                    spent[key] = spent.get(key, 0) + accrued
    return {key: (cap, spent.get(key, 0)) for key, cap in caps.items()}
