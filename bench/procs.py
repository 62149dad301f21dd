"""Process hygiene shared by the benchmarks: find what a hub started, end it, clean up.

Linux /proc only; elsewhere nothing is found, so nothing is signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): its identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (Linux /proc; empty elsewhere)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


class Children:
    """Processes a hub started (servers, proxy, service): noted while the hub lives,
    so that what a stopped or SIGKILLed hub left behind is still ended at the close.
    A pid is signalled only while its start time is the one noted (never a reused pid)."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}

    def note(self, root: int) -> None:
        for pid in descendants(root):
            started = _start_time(pid)
            if started is not None:
                self.seen[pid] = started

    def _ours(self) -> list[int]:
        return [pid for pid, started in self.seen.items() if _start_time(pid) == started]

    def reap(self) -> None:
        """SIGTERM, then SIGKILL, whatever noted process is still alive, 5 s for each."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = self._ours()
            for pid in alive:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while alive and time.monotonic() < deadline:
                time.sleep(0.1)
                alive = self._ours()
            if not alive:
                return


@contextmanager
def interrupts_clean_up() -> Iterator[None]:
    """Ctrl-C (SIGINT) and `kill PID` (SIGTERM) both raise KeyboardInterrupt, which cleans up.

    SIGINT is set explicitly: started in the background by a script, Python
    inherits it ignored and would never stop. Once one arrives, further ones
    are ignored so that the clean-up itself is not cut short.
    """

    def handler(signum: int, frame: Any) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def save_logs(tmp: Path, logs: Path, *folders: str) -> None:
    """Copy the `*.log` files of each of `folders` (under `tmp`) to `logs`.

    With one folder the files keep their names; with several, each is named
    `FOLDER-NAME` so that the hubs' logs do not overwrite one another.
    """
    logs.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for log in (tmp / folder).glob("*.log"):
            name = log.name if len(folders) == 1 else f"{folder}-{log.name}"
            shutil.copy(log, logs / name)
    print(f"hub logs copied to {logs}", flush=True)
