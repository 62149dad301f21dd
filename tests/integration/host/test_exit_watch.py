"""watch_exit: the moment a process ends, told on the event loop as it ends."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from gpulease.core.clock import utcnow
from gpulease.spawners.local.exit_watch import watch_exit


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


def test_a_stop_waits_for_its_exit_in_a_hub_with_more_than_1024_descriptors():
    """select() refuses descriptors from FD_SETSIZE (1024) on, with ValueError: in a
    hub whose limit allows more (a systemd unit's LimitNOFILE), anyone holding open
    a thousand connections to it gave the next pidfd a number above 1024, and every
    stop's wait for its server's exit raised instead of waiting (the stop failed)."""
    import os
    import resource

    from gpulease.spawners.local.exit_watch import wait_for_exit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit here is {hard}: no descriptor above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1030:  # the next descriptor opened is above 1024
            held.append(os.open("/dev/null", os.O_RDONLY))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
        ended = asyncio.run(wait_for_exit(proc, 10))
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert ended is not None and proc.returncode == 0
    assert (utcnow() - ended).total_seconds() < 1
