"""What a metering session is: a run of a server, its tier, why it ended, what it cost.

A session is billed from its start (rounded up to the millisecond) to its last
confirmation or its end (rounded down): gpulease/store/sessions.py stores them,
the hub's meter (hub/billing/metering.py) keeps the open ones in memory as LiveSession.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpulease.core.billing.rules import BillingError, billed_ms, seconds_up, to_ms
from gpulease.core.tiers import ON_DEMAND
from gpulease.core.units import ms_cost

END_REASONS = ("user", "idle", "out_of_credit", "account_cap", "max_runtime", "admin",
               "server_died", "hub_shutdown", "hub_lost", "preempted", "reservation_ended",
               "start_failed")


@dataclass(frozen=True)
class Session:
    id: int
    user: str
    server: str
    profile: str
    account: str
    rate_per_hour_ucr: int
    started: dt.datetime
    last_confirmed: dt.datetime
    ended: dt.datetime | None
    end_reason: str | None
    requested_end_reason: str | None
    closed_ms: int | None = None  # what a closed session was billed (its row's billed_ms)
    tier: str = ON_DEMAND
    preempted_until: dt.datetime | None = None  # being preempted: it runs until then
    preempt_why: str | None = None
    reservation_id: int | None = None  # tier reserved: the reservation it ran on

    def billed_ms(self, now: dt.datetime | None = None) -> int:
        """Closed: what it was billed. Open: up to the last confirmation, or to `now`
        (on the millisecond) if given."""
        if self.ended is not None:
            return self.closed_ms if self.closed_ms is not None else billed_ms(
                self.started, self.ended)
        until = self.last_confirmed if now is None else max(to_ms(now), self.last_confirmed)
        return billed_ms(self.started, until)

    def billed_seconds(self, now: dt.datetime | None = None) -> int:
        """`billed_ms` rounded up to the second (the API keeps it for its clients)."""
        return seconds_up(self.billed_ms(now))

    def cost(self, now: dt.datetime | None = None) -> int:
        return ms_cost(self.billed_ms(now), self.rate_per_hour_ucr)


def check_end_reason(reason: str) -> str:
    """`reason` if it is one of END_REASONS, else a refusal naming them."""
    if reason not in END_REASONS:
        raise BillingError(400, f"reason: {reason!r} is not one of {', '.join(END_REASONS)}",
                           "reason")
    return reason


class MeterConflict(BillingError):
    """Another live hub process holds the meter lease of this database."""

    def __init__(self, message: str):
        super().__init__(409, message, None)


Key = tuple[str, str]  # (user, server name)


@dataclass
class LiveSession:
    """What the hub keeps in memory about an open session."""

    session_id: int
    profile: str
    account: str
    rate_per_hour_ucr: int
    last_alive: dt.datetime
    tier: str = ON_DEMAND
    reservation_id: int | None = None  # tier reserved: the reservation it runs on
