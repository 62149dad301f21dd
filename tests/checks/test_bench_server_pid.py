"""bench/billing_servers.server_pid finds a server by the script servers run now
(`gpulease-singleuser`, spawners/local/process_spec.py), so `make bench` measures billing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is run from the clone's root, not installed

from bench.billing_servers import server_pid  # noqa: E402
from gpulease.singleuser import SERVER_SCRIPT  # noqa: E402


def test_server_pid_finds_a_server_started_through_gpulease_singleuser():
    # A stand-in process whose command line and environment are a server's. Python
    # keeps its whole argv in /proc/PID/cmdline for its life; `sh -c "sleep 30"` does
    # not (dash execs its last command, so the script's name went from the command
    # line whenever the lookup came after the exec, and CI failed on it).
    env = {**os.environ, "JUPYTERHUB_USER": "ada", "JUPYTERHUB_SERVER_NAME": "train"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                             f"/venv/bin/{SERVER_SCRIPT}"], env=env)
    # Popen returns once the exec closed its pipe, which the kernel does before it
    # lays the new argv and environment out: for a moment /proc shows neither (CI
    # read them empty once). A server the bench looks for started long before.
    deadline = time.monotonic() + 5
    try:
        while True:
            try:
                assert server_pid("ada", "train", [os.getpid(), proc.pid]) == proc.pid
                break
            except LookupError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
