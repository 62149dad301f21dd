"""GPU readings the idle culler pushes, validated, and the last hour of them in memory.

The culler reads each server's GPU (nvml, gpm, dcgm) on its pass and pushes
what it read (`PUT api/gpu-readings`, hub/service/api/gpu.py). Pure parts here:

- `parse_readings(body)`: every entry checked, every problem named by its
  field (`servers[3].activity`); one bad entry refuses the whole push, so
  nothing is half-written;
- `GpuReadings`: per server, the readings of its open session only (the ones
  gpu_stats.fold_readings accepted): the latest, with its source and why it has
  no figure, and the last hour as one point a minute, for the researcher's
  status bar (`GET api/me/gpu`). Memory, not the database, like the pushed
  kernel state (activity_store.py): a restart forgets an hour of a chart, while
  each session's totals are kept in its row (gpulease/store/gpu_stats.py).
  Fixed-size arrays per server, so the whole store is bounded: at a point a
  minute about 3 KB a server with its latest reading, 100,000 servers (~300 MB) at most.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpulease.hub.service.activity_store import PushError
from gpulease.hub.service.billing_views import PeriodError, parse_time
from gpulease.store.gpu_stats import GpuSample

SOURCES = ("nvml", "gpm", "dcgm", "")
ENTRY_KEYS = ("user", "server", "started", "activity", "memory_used_bytes",
              "memory_total_bytes", "source", "why")
PUSH_KEYS = ("servers", "interval_s")
MAX_SERVERS_PER_PUSH = 5000  # ~200 bytes each: within the service's 1 MiB body bound
MAX_NAME = 255  # the sessions table's user_name and server_name
MAX_WHY = 500
MAX_BYTES = 2**63 - 1  # a BIGINT
# The interval a push's readings stand for (`interval_s`): the culler's (10 s by default).
DEFAULT_INTERVAL_S, MIN_INTERVAL_S, MAX_INTERVAL_S = 10.0, 1.0, 300.0
HOUR_S = 3600  # the chart: the last hour
CHART_STEP_S = 60  # a point a minute by default (GPULeaseHub.gpu_chart_step)
MAX_SERVERS = 100_000  # held in all; the servers not pushed for longest are forgotten first
# A latest reading older than this many of its push's intervals (and at least STALE_MIN_S)
# is not shown as current: the culler stopped reading this server.
STALE_INTERVALS, STALE_MIN_S = 3, 30.0
# How far the hub's clock may run ahead of this service's (the same machine's, or the
# cluster's, kept in step by NTP) before a start "in the future" is refused.
MAX_CLOCK_SKEW = timedelta(minutes=5)
_SHAPE = "A push is {\"servers\": [{user, server, started, activity, memory_used_bytes, " \
         "memory_total_bytes, source, why}], \"interval_s\": seconds}"


@dataclass(frozen=True)
class GpuReading:
    """One server's GPU reading; `at` is when the service received it."""

    user: str
    server: str
    started: datetime  # the server's start it was read for, naive UTC (the hub's listing)
    at: datetime
    activity: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    source: str
    why: str

    def sample(self) -> GpuSample:
        return GpuSample(self.user, self.server, self.started, self.activity,
                         self.memory_used_bytes, self.source)


def _name(entry: dict, key: str, where: str, errors: list[tuple[str, str]]) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        errors.append((f"{where}.{key}", "must be a string"))
        return ""
    if len(value) > MAX_NAME or "\x00" in value or not _encodable(value):
        errors.append((f"{where}.{key}", f"must be at most {MAX_NAME} characters of valid "
                                         "Unicode, no NUL"))
    return value


