"""end_process: what Python's exit does that matters is still done (gpulease/process_exit.py)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import atexit, logging, sys
from gpulease.process_exit import end_process
atexit.register(lambda: print("atexit ran", flush=False))
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
logging.getLogger("x").info("logged before the end")
sys.stdout.write("buffered, not flushed ")
end_process(3)
print("never")
"""


def test_end_process_runs_atexit_flushes_and_keeps_the_code(tmp_path):
    log = tmp_path / "log"
    done = subprocess.run([sys.executable, "-c", PROBE, str(log)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, not flushed atexit ran\n"
    assert "logged before the end" in log.read_text()
