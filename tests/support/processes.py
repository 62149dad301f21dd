"""Processes in tests: stopping one a test started (SIGTERM, a grace period, then
SIGKILL), and reading another's memory."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, grace: float = 10) -> None:
    """Ask `proc` to stop; kill it if it has not exited after `grace` seconds. Reaped either
    way, so no zombie outlives the test."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def process_memory(pid: int) -> bytes:
    """Everything readable in a process's memory (as root)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
    return b"".join(chunks)
