"""When is a server idle? Pure functions over a ServerSnapshot and the culler's memory.

A server is idle only when every signal that could be read has been quiet
for its profile's idle timeout:

- hub: the last real user activity the hub recorded (browser, API, VS Code).
  It must reflect use, not an open tab's background polls (see the report in
  bench/culler.py and the deployment notes: the hub's proxy-based activity
  is switched off and the singleuser extension reports only real use);
- kernels: any busy kernel is activity now, clients or not; otherwise each
  kernel's last activity, and the last activity of any kernel shut down since
  (a kernel that ran a cell and was shut down between two pushes);
- terminals: their last activity;
- CPU: the last pass that saw the server's processes above the threshold;
- GPU: the last pass that saw compute utilisation above the threshold. GPU
  memory merely held (a loaded model) is not activity.

A signal that cannot be read is listed as 'unknown: why' and contributes
nothing, but a pass in which neither the kernels nor the CPU could be read
never suspends: nothing on the server's side confirms the idleness. Nor
does one in which a GPU server's GPU and CPU both could not be read (the
cluster shape without a metrics server while Prometheus is down): kernels
do not see a process started outside them, and only those two would. The
kernels and terminals are what the server pushed (idle-culler/pushed.py);
a server that pushes nothing (an image without gpulease.singleuser) is
judged on the hub's activity instead, which then confirms, and its kernels
are listed as 'not pushed: hub activity only'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpulease.idle_culler.signals import ServerSnapshot, default_warn_before

KEEP, WARN, SUSPEND = "keep", "warn", "suspend"
MAX_RUNTIME_WARN, STOP_MAX_RUNTIME = "max_runtime_warn", "stop_max_runtime"
ACTIONS = (KEEP, WARN, SUSPEND, MAX_RUNTIME_WARN, STOP_MAX_RUNTIME)
# Kernels in these states are running code (or about to): activity now.
_ACTIVE_KERNEL_STATES = frozenset({"busy", "starting"})


@dataclass(frozen=True)
class ServerMemory:
    """What the culler remembers of one server between passes.

    CPU and GPU are sampled, not recorded by the server, so their history is
    only what this culler process has seen. It starts at `first_seen`, and
    no server counts as idle from before then: after a culler restart a
    server needs a whole timeout of quiet first, so a restart cannot make a
    busy server look long idle.
    """

    first_seen: datetime
    started: datetime  # a different start time means a new server of the same name
    cpu_active_at: datetime | None = None
    gpu_active_at: datetime | None = None


@dataclass(frozen=True)
class Decision:
    action: str
    idle_since: datetime | None  # None: active now
    idle_for_s: float
    deadline: datetime | None  # when the server will be stopped if nothing changes
    signals: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    @property
    def stops(self) -> bool:
        return self.action in (SUSPEND, STOP_MAX_RUNTIME)

    @property
    def warns(self) -> bool:
        return self.action in (WARN, MAX_RUNTIME_WARN)


def observe(
    memory: ServerMemory | None,
    snapshot: ServerSnapshot,
    now: datetime,
    *,
    cpu_threshold: float = 10.0,
    gpu_threshold: float = 5.0,
    watching_since: datetime | None = None,
) -> ServerMemory:
    """The memory after this pass's readings (fresh for a server not seen before).

    A server that started while this culler was already watching has been in
    view all its life (but for the moments before the next pass, when its
    JupyterLab is still starting): its quiet counts from its start. Only
    servers found running when the culler (re)started count from first sight.
    """
    if memory is None or memory.started != snapshot.started:
        watched = watching_since is not None and snapshot.started >= watching_since
        memory = ServerMemory(first_seen=snapshot.started if watched else now,
                              started=snapshot.started)
    cpu_busy = snapshot.cpu_percent is not None and snapshot.cpu_percent > cpu_threshold
    gpu_busy = snapshot.has_gpu and snapshot.gpu_percent is not None and (
        snapshot.gpu_percent > gpu_threshold)
    if not (cpu_busy or gpu_busy):
        return memory
    return ServerMemory(memory.first_seen, memory.started,
                        now if cpu_busy else memory.cpu_active_at,
                        now if gpu_busy else memory.gpu_active_at)


def decide(
    snapshot: ServerSnapshot,
    state: ServerMemory,
    now: datetime,
    *,
    cpu_threshold: float = 10.0,
    gpu_threshold: float = 5.0,
) -> Decision:
    """What to do with one server now; `state` is the memory `observe` returned."""
    signals: dict[str, str] = {}
    # Nothing counts as quiet from before this culler first saw the server:
    # sampled signals (CPU, GPU) have no history from before, and one may be
    # unreadable in the first pass after a restart while a script is busy.
    quiet_since: list[datetime] = [snapshot.started, state.first_seen]
    active_now: list[str] = []

    hub = snapshot.hub_last_activity
    signals["hub"] = _ts(hub) if hub else "no activity recorded"
    if hub:
        quiet_since.append(hub)

    if snapshot.hub_activity_only:
        signals["kernels"] = f"not pushed: hub activity only; {snapshot.kernels_error}"
    elif snapshot.kernels is None:
        signals["kernels"] = f"unknown: {snapshot.kernels_error or 'not read'}"
    else:
        busy = [k.id for k in snapshot.kernels if k.execution_state in _ACTIVE_KERNEL_STATES]
        times = [k.last_activity for k in snapshot.kernels if k.last_activity]
        if snapshot.kernels_last_activity:  # a kernel shut down since counts too
            times.append(snapshot.kernels_last_activity)
        if busy:
            active_now.append("kernels")
        if times:
            quiet_since.append(max(times))
        signals["kernels"] = _kernels_text(snapshot, len(busy), max(times) if times else None)
        if snapshot.kernels_source:
            signals["kernels"] += f"; {snapshot.kernels_source}"

    if snapshot.hub_activity_only:
        signals["terminals"] = "not pushed: hub activity only"
    elif snapshot.terminals_error:
        signals["terminals"] = f"unknown: {snapshot.terminals_error}"
    elif snapshot.terminals_last_activity:
        signals["terminals"] = f"last activity {_ts(snapshot.terminals_last_activity)}"
        quiet_since.append(snapshot.terminals_last_activity)
    else:
        signals["terminals"] = "none"

    cpu = snapshot.cpu_percent
    if cpu is None:
        signals["cpu"] = f"unknown: {snapshot.cpu_error or 'not read'}"
    else:
        signals["cpu"] = f"{cpu:.1f}% of one core (threshold {cpu_threshold:g}%)"
        if cpu > cpu_threshold:
            active_now.append("cpu")
        quiet_since.append(state.cpu_active_at or state.first_seen)

    gpu = snapshot.gpu_percent
    if not snapshot.has_gpu:
        signals["gpu"] = "no gpu"
    elif gpu is None:
        signals["gpu"] = f"unknown: {snapshot.gpu_source or 'not read'}"
    else:
        signals["gpu"] = (f"{gpu:.1f}% compute via {snapshot.gpu_source} "
                          f"(threshold {gpu_threshold:g}%)")
        if gpu > gpu_threshold:
            active_now.append("gpu")
        quiet_since.append(state.gpu_active_at or state.first_seen)

    idle_since = None if active_now else max(quiet_since)
    idle_for = 0.0 if idle_since is None else max(0.0, (now - idle_since).total_seconds())
    unconfirmed = ""
    if not (snapshot.kernels is not None or cpu is not None or snapshot.hub_activity_only):
        unconfirmed = "neither kernels nor CPU could be read"
    elif snapshot.has_gpu and gpu is None and cpu is None:
        # Kernels say nothing of a process started outside them (a training script
        # run from a terminal in the background); only CPU and GPU see it.
        unconfirmed = "neither GPU nor CPU could be read"
    return _choose(snapshot, now, idle_since, idle_for, active_now, unconfirmed, signals)


def _choose(
    snap: ServerSnapshot,
    now: datetime,
    idle_since: datetime | None,
    idle_for: float,
    active_now: list[str],
    unconfirmed: str,  # why the idleness is not confirmed; "": it is
    signals: dict[str, str],
) -> Decision:
    """The strongest applicable action: max-runtime stop, idle suspend, then the warnings."""
    timeout, max_runtime = snap.idle_timeout_s, snap.max_runtime_s
    idle_deadline = idle_since + timedelta(seconds=timeout) if idle_since and timeout else None
    run_deadline = snap.started + timedelta(seconds=max_runtime) if max_runtime else None
    deadlines = [d for d in (idle_deadline, run_deadline) if d is not None]
    deadline = min(deadlines) if deadlines else None

    def decision(action: str, reason: str, when: datetime | None = deadline) -> Decision:
        return Decision(action, idle_since, idle_for, when, signals, reason)

    runtime = (now - snap.started).total_seconds()
    if run_deadline is not None and runtime >= max_runtime:
        return decision(STOP_MAX_RUNTIME, f"ran {runtime:.0f}s >= max_runtime {max_runtime}s",
                        run_deadline)
    idle_text = f"idle for {idle_for:.0f}s (timeout {timeout}s)"
    if idle_deadline is not None and idle_for >= timeout:
        if not unconfirmed:
            return decision(SUSPEND, idle_text, idle_deadline)
        idle_text += f"; not suspending: {unconfirmed}"
    elif idle_deadline is not None and not unconfirmed and (
        idle_for >= timeout - default_warn_before(timeout, snap.warn_before_s)
    ):
        if run_deadline is None or idle_deadline <= run_deadline:
            return decision(WARN, idle_text + "; suspending at the deadline", idle_deadline)
    if run_deadline is not None and runtime >= max_runtime - default_warn_before(
        max_runtime, snap.warn_before_s
    ):
        return decision(MAX_RUNTIME_WARN, f"running {runtime:.0f}s of max_runtime {max_runtime}s",
                        run_deadline)
    if active_now:
        return decision(KEEP, "active now: " + ", ".join(active_now))
    if not timeout:
        return decision(KEEP, "idle_timeout 0: never idle-suspended")
    return decision(KEEP, idle_text)


def _kernels_text(snap: ServerSnapshot, busy: int, last: datetime | None) -> str:
    kernels = snap.kernels or ()
    if not kernels:
        return "none running" + (f", last activity {_ts(last)}" if last else "")
    clients = sum(k.connections for k in kernels)
    text = f"{len(kernels)} kernel(s), {busy} busy, {clients} client(s)"
    return text + (f", last activity {_ts(last)}" if last else "")


def _ts(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
