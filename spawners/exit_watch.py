"""The moment a server's process ends, seen as it ends: its billing closes there.

The heartbeat sees a process gone only at its next pass, and a server that
died is billed up to the last time it was seen alive (never for the time the
hub took to notice). A server's own code can end it at any moment, so one
that ended between two passes had everything it did since the last one run
unbilled, up to a heartbeat interval each time it is started again. A pidfd
(Linux 5.3 and later) becomes readable when its process ends, zombie or not:
the event loop is told then, within its own latency.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import datetime

from gpulease.hub.db import utcnow


def watch_exit(pid: int, ended: Callable[[datetime], None]) -> Callable[[], None]:
    """Call `ended(moment)` once, on the running loop, when process `pid` ends;
    returns what stops watching (idempotent). Without pidfds (an old kernel) or
    for a process already reaped nothing is watched: the heartbeat notices."""
    try:
        fd = os.pidfd_open(pid)
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
    """Watch a LocalGPUSpawner's process from its first answer: ended on its own
    (not by a stop), it is billed up to that moment, and JupyterHub is told now
    (`poll_and_notify`: the poll releases its devices and closes its session)
    rather than at its next poll, so that no heartbeat finds it "ready" but
    gone. Returns what stops watching."""
    proc = spawner.proc
    if proc is None:
        return lambda: None

    def ended(moment: datetime) -> None:
        if spawner._stopping or spawner.proc is not proc:
            return  # a stop's own doing, or an older run
        meter = spawner.gpulease.meter
        if meter is not None:
            meter.mark_alive(spawner.user.name, spawner.name, moment)
        task = asyncio.ensure_future(spawner.poll_and_notify())
        _NOTIFYING.add(task)
        task.add_done_callback(_NOTIFYING.discard)

    return watch_exit(proc.pid, ended)