def _encodable(text: str) -> bool:
    """False for a lone surrogate ("\\ud800" in JSON): no database takes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _activity(value: Any, where: str, errors: list[tuple[str, str]]) -> float | None:
    # json_loads reads 37.5 as a Decimal (exact); a bool is no number here.
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        errors.append((where, "must be a number of percent (0 to 100) or null"))
        return None
    number = _float(value)
    if number is None or not 0 <= number <= 100:
        errors.append((where, f"{value} is not between 0 and 100 (percent)"))
        return None
    return number


def _bytes(value: Any, where: str, errors: list[tuple[str, str]]) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append((where, "must be a whole number of bytes or null"))
        return None
    if not 0 <= value <= MAX_BYTES:
        errors.append((where, f"{value} is not between 0 and {MAX_BYTES} bytes"))
        return None
    return value


def _started(value: Any, where: str, now: datetime,
             errors: list[tuple[str, str]]) -> datetime | None:
    if not isinstance(value, str) or len(value) <= 10:
        errors.append((where, "must be the server's start as the hub lists it: an ISO 8601 "
                              "timestamp (2026-01-31T12:00:00Z)"))
        return None
    try:
        started = parse_time(value, where)
    except PeriodError as e:
        errors.append((where, e.message))
        return None
    if started is not None and started > now + MAX_CLOCK_SKEW:
        errors.append((where, f"{value} is later than this service's clock (by more than "
                              f"{MAX_CLOCK_SKEW.total_seconds():.0f} s): a server's start "
                              "is in the past"))
        return None
    return started


def _float(value: int | float | Decimal) -> float | None:
    """`value` as a finite float; None for one too large for a float (a 400-digit integer)
    or not finite."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _interval(value: Any, errors: list[tuple[str, str]]) -> float:
    if value is None:
        return DEFAULT_INTERVAL_S
    number = None if isinstance(value, bool) or not isinstance(value, int | float | Decimal) \
        else _float(value)
    if number is None or not MIN_INTERVAL_S <= number <= MAX_INTERVAL_S:
        errors.append(("interval_s", f"must be the seconds between readings, "
                                     f"{MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}"))
        return DEFAULT_INTERVAL_S
    return number


@dataclass(frozen=True)
class ReadingsPush:
    readings: list[GpuReading]
    interval_s: float  # what each reading stands for of its session


def parse_readings(body: Any, now: datetime) -> ReadingsPush:
    """The push's readings; PushError(400) naming every problem, field by field.
    `now`: naive UTC, when the service received them."""
    if not isinstance(body, dict):
        raise PushError(400, _SHAPE, [("", "must be a JSON object")])
    errors: list[tuple[str, str]] = [(key, f"unknown field; allowed: {', '.join(PUSH_KEYS)}")
                                     for key in sorted(set(body) - set(PUSH_KEYS))]
    interval = _interval(body.get("interval_s"), errors)
    servers = body.get("servers")
    if not isinstance(servers, list):
        errors.append(("servers", "must be a list"))
        servers = []
    elif len(servers) > MAX_SERVERS_PER_PUSH:
        errors.append(("servers", f"at most {MAX_SERVERS_PER_PUSH} a push (has "
                                  f"{len(servers)}): push the rest in another"))
        servers = []
    readings = []
    for i, entry in enumerate(servers):
        where = f"servers[{i}]"
        if not isinstance(entry, dict):
            errors.append((where, "must be an object"))
            continue
        errors += [(f"{where}.{key}", f"unknown field; allowed: {', '.join(ENTRY_KEYS)}")
                   for key in sorted(set(entry) - set(ENTRY_KEYS))]
        user, server = _name(entry, "user", where, errors), _name(entry, "server", where, errors)
        if "user" in entry and isinstance(entry["user"], str) and not entry["user"]:
            errors.append((f"{where}.user", "must not be empty"))
        started = _started(entry.get("started"), f"{where}.started", now, errors)
        activity = _activity(entry.get("activity"), f"{where}.activity", errors)
        used = _bytes(entry.get("memory_used_bytes"), f"{where}.memory_used_bytes", errors)
        total = _bytes(entry.get("memory_total_bytes"), f"{where}.memory_total_bytes", errors)
        source = entry.get("source", "")
        if source not in SOURCES:
            errors.append((f"{where}.source", "must be one of nvml, gpm, dcgm or \"\""))
            source = ""
        why = entry.get("why", "")
        if not isinstance(why, str) or len(why) > MAX_WHY or "\x00" in why \
                or not _encodable(why):
            errors.append((f"{where}.why", f"must be a string of at most {MAX_WHY} "
                                           "characters of valid Unicode, no NUL"))
            why = ""
        if started is not None:
            readings.append(GpuReading(user, server, started, now, activity, used, total,
                                       source, why))
    if errors:
        first = f"{errors[0][0]}: {errors[0][1]}"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise PushError(400, f"Nothing was kept: {first}{more}", errors)
    return ReadingsPush(readings, interval)


