"""What each session's GPU did: the idle culler's readings folded into the open session.

A push (PUT api/gpu-readings) carries one reading per server. Each is folded
into that server's OPEN session only, all of one push in one transaction:

- a reading with an activity counts: samples + 1, sum + activity, peak = max;
- a memory reading raises the memory peak;
- a named source (nvml, gpm, dcgm) replaces the one kept: the latest names
  how the figures were read.

A server without an open session is skipped (it stopped between the
culler's look and its push); a closed session is never written, so what it
had at its close is what the usage page shows for good. The mean is
sum / samples (`mean_activity`), over the readings that had one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, bindparam, case, update

from gpulease.store.db import sessions

_c = sessions.c


@dataclass(frozen=True)
class GpuSample:
    """One server's reading, as validated by the service (hub/service/gpu_readings.py)."""

    user: str
    server: str
    activity: float | None  # percent, 0..100; None: not read
    memory_used_bytes: int | None
    source: str  # "" when the reading named none


def _statement(has_activity: bool, has_memory: bool, has_source: bool) -> Any:
    """An UPDATE of one server's open session for readings of this shape (executemany)."""
    values: dict[str, Any] = {}
    if has_activity:
        a = bindparam("a_activity", type_=_c.gpu_activity_sum.type)
        values["gpu_activity_samples"] = _c.gpu_activity_samples + 1
        # COALESCE: the first reading of a session starts the sum from NULL.
        values["gpu_activity_sum"] = case((_c.gpu_activity_sum.is_(None), a),
                                          else_=_c.gpu_activity_sum + a)
        values["gpu_activity_peak"] = case(
            (_c.gpu_activity_peak.is_(None), a), (_c.gpu_activity_peak < a, a),
            else_=_c.gpu_activity_peak)
    if has_memory:
        m = bindparam("a_memory", type_=_c.gpu_memory_peak_bytes.type)
        values["gpu_memory_peak_bytes"] = case(
            (_c.gpu_memory_peak_bytes.is_(None), m), (_c.gpu_memory_peak_bytes < m, m),
            else_=_c.gpu_memory_peak_bytes)
    if has_source:
        values["gpu_reading_source"] = bindparam("a_source", type_=_c.gpu_reading_source.type)
    return (update(sessions)
            .where(and_(_c.ended_at.is_(None), _c.user_name == bindparam("w_user"),
                        _c.server_name == bindparam("w_server")))
            .values(**values))


def fold_readings(engine: Engine, samples: Iterable[GpuSample]) -> None:
    """Fold one push's readings into their servers' open sessions, in ONE transaction.

    Readings are grouped by which figures they carry, so a push of thousands of
    servers is a few executemany statements, not thousands of round trips.
    """
    shapes: dict[tuple[bool, bool, bool], list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        shape = (s.activity is not None, s.memory_used_bytes is not None, bool(s.source))
        if not any(shape):
            continue  # nothing read: nothing to keep
        params: dict[str, Any] = {"w_user": s.user, "w_server": s.server}
        if s.activity is not None:
            params["a_activity"] = float(s.activity)
        if s.memory_used_bytes is not None:
            params["a_memory"] = int(s.memory_used_bytes)
        if s.source:
            params["a_source"] = s.source
        shapes[shape].append(params)
    if not shapes:
        return
    with engine.begin() as conn:
        for shape, params in shapes.items():
            conn.execute(_statement(*shape), params)


def mean_activity(samples: int | None, total: float | None) -> float | None:
    """The mean activity in percent, to 0.1; None when no reading had one."""
    if not samples or total is None:
        return None
    return round(float(total) / int(samples), 1)


def gpu_of_row(row: Any) -> dict[str, Any]:
    """The session row's GPU figures, flat (the usage listing's and CSV's gpu_* columns)."""
    peak = row.gpu_activity_peak
    memory = row.gpu_memory_peak_bytes
    return {
        "gpu_mean_activity": mean_activity(row.gpu_activity_samples, row.gpu_activity_sum),
        "gpu_peak_activity": None if peak is None else round(float(peak), 1),
        "gpu_peak_memory_bytes": None if memory is None else int(memory),
        "gpu_source": row.gpu_reading_source,
    }
