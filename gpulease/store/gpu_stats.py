"""What each session's GPU did: the idle culler's readings folded into the open session.

A push (PUT api/gpu-readings) carries one reading per server, each naming the
server's start as the hub listed it to the culler: the run it was read for.
`fold_readings` first decides which session each reading is OF (`accepted_sessions`):
the server's open session where it bills that run (`run_started_at`). A reading of
an earlier run (the culler's list is up to a pass old) was read on devices that may
be another researcher's by now, so it is kept nowhere.

Each accepted reading is folded into its session, all of one push in one transaction:

- a reading with an activity counts: samples + 1, sum + activity, peak = max, and
  the interval it stands for is added to `gpu_activity_read_ms`;
- a memory reading raises the memory peak and adds to `gpu_memory_read_ms`;
- a named source (nvml, gpm, dcgm) replaces the one kept: the latest names
  how the figures were read.

A closed session is never written, so what it had at its close is what the usage
page shows for good. The mean is sum / samples (`mean_activity`), over the readings
that had one; the read milliseconds say how much of the session they stood for.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, bindparam, case, select, update

from gpulease.store.db import sessions

_c = sessions.c
_CHUNK = 900  # user names per query: under SQLite's old limit of 999 bound parameters
# A reading stands for at most this much of its session: the longest interval the
# service takes (api/gpu-readings' interval_s), what the hub lets the culler read at.
MAX_READ_MS = 300_000


@dataclass(frozen=True)
class GpuSample:
    """One server's reading, as validated by the service (hub/service/gpu_readings.py)."""

    user: str
    server: str
    started: dt.datetime  # the server's start the reading is of (naive UTC, the hub's clock)
    activity: float | None  # percent, 0..100; None: not read
    memory_used_bytes: int | None
    source: str  # "" when the reading named none


def _statement(has_activity: bool, has_memory: bool, has_source: bool) -> Any:
    """An UPDATE of one open session for readings of this shape (executemany)."""
    values: dict[str, Any] = {}
    read_ms = bindparam("a_read_ms", type_=_c.gpu_activity_read_ms.type)
    if has_activity:
        a = bindparam("a_activity", type_=_c.gpu_activity_sum.type)
        values["gpu_activity_samples"] = _c.gpu_activity_samples + 1
        # COALESCE: the first reading of a session starts the sum from NULL.
        values["gpu_activity_sum"] = case((_c.gpu_activity_sum.is_(None), a),
                                          else_=_c.gpu_activity_sum + a)
        values["gpu_activity_peak"] = case(
            (_c.gpu_activity_peak.is_(None), a), (_c.gpu_activity_peak < a, a),
            else_=_c.gpu_activity_peak)
        values["gpu_activity_read_ms"] = _c.gpu_activity_read_ms + read_ms
    if has_memory:
        m = bindparam("a_memory", type_=_c.gpu_memory_peak_bytes.type)
        values["gpu_memory_peak_bytes"] = case(
            (_c.gpu_memory_peak_bytes.is_(None), m), (_c.gpu_memory_peak_bytes < m, m),
            else_=_c.gpu_memory_peak_bytes)
        values["gpu_memory_read_ms"] = _c.gpu_memory_read_ms + read_ms
    if has_source:
        values["gpu_reading_source"] = bindparam("a_source", type_=_c.gpu_reading_source.type)
    return (update(sessions)
            .where(and_(_c.id == bindparam("w_id"), _c.ended_at.is_(None)))
            .values(**values))


def _chunks(items: list[str]) -> Iterator[list[str]]:
    return (items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK))


# The hub lists a run's start to the microsecond; stored, a session keeps what its
# database keeps (SQLite and PostgreSQL: microseconds). A second covers any rounding.
SAME_RUN = dt.timedelta(seconds=1)


def accepted_sessions(conn: Any, samples: Sequence[GpuSample]) -> list[int | None]:
    """Per sample, the id of the open session it is of, or None.

    A sample is of its server's open session where that session bills the run the
    sample names: its `run_started_at` is the sample's start. A session that does not
    know its run (opened before 0014, or by a caller that did not say) takes the
    sample unless an earlier session of that server, one that ended before the open
    session began, ended at or after the sample's start: the sample is then of an
    earlier run, read on devices it no longer holds. (A session that ended just as the
    open one began is the same run going on: a reservation's end, a repair.)"""
    if not samples:
        return []
    users = sorted({s.user for s in samples})
    oldest = min(s.started for s in samples)
    open_runs: dict[tuple[str, str], tuple[int, dt.datetime, dt.datetime | None]] = {}
    ends: dict[tuple[str, str], list[dt.datetime]] = defaultdict(list)
    for chunk in _chunks(users):
        for row in conn.execute(select(_c.id, _c.user_name, _c.server_name, _c.started_at,
                                       _c.run_started_at)
                                .where(_c.ended_at.is_(None), _c.user_name.in_(chunk))):
            open_runs[(row.user_name, row.server_name)] = (row.id, row.started_at,
                                                           row.run_started_at)
        for user, server, ended in conn.execute(
                select(_c.user_name, _c.server_name, _c.ended_at)
                .where(_c.user_name.in_(chunk), _c.ended_at >= oldest)):
            ends[(user, server)].append(ended)
    accepted: list[int | None] = []
    for s in samples:
        found = open_runs.get((s.user, s.server))
        if found is None:
            accepted.append(None)
            continue
        session_id, began, run = found
        if run is not None:
            same = abs(run - s.started) <= SAME_RUN
        else:
            same = not any(s.started <= ended < began for ended in ends[(s.user, s.server)])
        accepted.append(session_id if same else None)
    return accepted


def fold_readings(engine: Engine, samples: Iterable[GpuSample], interval_ms: int
                  ) -> list[int | None]:
    """Fold one push's readings into their servers' open sessions, in ONE transaction;
    per reading, the id of the session it was accepted for (`accepted_sessions`; those
    with nothing read included: the service shows them as "no reading"), or None.

    Readings are grouped by which figures they carry, so a push of thousands of
    servers is a few executemany statements, not thousands of round trips.
    """
    samples = list(samples)
    read_ms = max(0, min(int(interval_ms), MAX_READ_MS))
    with engine.begin() as conn:
        accepted = accepted_sessions(conn, samples)
        shapes: dict[tuple[bool, bool, bool], list[dict[str, Any]]] = defaultdict(list)
        for s, session_id in zip(samples, accepted, strict=True):
            shape = (s.activity is not None, s.memory_used_bytes is not None, bool(s.source))
            if session_id is None or not any(shape):
                continue  # not this session's, or nothing read: nothing to keep
            params: dict[str, Any] = {"w_id": session_id}
            if shape[0] or shape[1]:
                params["a_read_ms"] = read_ms
            if s.activity is not None:
                params["a_activity"] = float(s.activity)
            if s.memory_used_bytes is not None:
                params["a_memory"] = int(s.memory_used_bytes)
            if s.source:
                params["a_source"] = s.source
            shapes[shape].append(params)
        for shape, params in shapes.items():
            conn.execute(_statement(*shape), params)
    return accepted


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