def reading_view(r: GpuReading, iso: Any, now: datetime, interval_s: float) -> dict[str, Any]:
    """The latest reading as the status bar shows it; nulls with why once it is stale."""
    age = (now - r.at).total_seconds()
    if age > max(STALE_MIN_S, STALE_INTERVALS * interval_s):
        return {"activity": None, "memory_used_bytes": None, "memory_total_bytes": None,
                "source": "", "at": iso(r.at),
                "why": f"no reading for {age:.0f} s: the idle culler has not read this "
                       "server since"}
    return {"activity": r.activity, "memory_used_bytes": r.memory_used_bytes,
            "memory_total_bytes": r.memory_total_bytes, "source": r.source, "why": r.why,
            "at": iso(r.at)}


def _step(at: datetime, step_s: int) -> int:
    return int((at - datetime(1970, 1, 1)).total_seconds() // step_s)


class _Held:
    """One server's readings of one session: the latest, and a ring of the last hour's
    steps (mean activity, peak memory), in fixed-size arrays."""

    __slots__ = ("session", "run", "step_s", "interval_s", "latest", "step", "activity_sum",
                 "activity_n", "memory")

    def __init__(self, session: int, run: datetime, step_s: int) -> None:
        slots = HOUR_S // step_s
        self.session, self.run, self.step_s = session, run, step_s
        self.interval_s = DEFAULT_INTERVAL_S
        self.latest: GpuReading | None = None
        self.step = array("i", [-1] * slots)  # which step each slot holds
        self.activity_sum = array("f", [0.0] * slots)
        self.activity_n = array("H", [0] * slots)
        self.memory = array("q", [-1] * slots)  # -1: not read in that step

    def add(self, r: GpuReading, interval_s: float) -> None:
        self.latest, self.interval_s = r, interval_s
        step = _step(r.at, self.step_s)
        slot = step % len(self.step)
        if self.step[slot] != step:
            self.step[slot] = step
            self.activity_sum[slot], self.activity_n[slot], self.memory[slot] = 0.0, 0, -1
        if r.activity is not None and self.activity_n[slot] < 65535:
            self.activity_sum[slot] += r.activity
            self.activity_n[slot] += 1
        if r.memory_used_bytes is not None:
            self.memory[slot] = max(self.memory[slot], r.memory_used_bytes)

    def points(self, now: datetime) -> list[dict[str, Any]]:
        """The last hour, oldest first: each step's start, mean activity, peak memory."""
        last, slots = _step(now, self.step_s), len(self.step)
        points = []
        for slot in sorted(range(slots), key=lambda i: self.step[i]):
            step = self.step[slot]
            if step < 0 or not last - slots < step <= last:
                continue
            n, memory = self.activity_n[slot], self.memory[slot]
            points.append({
                "at": datetime(1970, 1, 1) + timedelta(seconds=step * self.step_s),
                "activity": round(self.activity_sum[slot] / n, 1) if n else None,
                "memory_used_bytes": memory if memory >= 0 else None})
        return points


class GpuReadings:
    """The readings of each server's open session; bounded per server and in all."""

    def __init__(self, max_servers: int = MAX_SERVERS, step_s: int = CHART_STEP_S) -> None:
        if not 1 <= step_s <= HOUR_S // 6:
            raise ValueError(f"the chart's step must be 1 to {HOUR_S // 6} seconds")
        self.max_servers, self.step_s = max_servers, step_s
        # insertion order = least recently pushed first (re-inserted on each push)
        self._by_server: dict[tuple[str, str], _Held] = {}

    def put(self, push: ReadingsPush, accepted: list[int | None]) -> None:
        """Keep the readings `accepted` names the open session of (per reading, its id);
        the others are of no open session, or of an earlier run of their server."""
        for r, session in zip(push.readings, accepted, strict=True):
            if session is None:
                continue
            key = (r.user, r.server)
            held = self._by_server.pop(key, None)
            if held is not None and held.session != session and held.run == r.started:
                held.session = session  # the same run goes on in a new session: one chart
            if held is None or held.session != session:
                held = _Held(session, r.started, self.step_s)  # a new run, a new chart
                while len(self._by_server) >= self.max_servers:
                    self._by_server.pop(next(iter(self._by_server)))
            held.add(r, push.interval_s)
            self._by_server[key] = held

    def of_session(self, user: str, server: str, session: int | None) -> _Held | None:
        """What is held of this server, if it is of `session` (None: no open session)."""
        held = self._by_server.get((user, server))
        return held if held is not None and session is not None \
            and held.session == session else None
