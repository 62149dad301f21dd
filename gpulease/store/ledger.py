"""The credit ledger: accounts, append-only entries, balances, group caps.

A balance is a sum of rows (grants +, charges -, adjustments ±) minus what the
account's open sessions have accrued up to their last confirmed heartbeat:
what is confirmed is owed, and nothing beyond it is invented. Amounts are
integer micro-credits (µcr) from end to end.

The arithmetic (billed milliseconds, minutes left, what an account is) is
gpulease/core/billing/rules.py; this module is the store.

Which hub users exist is the caller's knowledge, not the ledger's: it checks
the syntax of `user:NAME` accounts only. A group account exists once it has a
row: a group account exists once credits are granted to it (docs/admin.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, literal, select, text

from gpulease.core.billing.holds import Held, OpenRun, credit_refusal
from gpulease.core.billing.rules import MIN_UCR, BillingError, billed_ms, month_start, parse_account
from gpulease.core.clock import utcnow
from gpulease.core.shown import shown
from gpulease.core.units import MAX_UCR, format_credits, ms_cost
from gpulease.store.db import account_caps, ledger_entries, reading, sessions

# SQLite (before 3.32) allowed 999 bound parameters per statement; stay under it.
_IN_CHUNK = 900


def advisory_lock(conn: Connection, name: str) -> None:
    """Serialise check-then-write transactions that name the same thing.

    SQLite already holds its write lock (make_engine issues BEGIN IMMEDIATE);
    PostgreSQL takes a transaction-level advisory lock keyed by a stable hash.
    """
    if conn.dialect.name == "postgresql":
        digest = hashlib.blake2b(f"gpulease:{name}".encode(), digest_size=8).digest()
        key = int.from_bytes(digest, "big", signed=True)
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def _accrued(rows: Iterable[Any]) -> int:
    return sum(ms_cost(billed_ms(r.started_at, r.last_confirmed_at), r.rate_per_hour_ucr)
               for r in rows)


def _check_amount(amount_ucr: object) -> int:
    if isinstance(amount_ucr, bool) or not isinstance(amount_ucr, int):
        raise BillingError(400, f"amount: {shown(amount_ucr)} is not an integer of "
                                "micro-credits", "amount")
    if not MIN_UCR <= amount_ucr <= MAX_UCR:
        raise BillingError(400, f"amount: {amount_ucr} µcr overflows 64 bits (at most "
                                f"{format_credits(MAX_UCR)} credits)", "amount")
    return amount_ucr


_ENTRY_COLUMNS = ("id", "account", "kind", "amount_ucr", "note", "actor", "user_name",
                  "session_id", "created_at", "reservation_id")


class Ledger:
    def __init__(self, engine: Engine):
        self.engine = engine

    # --- writing ------------------------------------------------------------------
    def grant(self, account: str, amount_ucr: int, *, note: str, actor: str,
              now: dt.datetime | None = None) -> int:
        """Add credits; returns the entry id. Creates a group account."""
        amount = _check_amount(amount_ucr)
        if amount <= 0:
            hint = "; use an adjustment to take credits away" if amount < 0 else ""
            raise BillingError(400, f"amount: a grant must be more than 0 credits, got "
                                    f"{format_credits(amount)}{hint}", "amount")
        return self._append(parse_account(account), "grant", amount, note, actor, now,
                            must_exist=False)

    def adjust(self, account: str, amount_ucr: int, *, note: str, actor: str,
               now: dt.datetime | None = None) -> int:
        """A signed correction with a note saying why; returns the entry id."""
        amount = _check_amount(amount_ucr)
        if amount == 0:
            raise BillingError(400, "amount: an adjustment of 0 changes nothing; give a "
                                    "signed, non-zero amount", "amount")
        if not isinstance(note, str) or not note.strip():
            raise BillingError(400, "note: an adjustment needs a note saying why", "note")
        return self._append(parse_account(account), "adjustment", amount, note, actor, now,
                            must_exist=True)

    def _append(self, account: str, kind: str, amount: int, note: str, actor: str,
                now: dt.datetime | None, *, must_exist: bool) -> int:
        if not isinstance(note, str):
            raise BillingError(400, f"note: must be text, got {shown(note)}", "note")
        with self.engine.begin() as conn:
            advisory_lock(conn, f"ledger:{account}")
            return self.append_in(conn, account, kind, amount, note, actor, now,
                                  must_exist=must_exist)

    @staticmethod
    def append_in(conn: Connection, account: str, kind: str, amount: int, note: str,
                  actor: str, now: dt.datetime | None, *, must_exist: bool = False,
                  reservation_id: int | None = None) -> int:
        """Append one row in the caller's transaction, which holds the account's lock
        (advisory_lock "ledger:ACCOUNT"); returns its id."""
        total = conn.execute(
            select(func.count(), func.coalesce(func.sum(ledger_entries.c.amount_ucr), 0))
            .where(ledger_entries.c.account == account)
        ).one()
        if must_exist and account.startswith("group:") and total[0] == 0:
            raise BillingError(404, f"unknown account {account}: a group account exists "
                                    "once credits are granted to it", "account")
        # A sum beyond 64 bits would make SQLite's SUM fail for this account
        # forever after: refuse the row that would do it.
        if not MIN_UCR <= int(total[1]) + amount <= MAX_UCR:
            raise BillingError(400, f"amount: the rows of {account} would sum beyond "
                                    "64 bits of micro-credits", "amount")
        result = conn.execute(insert(ledger_entries).values(
            account=account, kind=kind, amount_ucr=amount, note=note.strip(), actor=actor,
            created_at=now or utcnow(), reservation_id=reservation_id,
        ))
        return int(result.inserted_primary_key[0])

    def set_cap(self, account: str, user: str, monthly_ucr: int | None) -> None:
        """Cap what `user` may spend on a group account per calendar month (None: no cap)."""
        account = parse_account(account)
        if not account.startswith("group:"):
            raise BillingError(400, f"caps apply to group accounts only, not {account}",
                               "account")
        if monthly_ucr is not None:
            _check_amount(monthly_ucr)
            if monthly_ucr < 0:
                raise BillingError(400, f"monthly: a cap cannot be negative, got "
                                        f"{format_credits(monthly_ucr)}", "monthly")
        mine = (account_caps.c.account == account) & (account_caps.c.user_name == user)
        with self.engine.begin() as conn:
            advisory_lock(conn, f"ledger:{account}")
            if not self._exists(conn, account):
                raise BillingError(404, f"unknown account {account}", "account")
            # Delete then insert: one portable upsert inside the transaction.
            conn.execute(delete(account_caps).where(mine))
            if monthly_ucr is not None:
                conn.execute(insert(account_caps).values(
                    account=account, user_name=user, monthly_ucr=monthly_ucr))

    # --- reading ------------------------------------------------------------------
    @staticmethod
    def _exists(conn: Connection, account: str) -> bool:
        return conn.execute(select(literal(1)).where(ledger_entries.c.account == account)
                            .limit(1)).first() is not None

    def account_exists(self, account: str) -> bool:
        with reading(self.engine) as conn:
            return self._exists(conn, parse_account(account))

    def group_accounts(self) -> list[str]:
        query = (select(ledger_entries.c.account).distinct()
                 .where(ledger_entries.c.account.like("group:%"))
                 .order_by(ledger_entries.c.account))
        with reading(self.engine) as conn:
            return list(conn.execute(query).scalars())

    def balance(self, account: str, now: dt.datetime | None = None) -> int:
        """Rows minus open sessions' accrued cost as of their last confirmation."""
        account = parse_account(account)
        return self.balances([account], now)[account]

    @staticmethod
    def balance_in(conn: Connection, account: str) -> int:
        """`balance` read in the caller's transaction (which holds the account's lock)."""
        s = sessions.c
        rows = conn.execute(select(func.coalesce(func.sum(ledger_entries.c.amount_ucr), 0))
                            .where(ledger_entries.c.account == account)).scalar_one()
        running = conn.execute(
            select(s.started_at, s.last_confirmed_at, s.rate_per_hour_ucr)
            .where(s.ended_at.is_(None), s.account == account))
        return int(rows) - _accrued(running)

    def balances(self, accounts: Collection[str],
                 now: dt.datetime | None = None) -> dict[str, int]:
        """Balances of many accounts: two queries per 900 accounts (the heartbeat's call).
        `now` is unused: open sessions count to their last confirmation, not the clock."""
        wanted = sorted(set(accounts))
        result = dict.fromkeys(wanted, 0)
        s = sessions.c
        with reading(self.engine) as conn:
            for chunk in (wanted[i:i + _IN_CHUNK] for i in range(0, len(wanted), _IN_CHUNK)):
                sums = conn.execute(
                    select(ledger_entries.c.account, func.sum(ledger_entries.c.amount_ucr))
                    .where(ledger_entries.c.account.in_(chunk))
                    .group_by(ledger_entries.c.account))
                for account, total in sums:
                    result[account] += int(total)
                running = conn.execute(
                    select(s.account, s.started_at, s.last_confirmed_at, s.rate_per_hour_ucr)
                    .where(s.ended_at.is_(None), s.account.in_(chunk)))
                for row in running:
                    result[row.account] -= _accrued([row])
        return result

    def entries(self, account: str | None = None, since: dt.datetime | None = None,
                until: dt.datetime | None = None) -> list[dict[str, Any]]:
        """Rows in id order; `since` inclusive, `until` exclusive on created_at."""
        query = select(*(ledger_entries.c[name] for name in _ENTRY_COLUMNS))
        if account is not None:
            query = query.where(ledger_entries.c.account == parse_account(account))
        if since is not None:
            query = query.where(ledger_entries.c.created_at >= since)
        if until is not None:
            query = query.where(ledger_entries.c.created_at < until)
        with reading(self.engine) as conn:
            return [dict(row._mapping) for row in conn.execute(query.order_by(ledger_entries.c.id))]

    def cap_of(self, account: str, user: str) -> int | None:
        query = select(account_caps.c.monthly_ucr).where(
            account_caps.c.account == parse_account(account), account_caps.c.user_name == user)
        with reading(self.engine) as conn:
            value = conn.execute(query).scalar()
        return None if value is None else int(value)

    def member_spend(self, account: str, user: str, month_start: dt.datetime,
                     now: dt.datetime | None = None) -> int:
        """What `user` spent on `account` since `month_start`: charges + open accrued."""
        account = parse_account(account)
        e, s = ledger_entries.c, sessions.c
        with reading(self.engine) as conn:
            charged = conn.execute(
                select(func.coalesce(func.sum(e.amount_ucr), 0)).where(
                    e.account == account, e.user_name == user, e.kind == "charge",
                    e.created_at >= month_start)
            ).scalar()
            running = conn.execute(
                select(s.started_at, s.last_confirmed_at, s.rate_per_hour_ucr).where(
                    s.ended_at.is_(None), s.account == account, s.user_name == user))
            return -int(charged or 0) + _accrued(running)

    def open_runs(self, account: str) -> list[OpenRun]:
        """The account's open sessions, with what each accrued to its last confirmation."""
        s = sessions.c
        query = (select(s.user_name, s.server_name, s.profile_slug, s.rate_per_hour_ucr,
                        s.started_at, s.last_confirmed_at)
                 .where(s.ended_at.is_(None), s.account == parse_account(account)))
        with reading(self.engine) as conn:
            return [OpenRun((r.user_name, r.server_name), r.profile_slug,
                            int(r.rate_per_hour_ucr), r.started_at, _accrued([r]))
                    for r in conn.execute(query)]

    def check_start(self, account: str, user: str, needed_ucr: int,
                    now: dt.datetime | None = None, *, what: str = "",
                    rate_per_hour_ucr: int = 0, held: Held = Held(),
                    member_held: Held = Held()) -> None:
        """Refuse (402) a start that the balance or the member's monthly cap cannot cover.

        `held` is what other starts and running minimum runs already hold on
        the account (gpulease.core.billing.holds), `member_held` this member's part.
        A free profile (no price, no minimum run) is never refused for credit:
        a user in debt must still be able to reach their files on it. A paid
        one with `min_run: 0` still needs credit above zero.
        """
        account = parse_account(account)
        now = now or utcnow()
        purpose = f" for {what}" if what else ""
        if account.startswith("group:") and not self.account_exists(account):
            raise BillingError(404, f"unknown account {account}", "account")
        if needed_ucr <= 0 and rate_per_hour_ucr <= 0:
            return
        refusal = credit_refusal(account, self.balance(account, now), held, needed_ucr,
                                 rate_per_hour_ucr, purpose)
        if refusal is not None:
            raise BillingError(402, refusal, "account")
        cap = self.cap_of(account, user) if account.startswith("group:") else None
        if cap is not None:
            spent = self.member_spend(account, user, month_start(now), now)
            committed = spent + member_held.amount_ucr
            if committed + needed_ucr > cap or (needed_ucr <= 0 and committed >= cap):
                also = (f" and {format_credits(member_held.amount_ucr)} held for "
                        f"{member_held.describe()}" if member_held.amount_ucr else "")
                raise BillingError(402, f"Starting would take you over your monthly cap of "
                                        f"{format_credits(cap)} on {account}: spent "
                                        f"{format_credits(spent)} this month{also}, needs "
                                        f"{format_credits(needed_ucr)}{purpose}", "account")
