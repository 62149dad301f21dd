"""A server's process tree: what it started, so that nothing outlives the server."""

from __future__ import annotations

from datetime import datetime

import psutil

from gpulease.core.clock import utcnow


def process_tree(pid: int) -> list[psutil.Process]:
    """The server's descendants (it may not be our child after a hub restart)."""
    if not pid:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def end_processes(procs: list[psutil.Process], grace_s: float = 3.0) -> int:
    """SIGTERM, then SIGKILL what is left after `grace_s`; how many were still there."""
    alive = []
    for proc in procs:
        try:
            proc.terminate()
            alive.append(proc)
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return len(alive)


def end_processes_at(procs: list[psutil.Process]) -> datetime | None:
    """`end_processes`; when it was done (UTC), if any of `procs` was still there."""
    return utcnow() if end_processes(procs) else None


def kill_tree(pid: int) -> int:
    """SIGKILL `pid` and every descendant it has now; how many were sent (its cgroup
    catches what forks in between)."""
    if not pid:
        return 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    sent = 0
    for proc in procs:
        try:
            proc.kill()
            sent += 1
        except psutil.Error:
            pass
    return sent
