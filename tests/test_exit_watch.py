"""watch_exit: the moment a process ends, told on the event loop as it ends."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from gpulease.hub.db import utcnow
from gpulease.spawners.exit_watch import watch_exit


def test_the_end_of_a_process_is_told_at_once_and_only_once():
    async def scenario():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
        seen: list = []
        done = asyncio.Event()
        stop = watch_exit(proc.pid, lambda moment: (seen.append(moment), done.set()))
        await asyncio.wait_for(done.wait(), 10)
        ended = utcnow()
        assert proc.wait(5) == 0
        stop()  # after the fact: nothing more, no error
        await asyncio.sleep(0.05)
        return seen, ended

    seen, ended = asyncio.run(scenario())
    assert len(seen) == 1 and (ended - seen[0]).total_seconds() < 0.1


def test_a_stopped_watch_tells_nothing_and_a_reaped_process_is_not_watched():
    async def scenario():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
        seen: list = []
        stop = watch_exit(proc.pid, seen.append)
        stop()
        stop()
        proc.wait(5)
        await asyncio.sleep(0.1)
        gone = watch_exit(proc.pid, seen.append)  # reaped: no pidfd, nothing watched
        gone()
        return seen

    assert asyncio.run(scenario()) == []
