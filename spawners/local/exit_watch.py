"""The moment a server's process ends, seen as it ends: its billing closes there.

The heartbeat sees a process gone only at its next pass, and a server that
died is billed up to the last time it was seen alive (never for the time the
hub took to notice). A server's own code can end it at any moment, so one
that ended between two passes had everything it did since the last one run
unbilled, up to a heartbeat interval each time it is started again. A pidfd
(Linux 5.3 and later) becomes readable when its process ends, zombie or not:
the event loop is told then, within its own latency.

A stop waits for the exit it caused in a thread (`wait_for_exit`), which
takes the time as the process ends: the session of a stopped server ends
there, not at JupyterHub's next backed-off look (on average ~0.5 s later).
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
from collections.abc import Callable
from datetime import datetime

from gpulease.core.clock import utcnow
from gpulease.spawners.own_thread import in_own_thread


def watch_exit(pid: int, ended: Callable[[datetime], None],
               pidfd: int | None = None) -> Callable[[], None]:
    """Call `ended(moment)` once, on the running loop, when process `pid` ends (or the
    process of `pidfd`, which this then owns); returns what stops watching
    (idempotent). Without pidfds (an old kernel) or for a process already reaped
    nothing is watched: the heartbeat notices."""
    try:
        fd = os.pidfd_open(pid) if pidfd is None else pidfd
    except (AttributeError, OSError):
        return lambda: None
    loop = asyncio.get_running_loop()
    open_fds = [fd]

    def stop() -> None:
        if open_fds:
            loop.remove_reader(open_fds[0])
            os.close(open_fds.pop())

    def on_exit() -> None:
        moment = utcnow()
        stop()
        ended(moment)

    loop.add_reader(fd, on_exit)
    return stop


_NOTIFYING: set[asyncio.Task] = set()  # the loop holds tasks only weakly


def watch_server_exit(spawner) -> Callable[[], None]:
    """Watch a LocalGPUSpawner's process from its launch: ended on its own
    (not by a stop), it is billed up to that moment, and JupyterHub is told now
    (`poll_and_notify`: the poll releases its devices and closes its session)
    rather than at its next poll, so that no heartbeat finds it "ready" but
    gone. Returns what stops watching."""
    proc = spawner.proc
    if proc is None or proc.poll() is not None:
        # Gone already (the heartbeat closes it). Not reaped while poll() says it
        # runs, so its pid cannot be another process's when the pidfd opens.
        return lambda: None

    def ended(moment: datetime) -> None:
        if spawner._stopping or spawner.proc is not proc:
            return  # a stop's own doing, or an older run
        meter = spawner.gpulease.meter
        if meter is not None:
            meter.mark_alive(spawner.user.name, spawner.name, moment)
        if getattr(spawner, "_gpulease_starting", False):
            # ended before it answered: its start fails, and closes its session at this
            # moment (or when what it left in its cgroup was ended)
            spawner._gpulease_exited_at = moment
            return
        task = asyncio.ensure_future(spawner.poll_and_notify())
        _NOTIFYING.add(task)
        task.add_done_callback(_NOTIFYING.discard)

    own = getattr(proc, "pidfd", None)  # a WarmChild: the launcher reaped it, not us
    if own is None:
        return watch_exit(proc.pid, ended)
    fd = own()
    return (lambda: None) if fd is None else watch_exit(proc.pid, ended, fd)


async def wait_for_exit(proc: subprocess.Popen, timeout: float) -> datetime | None:
    """When `proc` (our child) ended (UTC), taken in a thread that waits on it as it
    ends; None if it still runs after `timeout` seconds. For a stop: JupyterHub
    looks at backed-off, random intervals (0.1, 0.3, 0.7, 1.5 s ...)."""
    return await in_own_thread(lambda: _exit_time(proc, timeout), "gpulease-server-exit")


def _exit_time(proc: subprocess.Popen, timeout: float) -> datetime | None:
    # A pidfd turns readable the moment the process ends. Popen.wait(timeout)
    # instead polls with sleeps growing to 50 ms, and the end was stamped up
    # to that late (bench/billing.py saw 20-60 ms); it is the fallback only.
    if proc.poll() is not None:  # reaped already (a poll got there first): it ended by now
        return utcnow()
    own = getattr(proc, "pidfd", None)  # a WarmChild holds a pidfd of its very process
    try:  # not reaped (by us), so its pid is still its own
        fd = os.pidfd_open(proc.pid) if own is None else own()
    except (AttributeError, OSError):  # an old kernel
        fd = None
    if own is not None and fd is None:
        return utcnow()  # it ended as we looked
    if fd is not None:
        try:  # poll, not select: select refuses descriptors from 1024 on
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            ready = waiting.poll(None if timeout is None else max(0, timeout) * 1000)
        finally:
            os.close(fd)
        if not ready:
            return None
        ended = utcnow()
        proc.wait()  # reaps it (it has ended: at once)
        return ended
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    return utcnow()
