"""Admission holds: starts at once on one balance cannot together overspend it.

A start is admitted for credit when the account's balance, less what is
already promised to other starts, covers the start's minimum run. What is
promised ("held"):

- the minimum-run cost of every admitted start whose session has not opened
  yet (it may be waiting in the queue for minutes);
- for every open session, the part of its profile's minimum run that it has
  not accrued yet (the balance already subtracts what it accrued up to its
  last confirmation, see `gpulease.store.ledger`).

The check and the registration of the new start's hold happen under one lock
of the hub process (the embedded hub is one process; every start runs its
admission there), so N starts sent at once are admitted one after the other
and each sees the holds of those before it. A hold ends when its server's
session opens (the session then counts instead) or when its spawn ends
without one (refused, failed, or a free profile that never opens a session).

The rules are plain functions over plain data; `AdmissionHolds` is the
in-memory registry and its lock.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpulease.core.units import format_credits, rate_cost

Key = tuple[str, str]  # (user, server name)


@dataclass(frozen=True)
class Hold:
    """An admitted start's minimum-run cost, held until its session opens."""

    key: Key
    account: str
    amount_ucr: int
    created: dt.datetime  # naive UTC, as session rows store started_at
    # False once the spawn has ended (success or failure): read from the spawner.
    alive: Callable[[], bool] = field(default=lambda: True, compare=False)


@dataclass(frozen=True)
class OpenRun:
    """An open session of the account, as the sessions table has it."""

    key: Key
    profile: str
    rate_per_hour_ucr: int
    started: dt.datetime
    accrued_ucr: int  # up to its last confirmation: what the balance already subtracts


@dataclass(frozen=True)
class Held:
    amount_ucr: int = 0
    starts: int = 0  # admitted starts whose session has not opened
    runs: int = 0  # open sessions still within their minimum run

    def describe(self) -> str:
        parts = []
        if self.starts:
            parts.append(f"{self.starts} start{'s' if self.starts != 1 else ''} in progress")
        if self.runs:
            parts.append(f"{self.runs} running server{'s' if self.runs != 1 else ''} "
                         "within their minimum run")
        return " and ".join(parts)


def unused_minimum(min_run_s: int, rate_per_hour_ucr: int, accrued_ucr: int) -> int:
    """What of a running session's minimum run it has not accrued yet (never negative)."""
    return max(0, rate_cost(min_run_s, rate_per_hour_ucr) - accrued_ucr)


def held_on(holds: Iterable[Hold], runs: Iterable[OpenRun], min_run_s: Mapping[str, int],
            *, user: str | None = None) -> Held:
    """What is promised on one account; `user`: only that member's part (caps).

    `holds` and `runs` are the account's. A hold whose server has a session
    opened since the hold was made counts no more: that session counts instead.
    """
    runs = list(runs)
    opened = {r.key: r.started for r in runs}
    amount = starts = counted_runs = 0
    for hold in holds:
        if user is not None and hold.key[0] != user:
            continue
        started = opened.get(hold.key)
        if started is not None and started >= hold.created:
            continue
        amount += hold.amount_ucr
        starts += 1
    for run in runs:
        if user is not None and run.key[0] != user:
            continue
        left = unused_minimum(min_run_s.get(run.profile, 0), run.rate_per_hour_ucr,
                              run.accrued_ucr)
        if left > 0:
            amount += left
            counted_runs += 1
    return Held(amount, starts, counted_runs)


def credit_refusal(account: str, balance_ucr: int, held: Held, needed_ucr: int,
                   rate_per_hour_ucr: int, purpose: str = "") -> str | None:
    """Why a start cannot be admitted for credit, or None when it can.

    A free profile (no price, no minimum run) is never refused: a user in debt
    must still reach their files on it. A paid profile needs what is free of
    the balance (balance less what is held) to cover its minimum run, and to
    be above zero even when its minimum run is 0.
    """
    if needed_ucr <= 0 and rate_per_hour_ucr <= 0:
        return None
    free = balance_ucr - held.amount_ucr
    if needed_ucr > 0 and free >= needed_ucr:
        return None
    if needed_ucr <= 0 and free > 0:
        return None
    text = f"Not enough credit on {account}: balance {format_credits(balance_ucr)}"
    if held.amount_ucr:
        text += (f", of which {format_credits(held.amount_ucr)} is held for "
                 f"{held.describe()} ({format_credits(free)} free)")
    if needed_ucr > 0:
        return text + f", needs {format_credits(needed_ucr)}{purpose}"
    return (text + f"; a paid profile ({format_credits(rate_per_hour_ucr)} credits/h) starts "
                   f"only with credit above zero{purpose}")


class AdmissionHolds:
    """The hub process's holds; `lock` makes check-then-hold one step."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._holds: dict[Key, Hold] = {}

    def on(self, account: str) -> list[Hold]:
        """The live holds on `account`; holds of spawns that ended are dropped."""
        for key, hold in list(self._holds.items()):
            if not hold.alive():
                self._holds.pop(key, None)
        return [h for h in self._holds.values() if h.account == account]

    def add(self, hold: Hold) -> None:
        self._holds[hold.key] = hold

    def release(self, user: str, server: str) -> None:
        self._holds.pop((user, server), None)
