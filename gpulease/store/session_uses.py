"""Recent closed sessions with their GPU readings, as the right-sizing rule reads them.

Beside billing_reports.usage (which lists sessions by start for a period the
caller picks): right-sizing looks at sessions that ENDED in its lookback window,
because only a closed session has its readings and its billed_ms for good
(gpu_stats.py never writes a closed session). Only the columns the rule needs
are read, so the admins' report over every researcher's month stays light.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import NamedTuple

from sqlalchemy import Engine, select

from gpulease.core.policy.right_sizing import SessionUse
from gpulease.store.db import reading, sessions

__all__ = ["ServerUse", "recent_uses", "uses_by_profile"]

_c = sessions.c


class ServerUse(NamedTuple):
    """A session's use and the server it ran (a notice about it is shown there)."""

    server: str
    use: SessionUse


def recent_uses(engine: Engine, *, since: dt.datetime, user: str | None = None
                ) -> list[ServerUse]:
    """Closed sessions that ended at or after `since` (naive UTC), of `user` (None: all),
    oldest first."""
    query = (select(_c.server_name, _c.profile_slug, _c.billed_ms, _c.started_at, _c.ended_at,
                    _c.gpu_activity_samples, _c.gpu_activity_sum, _c.gpu_activity_peak,
                    _c.gpu_memory_peak_bytes, _c.gpu_activity_read_ms, _c.gpu_memory_read_ms,
                    _c.tier, _c.rate_per_hour_ucr)
             .where(_c.ended_at.is_not(None), _c.ended_at >= since)
             .order_by(_c.ended_at, _c.id))
    if user is not None:
        query = query.where(_c.user_name == user)
    with reading(engine) as conn:
        rows = conn.execute(query).all()
    return [ServerUse(row.server_name, _use(row)) for row in rows]


def _use(row) -> SessionUse:
    samples, total = row.gpu_activity_samples, row.gpu_activity_sum
    # Unrounded (gpu_stats.mean_activity rounds for display): the rule compares the
    # mean against thresholds, where a tenth of a percent may tip it.
    mean = float(total) / int(samples) if samples and total is not None else None
    billed = row.billed_ms
    if billed is None:  # a row closed before billed_ms was kept: its interval, as billed
        billed = max(0, int((row.ended_at - row.started_at) / dt.timedelta(milliseconds=1)))
    return SessionUse(
        profile=row.profile_slug, billed_ms=int(billed), mean_activity=mean,
        peak_activity=None if row.gpu_activity_peak is None else float(row.gpu_activity_peak),
        peak_memory_bytes=(None if row.gpu_memory_peak_bytes is None
                           else int(row.gpu_memory_peak_bytes)),
        activity_read_ms=int(row.gpu_activity_read_ms or 0),
        memory_read_ms=int(row.gpu_memory_read_ms or 0),
        tier=row.tier, rate_per_hour_ucr=int(row.rate_per_hour_ucr))


def uses_by_profile(uses: list[ServerUse]) -> dict[str, list[SessionUse]]:
    """The sessions grouped by profile slug (profile_report's input)."""
    grouped: dict[str, list[SessionUse]] = defaultdict(list)
    for _, use in uses:
        grouped[use.profile].append(use)
    return dict(grouped)
