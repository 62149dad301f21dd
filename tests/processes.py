"""Stopping a process a test started: SIGTERM, a grace period, then SIGKILL."""

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
