"""End a gpulease process at once once its own cleanup is done.

Python's finalization of a process that imported JupyterHub, tornado,
SQLAlchemy and aiohttp takes 0.2-0.7 s (freeing every module, collecting
every cycle) and does nothing anyone sees: by then the hub has stopped its
services, servers and proxy and closed its database, and each service has
stopped serving. `gpulease up` is stopped at every restart, and a stopping
hub waits for each of its services in turn, so this is paid two or three
times over at each stop. What Python's exit still does that matters is done
here first, in its order: waiting for the threads still running (thread-pool
work in flight: JupyterHub's loop, unlike asyncio.run, does not wait for its
executor, so a write begun before the stop would otherwise be cut off), the
atexit callbacks, and flushing the logs and standard streams.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def end_process(code: int = 0) -> None:
    """Join the threads, run the atexit callbacks, flush, and leave with `code`,
    skipping finalization."""
    try:
        if threading.current_thread() is threading.main_thread():
            # What Python's exit does first: the threading atexits (thread pools stop
            # taking work and finish what they hold), then every non-daemon thread joined.
            threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or a pipe no one reads
                pass
    finally:
        os._exit(code)


async def exit_with_hub(hub_pid: int, stop: asyncio.Event, interval: float = 1.0) -> None:
    """End when the hub that started us is gone (killed without its cleanup).

    A SIGKILLed hub cannot stop its services; the next `gpulease up` starts a
    new one, so this one would linger forever holding the database open.
    """
    while not stop.is_set():
        if os.getppid() != hub_pid:
            log.warning("the hub (pid %d) is gone; this service stops too", hub_pid)
            stop.set()
            return
        await asyncio.sleep(interval)
