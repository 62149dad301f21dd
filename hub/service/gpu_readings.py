"""GPU readings the idle culler pushes, validated, and the last hour of them in memory.

The culler reads each server's GPU (nvml, gpm, dcgm) on its pass and pushes
what it read (`PUT api/gpu-readings`, hub/service/api/gpu.py). Pure parts here:

- `parse_readings(body)`: every entry checked, every problem named by its
  field (`servers[3].activity`); one bad entry refuses the whole push, so
  nothing is half-written;
- `GpuReadings`: per (user, server) the readings of the last hour (a bounded
  deque) and the latest one, with its source and why it has no figure, for
  the researcher's status bar (`GET api/me/gpu`). Memory, not the database,
  like the pushed kernel state (activity_store.py): a restart forgets an hour
  of a chart, while each session's totals are kept in its row
  (gpulease/store/gpu_stats.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpulease.hub.service.activity_store import PushError
from gpulease.store.gpu_stats import GpuSample

SOURCES = ("nvml", "gpm", "dcgm", "")
ENTRY_KEYS = ("user", "server", "activity", "memory_used_bytes", "memory_total_bytes",
              "source", "why")
MAX_SERVERS_PER_PUSH = 5000  # ~200 bytes each: within the service's 1 MiB body bound
MAX_NAME = 255  # the sessions table's user_name and server_name
MAX_WHY = 500
MAX_BYTES = 2**63 - 1  # a BIGINT
HISTORY = timedelta(hours=1)
# One reading a pass: at a pass every 10 s, an hour is 360 of them; more are dropped oldest first.
MAX_HISTORY = 400
MAX_SERVERS = 200_000  # held in all; the servers not pushed for longest are forgotten first
_SHAPE = "A push is {\"servers\": [{user, server, activity, memory_used_bytes, " \
         "memory_total_bytes, source, why}]}"


@dataclass(frozen=True)
class GpuReading:
    """One server's GPU reading; `at` is when the service received it."""

    user: str
    server: str
    at: datetime
    activity: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    source: str
    why: str

    def sample(self) -> GpuSample:
        return GpuSample(self.user, self.server, self.activity, self.memory_used_bytes,
                         self.source)


def _name(entry: dict, key: str, where: str, errors: list[tuple[str, str]]) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        errors.append((f"{where}.{key}", "must be a string"))
        return ""
    if len(value) > MAX_NAME or "\x00" in value:
        errors.append((f"{where}.{key}", f"must be at most {MAX_NAME} characters, no NUL"))
    return value


def _activity(value: Any, where: str, errors: list[tuple[str, str]]) -> float | None:
    # json_loads reads 37.5 as a Decimal (exact); a bool is no number here.
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        errors.append((where, "must be a number of percent (0 to 100) or null"))
        return None
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= 100:
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


def parse_readings(body: Any, now: datetime) -> list[GpuReading]:
    """The push's readings; PushError(400) naming every problem, field by field."""
    if not isinstance(body, dict):
        raise PushError(400, _SHAPE, [("", "must be a JSON object")])
    errors: list[tuple[str, str]] = [(key, "unknown field; allowed: servers")
                                     for key in sorted(set(body) - {"servers"})]
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
        activity = _activity(entry.get("activity"), f"{where}.activity", errors)
        used = _bytes(entry.get("memory_used_bytes"), f"{where}.memory_used_bytes", errors)
        total = _bytes(entry.get("memory_total_bytes"), f"{where}.memory_total_bytes", errors)
        source = entry.get("source", "")
        if source not in SOURCES:
            errors.append((f"{where}.source", "must be one of nvml, gpm, dcgm or \"\""))
            source = ""
        why = entry.get("why", "")
        if not isinstance(why, str) or len(why) > MAX_WHY or "\x00" in why:
            errors.append((f"{where}.why", f"must be a string of at most {MAX_WHY} "
                                           "characters, no NUL"))
            why = ""
        readings.append(GpuReading(user, server, now, activity, used, total, source, why))
    if errors:
        first = f"{errors[0][0]}: {errors[0][1]}"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise PushError(400, f"Nothing was kept: {first}{more}", errors)
    return readings


def reading_view(r: GpuReading, iso: Any) -> dict[str, Any]:
    return {"activity": r.activity, "memory_used_bytes": r.memory_used_bytes,
            "memory_total_bytes": r.memory_total_bytes, "source": r.source, "why": r.why,
            "at": iso(r.at)}


class GpuReadings:
    """The last hour of each server's readings; bounded per server and in all."""

    def __init__(self, max_servers: int = MAX_SERVERS, max_history: int = MAX_HISTORY):
        self.max_servers = max_servers
        self.max_history = max_history
        # insertion order = least recently pushed first (re-inserted on each push)
        self._by_server: dict[tuple[str, str], deque[GpuReading]] = {}

    def put(self, readings: list[GpuReading]) -> None:
        for r in readings:
            key = (r.user, r.server)
            held = self._by_server.pop(key, None)
            if held is None:
                held = deque(maxlen=self.max_history)
                while len(self._by_server) >= self.max_servers:
                    self._by_server.pop(next(iter(self._by_server)))
            held.append(r)
            self._by_server[key] = held

    def latest(self, user: str, server: str) -> GpuReading | None:
        held = self._by_server.get((user, server))
        return held[-1] if held else None

    def history(self, user: str, server: str, now: datetime) -> list[GpuReading]:
        """The readings of the hour before `now`, oldest first (older ones dropped)."""
        held = self._by_server.get((user, server))
        if not held:
            return []
        while held and held[0].at < now - HISTORY:
            held.popleft()
        return list(held)
