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


# JupyterHub's own loop (tornado's IOLoop, closed by launch_instance) does not wait
# for the default executor, as asyncio.run does: a write still running in a thread
# when the hub's loop stopped (a heartbeat's ledger write waiting for a lock) is
# finished by Python's exit, which joins such threads before the atexit callbacks.
IN_FLIGHT_PROBE = """
import asyncio, sys, time
from gpulease.process_exit import end_process

def write():
    time.sleep(0.5)
    open(sys.argv[1], "w").write("written")

async def main():
    asyncio.get_running_loop().run_in_executor(None, write)
    await asyncio.sleep(0.05)

loop = asyncio.new_event_loop()
loop.run_until_complete(main())
loop.close()
end_process(0)
"""


def test_end_process_finishes_thread_work_in_flight_as_python_exit_does(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", IN_FLIGHT_PROBE, str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.exists() and out.read_text() == "written"
