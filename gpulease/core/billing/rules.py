"""Billing's arithmetic and words: accounts, billed time to the millisecond, minutes left.

What the ledger (gpulease/store/ledger.py) stores, the meter charges and the pages show is
computed here, on integers of micro-credits and naive UTC datetimes.
"""

from __future__ import annotations

import datetime as dt
import re

from gpulease.core.clock import utcnow
from gpulease.core.refusal import Refusal
from gpulease.core.shown import shown
from gpulease.core.units import MAX_UCR

LOW_BALANCE_MINUTES = 10
MIN_UCR = -MAX_UCR - 1
ACCOUNT_FORMS = "user:NAME or group:NAME (a bare NAME means user:NAME)"
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}", re.IGNORECASE)


class BillingError(Refusal):
    """A ledger refusal: `status`, why, and the field it is about when there is one."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message, [(field, message)] if field else (), status=status)


def parse_account(text: str, *, default_user: str | None = None) -> str:
    """Canonical account text: "user:NAME" or "group:NAME"; "" -> the default user's."""
    if not isinstance(text, str):
        raise BillingError(400, f"an account is text, {ACCOUNT_FORMS}; got {shown(text)}",
                           "account")
    value = text.strip()
    if not value and default_user is not None:
        # An omitted account means the caller's personal one (docs/user.md).
        return f"user:{default_user}"
    kind, sep, name = value.partition(":")
    if not sep:
        kind, name = "user", value
    if kind not in ("user", "group") or not _NAME.fullmatch(name):
        raise BillingError(400, f"{text!r} is not an account; accounts are {ACCOUNT_FORMS}, "
                                "names of letters, digits, '_', '.', '-' (at most 64)",
                           "account")
    return f"{kind}:{name}"


_MS = dt.timedelta(milliseconds=1)


def to_ms(moment: dt.datetime, *, up: bool = False) -> dt.datetime:
    """`moment` on a millisecond: down (a confirmation, an end) or, with `up`, up (a
    start), so that a session's interval never holds a microsecond it did not run."""
    whole = moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)
    return whole + _MS if up and whole != moment else whole


def billed_ms(started: dt.datetime, ended: dt.datetime) -> int:
    """`ended - started` in whole milliseconds (rounded down); never negative."""
    return max(0, (ended - started) // _MS)


def seconds_up(ms: int) -> int:
    """Milliseconds as whole seconds rounded up: the API's `billed_seconds`."""
    return -(-ms // 1000)


def billed_seconds(started: dt.datetime, ended: dt.datetime) -> int:
    """`ended - started` in whole seconds, rounded up from its milliseconds."""
    return seconds_up(billed_ms(started, ended))


def minutes_left(balance_ucr: int, rate_per_hour_ucr: int) -> int | None:
    """Whole minutes `balance_ucr` lasts at a rate (None: a free rate never runs out)."""
    if rate_per_hour_ucr <= 0:
        return None
    return max(0, balance_ucr * 60 // rate_per_hour_ucr)


def month_start(now: dt.datetime | None = None) -> dt.datetime:
    """Midnight UTC of the first day of `now`'s calendar month (caps are monthly)."""
    now = now or utcnow()
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def runway(balance_ucr: int, account_rate_ucr: int, cap_left_ucr: int | None = None,
           own_rate_ucr: int = 0) -> tuple[int | None, str | None]:
    """(seconds until a running server is stopped for money at today's rates, what runs
    out first: "balance" or "cap"); (None, None): never.

    The account's balance runs down at the summed rate of every session open on it
    (`account_rate_ucr`, this one's included); a member's cap on a group account runs
    down at the rate of their own sessions there (`own_rate_ucr`). The earlier of the
    two, never below 0. A lower bound: a cap renews at the month's turn."""
    found: list[tuple[int, str]] = []
    if account_rate_ucr > 0:
        found.append((max(0, balance_ucr) * 3600 // account_rate_ucr, "balance"))
    if cap_left_ucr is not None and own_rate_ucr > 0:
        found.append((max(0, cap_left_ucr) * 3600 // own_rate_ucr, "cap"))
    if not found:
        return None, None
    seconds, by = min(found, key=lambda f: f[0])
    return seconds, by


def runway_s(balance_ucr: int, account_rate_ucr: int, cap_left_ucr: int | None = None,
             own_rate_ucr: int = 0) -> int | None:
    """`runway`'s seconds alone."""
    return runway(balance_ucr, account_rate_ucr, cap_left_ucr, own_rate_ucr)[0]
