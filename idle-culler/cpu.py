"""CPU activity of a server: percent of one core since the previous pass.

`CpuSource` is the interface; the embedded shape samples the server's
process tree with psutil (its pid is in the spawner's state, which the hub
shows to a token with `admin:server_state`). The cluster shape reads the
pod's usage from the metrics API behind the same interface (pod_metrics.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

import psutil


@dataclass(frozen=True)
class CpuReading:
    percent: float | None  # of one core; None: unknown
    error: str = ""


@dataclass(frozen=True)
class TreeSample:
    """Cumulative CPU seconds of a process tree at one moment."""

    pid: int
    create_time: float  # tells a reused pid from the same process
    wall: float  # time.monotonic()
    cpu_s: float


class CpuSource(Protocol):
    async def read(self, key: tuple[str, str], state: dict[str, Any] | None) -> CpuReading: ...

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop what is remembered of servers not in `keep` (stopped since)."""


def percent_between(before: TreeSample, after: TreeSample) -> float | None:
    """Percent of one core used between two samples of the same tree."""
    if before.pid != after.pid or before.create_time != after.create_time:
        return None
    elapsed = after.wall - before.wall
    if elapsed <= 0:
        return None
    # A child that exited unreaped between samples takes its seconds with it:
    # the sum can shrink. Shrinking is not negative work.
    return max(0.0, after.cpu_s - before.cpu_s) / elapsed * 100.0


def sample_tree(pid: int) -> TreeSample:
    """Sum user+system time of the process and all its descendants (psutil).

    children_user/children_system add the children already exited and reaped
    (a `make -j` or a finished subprocess) so their work is not lost.
    """
    root = psutil.Process(pid)
    create_time = root.create_time()
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone between the listing and the read
        total += t.user + t.system + t.children_user + t.children_system
    return TreeSample(pid, create_time, time.monotonic(), total)


class ProcessTreeCpuSource:
    """Embedded shape: the server's local process tree, from the pid in its state."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], TreeSample] = {}

    async def read(self, key: tuple[str, str], state: dict[str, Any] | None) -> CpuReading:
        pid = (state or {}).get("pid")
        if not isinstance(pid, int) or pid <= 0:
            why = "no server state (needs admin:server_state)" if state is None else \
                "no pid in the server's state"
            return CpuReading(None, why)
        try:
            sample = await asyncio.to_thread(sample_tree, pid)
        except psutil.NoSuchProcess:
            self.samples.pop(key, None)
            return CpuReading(None, f"process {pid} not found")
        except psutil.Error as e:
            return CpuReading(None, f"cannot read process {pid}: {e}")
        before = self.samples.get(key)
        self.samples[key] = sample
        if before is None:
            return CpuReading(None, "first sample (a percent needs two)")
        percent = percent_between(before, sample)
        if percent is None:
            return CpuReading(None, f"process {pid} is new since the last sample")
        return CpuReading(percent)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        for key in set(self.samples) - keep:
            del self.samples[key]


class StaticCpuSource:
    """A test double behind the real interface: percentages set by the test."""

    def __init__(self, values: dict[tuple[str, str], float | None] | None = None,
                 default: float | None = 0.0) -> None:
        self.values = dict(values or {})
        self.default = default

    async def read(self, key: tuple[str, str], state: dict[str, Any] | None) -> CpuReading:
        value = self.values.get(key, self.default)
        return CpuReading(value, "" if value is not None else "set unknown by the test")

    def forget(self, keep: set[tuple[str, str]]) -> None:
        pass


class NoCpuSource:
    async def read(self, key: tuple[str, str], state: dict[str, Any] | None) -> CpuReading:
        return CpuReading(None, "no CPU source configured")

    def forget(self, keep: set[tuple[str, str]]) -> None:
        pass
