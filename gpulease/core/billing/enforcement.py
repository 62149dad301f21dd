"""What the billing heartbeat must do about running servers (pure decisions).

The heartbeat (`gpulease.hub.billing.metering.Meter.heartbeat`) gathers facts — the
open sessions, the servers the hub counts as running, balances, members'
caps — and these functions decide:

- `missing_sessions`: running servers without an open session (a gap in
  metering: the invariant is that a server the hub counts as running always
  has one), and from when to bill each;
- `who_must_stop`: sessions whose account is out of credit (`out_of_credit`)
  or whose member has reached their monthly cap on a group account
  (`account_cap`);
- `stop_actions`: how hard to push a server that must stop — a stop on every
  heartbeat until it is gone, and a kill of its process tree once a stop has
  had a heartbeat to complete and did not.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpulease.core.tiers import ON_DEMAND
from gpulease.core.units import format_credits

Key = tuple[str, str]  # (user, server name)

OUT_OF_CREDIT = "out_of_credit"
ACCOUNT_CAP = "account_cap"
PREEMPTED = "preempted"  # a spot server whose GPU an on-demand start took
RESERVATION_ENDED = "reservation_ended"  # its reservation ended; its holder chose suspend


@dataclass(frozen=True)
class Metered:
    """An open session, as the decisions need it."""

    key: Key
    account: str
    rate_per_hour_ucr: int


@dataclass(frozen=True)
class RunningServer:
    """A server the hub counts as running (ready), with what its session needs."""

    key: Key
    profile: str
    account: str
    rate_per_hour_ucr: int
    # When it was launched (its code could first run), if this hub saw it (None:
    # not known here, e.g. it was started before a hub restart).
    launched_at: dt.datetime | None = None
    # When the hub started it (JupyterHub's `started`), for the log of the gap.
    started_at: dt.datetime | None = None
    tier: str = ON_DEMAND
    reservation_id: int | None = None  # tier reserved: the reservation it runs on


@dataclass(frozen=True)
class Repair:
    server: RunningServer
    since: dt.datetime  # the session's start
    gap_s: float  # how long it ran unmetered before this heartbeat found it


@dataclass(frozen=True)
class CapUse:
    cap_ucr: int
    spent_ucr: int


@dataclass(frozen=True)
class StopOrder:
    key: Key
    reason: str  # OUT_OF_CREDIT, ACCOUNT_CAP, PREEMPTED or RESERVATION_ENDED
    account: str
    why: str  # for the log and the user's notice
    cap: CapUse | None = None


@dataclass(frozen=True)
class Preempting:
    """A spot server told it is preempted: stopped at `deadline`, billed up to it."""

    deadline: dt.datetime
    why: str
    session_id: int


@dataclass
class StopProgress:
    """A stop the heartbeat enforces until the server is gone."""

    order: StopOrder
    first_at: dt.datetime
    session_id: int | None = None  # the billing session it stops; a start after is another run
    attempts: int = 0
    reason_recorded: bool = False
    killed: int = 0


def missing_sessions(running: Iterable[RunningServer], metered: Collection[Key],
                     now: dt.datetime) -> list[Repair]:
    """Running servers with no open session, and from when to bill each.

    Billed from its launch when this hub saw it; otherwise from
    now — the time before is not known to have been the server's (its start
    may have waited in the queue), so it is logged as a gap, not invented.
    """
    repairs = []
    for server in running:
        if server.key in metered:
            continue
        since = min(server.launched_at, now) if server.launched_at else now
        began = server.launched_at or server.started_at or now
        repairs.append(Repair(server, since, max(0.0, (now - began).total_seconds())))
    return repairs


def who_must_stop(metered: Iterable[Metered], balances: Mapping[str, int],
                  caps: Mapping[tuple[str, str], CapUse]) -> list[StopOrder]:
    """Paid sessions to stop: the account is at or below zero, or the member's cap is spent.

    `caps` is keyed by (account, user) for members with a cap on a group
    account. A free session (rate 0) is never stopped for money: a user in
    debt must still reach their files on a free profile. A session whose
    account's balance was not read (it opened while this heartbeat read the
    balances, on another thread) is judged at the next one: it was stopped as
    out of credit at once, its balance taken for 0.
    """
    orders = []
    for m in metered:
        if m.rate_per_hour_ucr <= 0:
            continue
        balance = balances.get(m.account)
        if balance is None:
            continue
        if balance <= 0:
            orders.append(StopOrder(m.key, OUT_OF_CREDIT, m.account,
                                    f"{m.account} is out of credit ({format_credits(balance)})"))
            continue
        cap = caps.get((m.account, m.key[0]))
        if cap is not None and cap.spent_ucr >= cap.cap_ucr:
            orders.append(StopOrder(
                m.key, ACCOUNT_CAP, m.account,
                f"{m.key[0]} has spent {format_credits(cap.spent_ucr)} of their monthly cap "
                f"of {format_credits(cap.cap_ucr)} on {m.account}", cap))
    return orders


def stop_actions(progress: StopProgress, now: dt.datetime, kill_after_s: float) -> tuple[str, ...]:
    """("stop",) or ("kill", "stop"): what to do this heartbeat for a server still there.

    A stop is asked on every heartbeat (the hub ignores it while one is in
    flight, and a failed one is tried again). A stop that has had
    `kill_after_s` to complete and has not — a server that ignores SIGTERM,
    a stop that hangs — has the server's process tree killed first.
    """
    if progress.attempts > 0 and (now - progress.first_at).total_seconds() >= kill_after_s:
        return ("kill", "stop")
    return ("stop",)
