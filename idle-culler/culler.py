"""The culler's loop: list running servers, read their signals, decide, warn and suspend.

A pass makes a few requests whatever the number of servers: the hub's
users (paged), the gpulease service's profiles, inventory and the kernel
and terminal state the servers pushed (pushed.py). It never contacts a
user's server. CPU and GPU are sampled per server. Every failure is per
server: logged, never the end of the pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

import aiohttp

from gpulease.idle_culler.cpu import CpuSource
from gpulease.idle_culler.gpu import (
    DCGM_METRIC,
    GpuActivitySource,
    combine,
    no_gpu_reading,
    pod_label,
)
from gpulease.idle_culler.hubapi import HubClient, HubError, ProfileLimits, ServerInfo
from gpulease.idle_culler.metrics import CullerMetrics
from gpulease.idle_culler.pod_metrics import pod_of
from gpulease.idle_culler.policy import (
    KEEP,
    SUSPEND,
    Decision,
    ServerMemory,
    decide,
    observe,
)
from gpulease.idle_culler.pushed import (
    DEFAULT_STALE_AFTER_S,
    KernelView,
    PushedActivity,
    parse_server_activity,
    view_for,
)
from gpulease.idle_culler.readings import ReadingsLoop
from gpulease.idle_culler.signals import ServerSnapshot

log = logging.getLogger("gpulease.culler")
Key = tuple[str, str]


@dataclass(frozen=True)
class CullerConfig:
    interval_s: float = 30.0
    cpu_threshold: float = 10.0
    gpu_threshold: float = 5.0
    concurrency: int = 50  # CPU and GPU readings in flight
    # How long a server's pushed kernel state counts as current (pushed.py).
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    warn_before_s: int = 300
    # For a server whose profile no longer exists (deleted with force).
    default_limits: ProfileLimits = ProfileLimits(1800, 0)
    page_size: int = 200  # JupyterHub's api_page_max_limit caps pages at 200 by default
    # Seconds between GPU readings sent to the gpulease service (readings.py); 0: none.
    readings_interval_s: float = 10.0


class Notices(Protocol):
    """Where warnings and suspensions are announced (JupyterLab, hub banner, e-mail...)."""

    async def warn(self, user: str, server: str, decision: Decision) -> None: ...

    async def cancel(self, user: str, server: str) -> None: ...

    async def suspended(self, user: str, server: str, decision: Decision) -> None: ...


class LogNotices:
    async def warn(self, user: str, server: str, decision: Decision) -> None:
        log.info("notice to %s/%s: %s at %s", user, server, decision.action, decision.deadline)

    async def cancel(self, user: str, server: str) -> None:
        log.info("notice to %s/%s: cancelled, activity is back", user, server)

    async def suspended(self, user: str, server: str, decision: Decision) -> None:
        log.info("notice to %s/%s: stopped (%s)", user, server, decision.action)


@dataclass
class PassReport:
    decisions: dict[Key, Decision] = field(default_factory=dict)
    stops: dict[Key, int] = field(default_factory=dict)  # HTTP status of api/stop
    errors: dict[Key, str] = field(default_factory=dict)
    # How each server's kernels were known: fresh, stale, waiting, not_pushed, unknown.
    kernel_views: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def utcnow() -> datetime:
    return datetime.now(UTC)


class Culler:
    def __init__(self, hub: HubClient, cpu: CpuSource, gpu: GpuActivitySource, *,
                 notices: Notices | None = None, config: CullerConfig | None = None,
                 metrics: CullerMetrics | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.hub, self.cpu, self.gpu = hub, cpu, gpu
        self.watching_since = clock()  # servers started later are watched all their life
        self.notices = notices or LogNotices()
        self.config = config or CullerConfig()
        self.metrics = metrics or CullerMetrics()
        self.clock = clock
        self.memory: dict[Key, ServerMemory] = {}
        self.warned: dict[Key, str] = {}
        self.deadlines: dict[Key, datetime] = {}  # of the servers warned now
        self.profiles: dict[str, ProfileLimits] | None = None
        self.holders: dict[Key, list[str]] | None = None
        self.last_pass: tuple[datetime, PassReport] | None = None
        # What the servers pushed, as of the last read (None: it could not be read).
        self.pushed: PushedActivity | None = None
        self.pushed_error = "not read yet"
        # The running servers as of the last full pass (less those it stopped): what the
        # readings loop reads between passes without listing every user again.
        self.servers: list[ServerInfo] = []

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Passes until `stop`, with the readings loop beside them (its own task: a slow
        or failing gpulease service never delays a pass)."""
        readings = None
        if self.config.readings_interval_s > 0:
            readings = asyncio.create_task(ReadingsLoop(self).run_forever(stop))
        try:
            await self._passes(stop)
        finally:
            if readings is not None:
                readings.cancel()

    async def _passes(self, stop: asyncio.Event) -> None:
        next_full = time.monotonic()
        while not stop.is_set():
            due = self.due_warnings()
            try:
                if time.monotonic() >= next_full or not due:
                    next_full = time.monotonic() + self.config.interval_s
                    await self.run_pass()
                else:
                    await self.recheck(due)
            except (OSError, TimeoutError, aiohttp.ClientError, HubError) as e:
                # The hub down or restarting: nothing is decided in this pass.
                log.error("culler pass failed, the hub did not answer (%s: %s); next in %ss",
                          type(e).__name__, e, self.config.interval_s)
            except Exception:
                log.exception("culler pass failed; next one in %ss", self.config.interval_s)
            wait = self.next_wait(max(0.0, next_full - time.monotonic()))
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except TimeoutError:
                pass

    def next_wait(self, until_full_pass_s: float) -> float:
        """Seconds until the culler wakes: the next full pass, or just after a warned deadline.

        Without this a deadline that falls a fraction of a second after a pass
        would wait a whole interval more, and a suspend could come up to two
        intervals after its timeout. Waking for a deadline re-checks only the
        servers it is due for (`recheck`), not every server.
        """
        wait = until_full_pass_s
        now = self.clock()
        for deadline in self.deadlines.values():
            wait = min(wait, max(0.5, (deadline - now).total_seconds() + 0.5))
        return wait

    def due_warnings(self) -> list[Key]:
        now = self.clock()
        return sorted(key for key, deadline in self.deadlines.items() if deadline <= now)

    async def recheck(self, keys: list[Key]) -> PassReport:
        """Judge just these warned servers again, from their users' fresh hub models.

        Between full passes the deadlines of warned servers come due one by
        one; a pass over every server for each of them would read thousands
        of servers for a handful of decisions.
        """
        t0 = time.monotonic()
        report = PassReport()
        wanted = set(keys)
        limit = asyncio.Semaphore(self.config.concurrency)
        # Fresh pushes of just these users: one of them may have run a cell since the pass.
        await self._refresh_activity({u for u, _ in wanted})

        async def one_user(name: str) -> None:
            async with limit:
                try:
                    infos = await self.hub.user_servers(name)
                except Exception as e:  # the next full pass decides for this user
                    log.warning("culler: cannot re-read user %s (%s)", name, e)
                    return
                found = {info.key for info in infos}
                for key in [k for k in wanted if k[0] == name and k not in found]:
                    self._forget(key)  # stopped (or stopping) meanwhile
                for info in infos:
                    if info.key in wanted:
                        try:
                            await self._judge(info, report)
                        except Exception as e:
                            report.errors[info.key] = f"{type(e).__name__}: {e}"
                            log.exception("culler: cannot judge %s/%s", info.user, info.server)

        await asyncio.gather(*(one_user(name) for name in sorted({u for u, _ in wanted})))
        report.seconds = time.monotonic() - t0
        log.info("culler re-check of %d warned servers: %d stopped in %.2fs",
                 len(wanted), len(report.stops), report.seconds)
        return report

    def _forget(self, key: Key) -> None:
        self.memory.pop(key, None)
        self.warned.pop(key, None)
        self.deadlines.pop(key, None)

    async def run_pass(self) -> PassReport:
        t0 = time.monotonic()
        servers, _, _, _ = await asyncio.gather(
            self.hub.running_servers(self.config.page_size),
            self._refresh_profiles(), self._refresh_holders(), self._refresh_activity())
        report = PassReport()
        limit = asyncio.Semaphore(self.config.concurrency)

        async def one(info: ServerInfo) -> None:
            async with limit:
                try:
                    await self._judge(info, report)
                except Exception as e:  # one server's trouble never ends the pass
                    report.errors[info.key] = f"{type(e).__name__}: {e}"
                    log.exception("culler: cannot judge %s/%s", info.user, info.server)

        await asyncio.gather(*(one(s) for s in servers))
        alive = {s.key for s in servers} - set(report.stops)
        self.servers = [s for s in servers if s.key in alive]
        for key in (set(self.memory) | set(self.deadlines)) - alive:
            self._forget(key)
        self.cpu.forget(alive)
        self.metrics.forget(alive)
        report.seconds = time.monotonic() - t0
        self.last_pass = (self.clock(), report)
        self.metrics.pass_seconds.observe(report.seconds)
        self.metrics.last_pass.set(self.last_pass[0].timestamp())
        log.info("culler pass: %d servers, %d stopped, %d errors in %.2fs; kernels %s",
                 len(servers), len(report.stops), len(report.errors), report.seconds,
                 ", ".join(f"{k} {n}" for k, n in sorted(report.kernel_views.items())) or "-")
        return report

    async def _refresh_profiles(self) -> None:
        try:
            self.profiles = await self.hub.profiles()
        except Exception as e:
            log.warning("culler: cannot read the profiles (%s); %s", e,
                        "keeping the last ones" if self.profiles is not None else
                        "no server is stopped until they can be read")

    async def _refresh_activity(self, users: set[str] | None = None) -> None:
        """The servers' pushed kernel state: all of it, or just these users' (merged)."""
        try:
            fresh = parse_server_activity(await self.hub.server_activity(users))
        except Exception as e:
            self.pushed, self.pushed_error = None, f"{type(e).__name__}: {e}"[:200]
            log.warning("culler: cannot read the servers' pushed state (%s); nobody is "
                        "suspended until it can be read", self.pushed_error)
            return
        if users is not None and self.pushed is not None:
            merged = {k: v for k, v in self.pushed.servers.items() if k[0] not in users}
            fresh = PushedActivity(fresh.since, merged | fresh.servers)
        self.pushed, self.pushed_error = fresh, ""

    async def _refresh_holders(self) -> None:
        try:
            self.holders = await self.hub.holders()
        except Exception as e:
            log.debug("culler: no inventory (%s); devices from the servers' state only", e)

    def _devices(self, info: ServerInfo) -> list[str] | None:
        """The server's GPU devices; None when neither its state nor the inventory says."""
        from_state = (info.state or {}).get("gpulease_devices")
        if from_state:
            return list(from_state)
        if self.holders is not None and info.key in self.holders:
            return list(self.holders[info.key])
        if info.state is not None or self.holders is not None:
            return []
        return None

    def _kernel_view(self, info: ServerInfo) -> KernelView:
        return view_for(self.pushed, self.pushed_error, info.key, info.started, self.clock(),
                        self.config.stale_after_s)

    async def _pod_devices(self, pod: tuple[str, str],
                           limits: ProfileLimits) -> tuple[list[str] | None, str]:
        """A pod's GPU devices (the cluster shape): the series the GPU source labels with it.

        The profile says how many it holds: none, no reading; fewer series than
        that, the missing ones are unknown devices (a quiet card beside an
        unreadable one proves nothing, gpu.combine).
        """
        if limits.gpus == 0:
            return [], ""
        namespace, name = pod
        found = await self.gpu.pod_devices(namespace, name)
        if found is None:
            return None, self.gpu.describe(pod_label(namespace, name))
        if not found and limits.gpus is None:
            return None, (f"no {DCGM_METRIC} series of pod {namespace}/{name} "
                          "(its profile is unknown)")
        if not found:  # a GPU pod the exporter attributes nothing to: judged on the rest
            return None, no_gpu_reading(namespace, name)
        missing = range(len(found) + 1, (limits.gpus or 0) + 1)
        return [*found, *(f"GPU {i} of pod {namespace}/{name}" for i in missing)], ""

    def limits(self, info: ServerInfo) -> ProfileLimits:
        return (self.profiles or {}).get(info.profile, self.config.default_limits)

    async def devices_of(self, info: ServerInfo,
                         limits: ProfileLimits) -> tuple[list[str] | None, str]:
        """The server's GPU devices as a pass finds them ([]: none), or None and why not."""
        pod = pod_of(info.state)
        if pod is not None:  # the cluster shape: the state names a pod, not devices
            return await self._pod_devices(pod, limits)
        return self._devices(info), ""

    async def _snapshot(self, info: ServerInfo, view: KernelView) -> ServerSnapshot:
        """The server with all its signals: hub, pushed kernels and terminals, CPU, GPU."""
        limits = self.limits(info)
        devices, why = await self.devices_of(info, limits)
        cpu = await self.cpu.read(info.key, info.state)
        if devices:
            gpu, gpu_source = combine(self.gpu, await self.gpu.read(devices),
                                      self.config.gpu_threshold)
        else:
            gpu, gpu_source = None, why or (
                "devices of this server unknown" if devices is None else "none")
        return ServerSnapshot(
            user=info.user, server=info.server, profile=info.profile, started=info.started,
            hub_last_activity=info.last_activity, kernels=view.kernels,
            kernels_error=view.error, kernels_source=view.source,
            hub_activity_only=view.hub_activity_only,
            terminals_last_activity=view.terminals_last_activity, terminals_error=view.error,
            kernels_last_activity=view.kernels_last_activity,
            cpu_percent=cpu.percent, cpu_error=cpu.error,
            gpu_percent=gpu, gpu_source=gpu_source, has_gpu=devices != [],
            idle_timeout_s=limits.idle_timeout_s, max_runtime_s=limits.max_runtime_s,
            warn_before_s=self.config.warn_before_s,
        )

    def _decide(self, snap: ServerSnapshot, memory: ServerMemory) -> Decision:
        return decide(snap, memory, self.clock(), cpu_threshold=self.config.cpu_threshold,
                      gpu_threshold=self.config.gpu_threshold)

    async def _judge(self, info: ServerInfo, report: PassReport) -> None:
        view = self._kernel_view(info)
        report.kernel_views[view.kind] = report.kernel_views.get(view.kind, 0) + 1
        snap = await self._snapshot(info, view)
        c = self.config
        memory = observe(self.memory.get(info.key), snap, self.clock(),
                         cpu_threshold=c.cpu_threshold, gpu_threshold=c.gpu_threshold,
                         watching_since=self.watching_since)
        self.memory[info.key] = memory
        self.metrics.server(info.user, info.server, snap.cpu_percent, snap.gpu_percent)
        decision = self._decide(snap, memory)
        if view.hold and decision.action == SUSPEND:
            decision = replace(decision, action=KEEP,
                               reason=f"{decision.reason}; not suspending: {view.hold}")
        if self.profiles is None and decision.stops:
            decision = replace(decision, action=KEEP,
                               reason=decision.reason + "; profiles unknown: not stopping")
        report.decisions[info.key] = decision
        await self._act(info, snap, decision, report)

    async def _act(self, info: ServerInfo, snap: ServerSnapshot, decision: Decision,
                   report: PassReport) -> None:
        key, action = info.key, decision.action
        self.metrics.actions.labels(action=action).inc()
        level = logging.DEBUG if action == KEEP else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "%s %s: %s; idle since %s; signals %s", action, snap.label,
                    decision.reason, decision.idle_since, decision.signals)
        if decision.warns and decision.deadline is not None:
            self.deadlines[key] = decision.deadline
        else:  # kept, or stopped now (a failed stop is retried by the next full pass)
            self.deadlines.pop(key, None)
        if action == KEEP:
            if self.warned.pop(key, None):
                await self._notify(self.notices.cancel(info.user, info.server))
        elif decision.warns:
            if self.warned.get(key) != action:
                self.warned[key] = action
                await self._notify(self.notices.warn(info.user, info.server, decision))
        elif decision.stops:
            reason = "idle" if action == SUSPEND else "max_runtime"
            status = await self.hub.stop(info.user, info.server, reason)
            report.stops[key] = status
            if status < 300:
                await self._notify(self.notices.suspended(info.user, info.server, decision))
                self.warned.pop(key, None)
            elif status in (404, 409):
                log.info("%s was not running any more (HTTP %d)", snap.label, status)
            else:
                log.error("stopping %s (%s) failed: HTTP %d; retrying next pass",
                          snap.label, reason, status)

    async def _notify(self, call) -> None:
        try:
            await call
        except Exception:  # a failing webhook must not block a suspension
            log.exception("culler: a notice failed")
