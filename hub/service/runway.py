"""What a running server costs and how long its money lasts, for the researcher's status bar
(`GET api/me/gpu`, hub/service/api/gpu.py). Blocking: handlers run it in a thread.

How long is `gpulease.core.billing.rules.runway_s` over the figures the credit
enforcer stops a server by: the balance of the account the session bills, run down
by EVERY session open on that account (a lab's other researchers' too), and on a
group account the member's monthly cap, run down by their own sessions there.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from gpulease.core.billing.rules import month_start, runway
from gpulease.core.clock import utcnow
from gpulease.hub.service import billing_views as bv
from gpulease.store.db import reading, sessions
from gpulease.store.sessions import SessionLedger

_c = sessions.c


def _rates(engine: Any, account: str, user: str) -> tuple[int, int]:
    """(the summed rate of the sessions open on `account`, of `user`'s among them)."""
    query = (select(_c.user_name, func.sum(_c.rate_per_hour_ucr))
             .where(_c.ended_at.is_(None), _c.account == account)
             .group_by(_c.user_name))
    with reading(engine) as conn:
        rows = conn.execute(query).all()
    total = sum(int(rate or 0) for _, rate in rows)
    own = sum(int(rate or 0) for name, rate in rows if name == user)
    return total, own


def cost_view(ctx: Any, user: str, server: str) -> tuple[dict[str, Any], int | None]:
    """(the view, the open session's id or None). The open session's profile, rate and
    cost so far, its account's balance and its runway. Without an open session: the
    personal balance only. Cost and balance both count to the session's last confirmed
    heartbeat, as the ledger's balance does, so the two agree."""
    session = SessionLedger(ctx.engine).open_for(user, server)
    if session is None:
        return {"profile": None, "rate_per_hour": None, "cost_so_far": None,
                "balance": bv.money(ctx.ledger.balance(f"user:{user}")), "runway_s": None,
                "runway_by": None, "account": f"user:{user}", "as_of": None}, None
    balance = ctx.ledger.balance(session.account)
    account_rate, own_rate = _rates(ctx.engine, session.account, user)
    cap = ctx.ledger.cap_of(session.account, user) \
        if session.account.startswith("group:") else None
    cap_left = None if cap is None else cap - ctx.ledger.member_spend(
        session.account, user, month_start(utcnow()))
    # A free session (rate 0: a free profile, a reserved unit) is never stopped for money.
    seconds, by = (None, None) if session.rate_per_hour_ucr == 0 else runway(
        balance, account_rate, cap_left, own_rate)
    return {"profile": session.profile, "rate_per_hour": bv.money(session.rate_per_hour_ucr),
            "cost_so_far": bv.money(session.cost()), "balance": bv.money(balance),
            # and what runs out first: the account's balance or the member's monthly cap
            "runway_s": seconds, "runway_by": by,
            "account": session.account, "as_of": bv.iso(session.last_confirmed)}, session.id
