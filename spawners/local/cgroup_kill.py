"""Ending everything in a server's cgroup, including what keeps forking to new pids.

Reading `cgroup.procs` and killing those pids once is not enough: a process
that forks a child and exits, over and over, is always one step ahead of a
list read a moment ago. So, by what the host offers:

- cgroup v2: `cgroup.kill` (Linux 5.14+) kills every process of the cgroup
  and any forked while it runs, in the kernel, at once;
- cgroup v1 with a `freezer` hierarchy: freeze the cgroup (no process runs,
  so none forks), SIGKILL every member, thaw: each dies on its way back to
  user space, before it can fork again;
- otherwise: read and SIGKILL, round after round, until no pid is left.

In every case the cgroup counts as empty only when its `cgroup.procs` lists
no pid (zombies are not listed: they hold no device, no memory). A cgroup
that still has members at the deadline (a process in uninterruptible sleep
on a hung driver or file system) is reported, and its devices stay out of
service (gpulease.spawners.local.quarantine) until it empties.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

FREEZE_WAIT_S = 1.0  # how long one round waits for FREEZING to become FROZEN


@dataclass(frozen=True)
class Emptied:
    """What ending a cgroup's processes came to."""

    kind: str  # "cgroup1" | "cgroup2" | "systemd"
    unit: str
    dirs: tuple[str, ...]  # the cgroup folders looked at
    how: str  # "cgroup.kill" | "freezer" | "signals" | "nothing left"
    killed: int  # SIGKILLs sent (cgroup.kill counts as one)
    left: tuple[int, ...]  # pids still in the cgroup at the deadline; () = empty
    # Who to look for outside the cgroup: {"uid", "device_nodes"} (device_holders).
    holding: dict = field(default_factory=dict, compare=False)
    # Processes still there when ending began (0: the server's own exit was its
    # end; else its billing runs until they were ended).
    found: int = 0

    @property
    def empty(self) -> bool:
        return not self.left

    def state(self) -> dict:
        """The cgroup as spawner state / an out-of-service record keeps it (isolation.cleanup)."""
        return {"kind": self.kind, "unit": self.unit, "dirs": list(self.dirs), **self.holding}

    def describe(self) -> str:
        where = ", ".join(self.dirs) or self.unit or "its cgroup"
        if self.empty:
            return f"{where}: empty ({self.how}, {self.killed} kill(s))"
        pids = ", ".join(map(str, self.left[:20])) + (" …" if len(self.left) > 20 else "")
        return (f"{where}: {len(self.left)} process(es) still there after {self.how} "
                f"(pids {pids})")


def devices_may_go(emptied: Emptied | None) -> bool:
    """A server's devices go back to the pool only when nothing of it is left.

    None: the server had no cgroup (no limits on this host); its process tree
    was ended and that is all gpulease can know.
    """
    return emptied is None or emptied.empty


def cgroup_pids(dirs: Iterable[str]) -> set[int]:
    pids: set[int] = set()
    for folder in dirs:
        try:
            pids |= {int(x) for x in Path(folder, "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            pass
    return pids


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def _freeze(freezers: list[str], sleep: Callable[[float], None],
            clock: Callable[[], float]) -> None:
    for folder in freezers:
        _write(f"{folder}/freezer.state", "FROZEN")
    until = clock() + FREEZE_WAIT_S
    for folder in freezers:
        while clock() < until:
            try:
                if Path(folder, "freezer.state").read_text().strip() == "FROZEN":
                    break
            except OSError:
                break
            sleep(0.01)


def empty_cgroup(
    kind: str, unit: str, dirs: Iterable[str], wait_s: float = 5.0, *,
    kill: Callable[[int, int], None] = os.kill,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Emptied:
    """SIGKILL everything in `dirs` until they are empty or `wait_s` has passed."""
    dirs = tuple(dirs)
    kill_files = [f"{d}/cgroup.kill" for d in dirs if os.path.exists(f"{d}/cgroup.kill")]
    freezers = [d for d in dirs if os.path.exists(f"{d}/freezer.state")]
    how = "cgroup.kill" if kill_files else "freezer" if freezers else "signals"
    deadline = clock() + wait_s
    found = len(cgroup_pids(dirs))
    killed = 0
    first = True
    while True:
        if kill_files:
            # In the kernel: every member, and whatever is forked meanwhile.
            if any([_write(path, "1") for path in kill_files]):
                killed += 1
        if freezers:
            _freeze(freezers, sleep, clock)
        pids = cgroup_pids(dirs)
        if first and not pids and not killed:
            how = "nothing left"
        first = False
        for pid in sorted(pids):
            try:
                kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        if freezers:  # the frozen die as they thaw, before they can fork again
            for folder in freezers:
                _write(f"{folder}/freezer.state", "THAWED")
        if not pids or clock() >= deadline:
            break
        sleep(0.02)
    # SIGKILLed processes take a moment to leave the cgroup.
    while True:
        left = cgroup_pids(dirs)
        if not left or clock() >= deadline:
            break
        sleep(0.02)
    return Emptied(kind, unit, dirs, how, killed, tuple(sorted(left)), found=found)


def remove_dirs(dirs: Iterable[str], wait_s: float = 2.0) -> list[str]:
    """rmdir the (empty) cgroup folders; returns those that could not be removed yet."""
    deadline = time.monotonic() + wait_s
    stuck = []
    for folder in dirs:
        while True:
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    stuck.append(folder)
                    break
                time.sleep(0.05)
    return stuck
