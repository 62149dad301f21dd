"""The readings loop: every running GPU server's activity and memory, to the gpulease service.

Every `readings_interval_s` (10 s) it reads the servers of the culler's last full pass
(no listing of every user again: a server started since is read from the next pass on)
through the culler's own GPU source and device lookup (`Culler.devices_of`), and sends
one batch (of up to 5,000 servers), `PUT api/gpu-readings`, which the service folds
into each server's open billing session (mean and peak activity, peak memory) and shows
its researcher. Each line names the server's start as the hub lists it (`started`): the
pass's list may be a pass old, and a server stopped and started again since holds other
devices, so the service folds a line only into the session of the start it was read for.

Nothing here decides anything, and a reading never feeds a decision: a failing service
is logged once per outage and the passes go on. A value that cannot be read is null
with why, never an estimate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

from gpulease.idle_culler.gpu import GpuActivitySource, combine
from gpulease.idle_culler.hubapi import ServerInfo

if TYPE_CHECKING:
    from gpulease.idle_culler.culler import Culler

log = logging.getLogger("gpulease.culler")
SOURCES = ("nvml", "gpm", "dcgm")  # what api/gpu-readings takes as a reading's source
# The service refuses a whole push for one entry's `why` over 500 characters, and takes
# at most 5,000 servers a push (docs/rest-api.yml, GpuReadingInput).
MAX_WHY, MAX_BATCH = 500, 5000


@dataclass(frozen=True)
class GpuReading:
    """One server's line of the batch, as `PUT api/gpu-readings` takes it."""

    user: str
    server: str
    started: str  # the server's start, as the hub's users API lists it (ISO 8601 UTC)
    activity: float | None  # the mean over its devices, 0..100 (None: any device unread)
    memory_used_bytes: int | None  # summed over its devices
    memory_total_bytes: int | None
    source: str  # of the activity: nvml, gpm, dcgm; '' where none (or a test double)
    why: str  # why a value is null; '' where none is

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"why": self.why[:MAX_WHY]}


def _started(info: ServerInfo) -> str:
    return info.started.astimezone(UTC).isoformat().replace("+00:00", "Z")


def mean_activity(activity: dict[str, float | None]) -> float | None:
    """The mean over the server's devices; None unless every device was read.

    Not the idleness signal (`combine`: the busiest device decides there): what a
    session used of its GPUs is their mean, and an unread device could be anything,
    so a mean over the devices read would be biased either way."""
    if not activity or any(v is None for v in activity.values()):
        return None
    return sum(v for v in activity.values() if v is not None) / len(activity)


def server_reading(info: ServerInfo, source: GpuActivitySource,
                   activity: dict[str, float | None],
                   memory: dict[str, tuple[int, int] | None], threshold: float) -> GpuReading:
    """A server's reading from its devices' values.

    Activity is the mean over its devices (`mean_activity`), its source named as a
    pass names it (`combine`). Memory is the sum of used and of total, and only where
    every device was read: a partial sum would understate it.
    """
    value = mean_activity(activity)
    _, said = combine(source, activity, threshold)
    whys = [] if value is not None else [
        "; ".join(f"{u}: {source.describe(u)}" for u, v in activity.items() if v is None)
        or said]
    unread = [u for u in memory if memory[u] is None]
    used = total = None
    if memory and not unread:
        used = sum(m[0] for m in memory.values() if m is not None)
        total = sum(m[1] for m in memory.values() if m is not None)
    else:
        whys.append("memory: " + ("; ".join(f"{u}: {source.describe_memory(u)}" for u in unread)
                                  or "no devices found for this server"))
    return GpuReading(info.user, info.server, _started(info), value, used, total,
                      said if value is not None and said in SOURCES else "", "; ".join(whys))


def no_reading(info: ServerInfo, why: str) -> GpuReading:
    return GpuReading(info.user, info.server, _started(info), None, None, None, "", why)


class ReadingsLoop:
    """Reads and sends the batch every `culler.config.readings_interval_s` seconds."""

    def __init__(self, culler: Culler) -> None:
        self.culler = culler
        # The pass's source where reading it changes nothing a pass reads next (a cached
        # Prometheus query is shared); NVML's GPM keeps its own samples (gpu.for_readings).
        self.gpu = culler.gpu.for_readings()
        self.failing = ""  # the outage being logged: one warning for it, not one a tick

    async def run_forever(self, stop: asyncio.Event) -> None:
        interval = self.culler.config.readings_interval_s
        while not stop.is_set():
            started = time.monotonic()
            await self.tick()
            try:
                await asyncio.wait_for(stop.wait(),
                                       max(0.01, interval - (time.monotonic() - started)))
            except TimeoutError:
                pass

    async def tick(self) -> bool:
        """One batch read and sent; False where it was not taken (logged once an outage)."""
        try:
            readings = [r.as_json() for r in await self.collect()]
            for i in range(0, len(readings), MAX_BATCH):
                await self.culler.hub.put_gpu_readings(
                    readings[i:i + MAX_BATCH], self.culler.config.readings_interval_s)
        except Exception as e:  # the service down, refusing, or a bug: the passes go on
            error = f"{type(e).__name__}: {e}"[:200]
            if not self.failing:
                log.warning("culler: GPU readings not taken by the gpulease service (%s); "
                            "retrying every %ss, quietly", error,
                            self.culler.config.readings_interval_s)
            self.failing = error
            return False
        if self.failing:
            log.info("culler: GPU readings taken again (after %s)", self.failing)
            self.failing = ""
        return True

    async def collect(self) -> list[GpuReading]:
        """The readings of the last pass's servers that hold or may hold a GPU."""
        limit = asyncio.Semaphore(self.culler.config.concurrency)
        # A copy: the next pass replaces the list while these reads are in flight.
        servers = list(self.culler.servers)

        async def one(info: ServerInfo) -> GpuReading | None:
            async with limit:
                try:
                    return await self.read(info)
                except Exception as e:  # one server's trouble is its line's, not the batch's
                    log.debug("culler: no GPU reading of %s/%s", info.user, info.server,
                              exc_info=True)
                    return no_reading(info, f"{type(e).__name__}: {e}"[:200])

        found = await asyncio.gather(*(one(s) for s in servers))
        return [r for r in found if r is not None]

    async def read(self, info: ServerInfo) -> GpuReading | None:
        """A server's reading; None for a server known to hold no GPU."""
        culler = self.culler
        limits = culler.limits(info)
        devices, why = await culler.devices_of(info, limits)
        # The devices a pass finds decide (an embedded server's state names them whatever
        # its profile says); the profile only where they cannot be found.
        if devices == [] or (devices is None and limits.gpus == 0):
            return None
        if devices is None:
            return no_reading(info, why or "devices of this server unknown")
        activity, memory = await asyncio.gather(self.gpu.read(devices),
                                                self.gpu.read_memory(devices))
        return server_reading(info, self.gpu, activity, memory, culler.config.gpu_threshold)
