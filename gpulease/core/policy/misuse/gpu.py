"""Signal (c): the GPU held at full while no client used the server.

What a notebook service alone knows: who is using the notebook that keeps the GPU busy.
A miner runs the card flat out for hours with nobody at the notebook; so does a
researcher's training job started from a cell before they went home, which is why
this signal only ever warns (`decision` caps it at a warning, whatever the policy
says) and never suspends: suspension needs a process or network signal.

Inputs, all from outside the server:

- the GPU readings the culler takes (NVML, GPM or DCGM; the busiest of the server's
  devices at each reading, so a miner on one card of four still reads full);
- the last request the proxy routed to the server from a client (a browser tab's
  polls count: someone has the notebook open), or the server's start where none came.

Nothing the server pushes about itself (its kernels' activity, its own reports) is
evidence for sparing it: a miner could push whatever it likes.

`GpuWatch` follows the current run of full readings one reading at a time
(`observe_gpu`, constant work a reading); `unattended_gpu` says whether it and the
client's absence have both lasted `GpuRule.sustained_s`. `unattended_full_gpu` does
both over a list of readings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpulease.core.policy.misuse.evidence import GPU_RULE_ID, GPU_UNATTENDED, Signal


@dataclass(frozen=True)
class GpuRule:
    """The thresholds of signal (c)."""

    # "Full": a miner and a compute-bound training job both read 95-100 % of the card's
    # compute; 90 leaves room for readings' noise. A miner throttled below it (half the
    # card, to hide) is not seen here: the process and network signals are for that.
    busy_percent: float = 90.0
    # How long both the full GPU and the absence of clients must last: an hour. Honest
    # unattended runs last hours too, so this only sets how soon admins hear of one; an
    # hour keeps a researcher's lunch or meeting, with their job running, out of it.
    sustained_s: float = 3600.0
    # Readings further apart than this break a run (the culler reads every minute or
    # so): a gap is not known to have been full.
    max_gap_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.busy_percent <= 100:
            raise ValueError(f"busy_percent {self.busy_percent} must be in (0, 100]")
        if self.sustained_s <= 0 or self.max_gap_s <= 0:
            raise ValueError("sustained_s and max_gap_s must be positive")


@dataclass(frozen=True)
class GpuReading:
    at: float
    percent: float  # compute utilisation of the busiest device, 0-100


@dataclass(frozen=True)
class GpuWatch:
    """The current run of full readings: since when, the last reading's time, and the
    readings' count and sum over the run (for the mean the evidence shows)."""

    busy_since: float | None = None  # None: the last reading was not full
    last_at: float | None = None
    readings: int = 0
    total_percent: float = 0.0


def observe_gpu(watch: GpuWatch, reading: GpuReading, rule: GpuRule = GpuRule()) -> GpuWatch:
    """The watch after one more reading (readings in time order)."""
    if reading.percent < rule.busy_percent:
        return GpuWatch(None, reading.at)
    continuing = (watch.busy_since is not None and watch.last_at is not None
                  and reading.at - watch.last_at <= rule.max_gap_s)
    if not continuing:
        return GpuWatch(reading.at, reading.at, 1, reading.percent)
    return GpuWatch(watch.busy_since, reading.at, watch.readings + 1,
                    watch.total_percent + reading.percent)


def unattended_gpu(watch: GpuWatch, last_client_at: float | None, started_at: float,
                   now: float, rule: GpuRule = GpuRule()) -> Signal | None:
    """A GPU_UNATTENDED signal where the GPU has read full for `sustained_s` up to a
    recent reading and no client request has come for as long; else None."""
    if watch.busy_since is None or watch.last_at is None:
        return None
    if now - watch.last_at > rule.max_gap_s:  # the run's last reading is stale
        return None
    quiet_since = max(started_at, last_client_at) if last_client_at is not None else started_at
    if now - watch.busy_since < rule.sustained_s or now - quiet_since < rule.sustained_s:
        return None
    mean = watch.total_percent / watch.readings if watch.readings else 0.0
    return Signal(GPU_UNATTENDED, GPU_RULE_ID, now, (
        ("gpu_full_since_s_ago", f"{now - watch.busy_since:.0f}"),
        ("no_client_since_s_ago", f"{now - quiet_since:.0f}"),
        ("mean_percent", f"{mean:.1f}")))


def unattended_full_gpu(readings: Iterable[GpuReading], last_client_at: float | None,
                        started_at: float, now: float, rule: GpuRule = GpuRule()
                        ) -> Signal | None:
    """`unattended_gpu` over readings in time order (those after `now` ignored)."""
    watch = GpuWatch()
    for reading in readings:
        if reading.at > now:
            break
        watch = observe_gpu(watch, reading, rule)
    return unattended_gpu(watch, last_client_at, started_at, now, rule)
