"""The end of a run (spawners/local/run_end.py): when the session of a server that ended
closes, on a real database and, where root may make one, a real cgroup v1 freezer.

The spawner is a stand-in (`Run`: the attributes RunEnd reads, no JupyterHub): its
release path is what is tested, as a poll that found the server's process gone
takes it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulease.core.billing.rules import to_ms
from gpulease.core.clock import utcnow
from gpulease.hub.billing.metering import Meter
from gpulease.spawners.local.cgroup_kill import cgroup_pids, remove_dirs
from gpulease.spawners.local.cgroups import parse_mounts
from gpulease.spawners.local.run_end import RunEnd
from gpulease.spawners.spawn_core import GPULeaseSpawnCore
from gpulease.store.assignments import AssignmentStore

RATE = 3_600_000_000  # 1 credit a second

# Left running by a server that ended itself: its child goes on (a training run).
LEFT_RUNNING = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nos._exit(0)\n"


class Run(RunEnd):
    """The attributes RunEnd reads of a LocalGPUSpawner, and nothing of JupyterHub."""

    _end_billing = GPULeaseSpawnCore._end_billing  # the session's close, the core's

    def __init__(self, ctx: SimpleNamespace, cgroup: dict | None) -> None:
        self.gpulease = ctx
        self.gpulease_devices = ()
        self.gpulease_cgroup = cgroup
        self._stopping = False
        self._gpulease_admitted = True
        self._gpulease_unwatch = lambda: None
        self.user = SimpleNamespace(name="ann")
        self.name = ""
        self.log = logging.getLogger("test_run_end")
        self._log_name = "ann/(default)"
        self.queue_poll_interval = 5.0

    async def _drop_sandbox(self) -> None:
        """No sandbox here: its network namespace is LocalGPUSpawner's (test_sandbox.py)."""


def _freezer_cgroup() -> Path | None:
    if os.geteuid() != 0:
        return None
    try:
        v1, _ = parse_mounts(Path("/proc/self/mounts").read_text())
        folder = Path(v1["freezer"]) / f"gpulease-test-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
    except (OSError, KeyError):
        return None
    return folder


def test_what_a_server_that_died_left_in_its_cgroup_is_billed_until_it_was_ended(engine):
    """A server that ends itself (its config forks a training run and exits) is seen
    gone by a poll: the exit watch's at once, or, without one (after a hub restart,
    no pidfd), a heartbeat or JupyterHub's poll up to an interval later. What it left
    in its cgroup ran until that poll ended it, and is billed so: its session ends
    when the cgroup was emptied, not at the server's own exit (was: 0.6 s early)."""
    folder = _freezer_cgroup()
    if folder is None:
        pytest.skip("no writable cgroup v1 freezer here (needs root)")
    meter = Meter(engine, heartbeat_s=1)
    meter.acquire_lease()
    session = meter.open("ann", "", "gpu", "user:ann", RATE, utcnow())
    run = Run(SimpleNamespace(meter=meter, assignments=AssignmentStore(engine)),
              {"kind": "cgroup1", "unit": folder.name, "dirs": [str(folder)]})
    try:
        def join() -> None:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

        subprocess.Popen([sys.executable, "-c", LEFT_RUNNING], preexec_fn=join).wait(10)
        assert cgroup_pids([str(folder)]), "the leftover did not start"
        meter.mark_alive("ann", "", utcnow())  # the server's exit, as the exit watch marks it
        time.sleep(0.6)  # the leftover runs on until the poll
        polled = utcnow()
        asyncio.run(run._release("server_died"))
        assert not cgroup_pids([str(folder)])
    finally:
        for pid in cgroup_pids([str(folder)]):
            os.kill(pid, 9)
        remove_dirs([str(folder)])
    closed = meter.sessions.get(session.id)
    assert closed.ended is not None and closed.end_reason == "server_died"
    assert closed.ended >= to_ms(polled), (closed.ended, polled)


class _SeenAtRelease(AssignmentStore):
    """The real store, noting what was still in the server's cgroup at each release."""

    def __init__(self, engine, folder: Path) -> None:
        super().__init__(engine)
        self.folder = folder
        self.seen: list[tuple[str, set[int]]] = []

    def release(self, user: str, server: str, reason: str) -> list[str]:
        self.seen.append((reason, cgroup_pids([str(self.folder)])))
        return super().release(user, server, reason)

    def take_out_of_service(self, user, server, reason, cgroup, detail) -> list[str]:
        self.seen.append((reason, cgroup_pids([str(self.folder)])))
        return super().take_out_of_service(user, server, reason, cgroup, detail)


def test_a_stop_racing_the_poll_that_found_its_server_dead_releases_nothing_early(
        engine, monkeypatch):
    """The exit watch's poll releases a server that ended itself while a stop (the
    user's DELETE, sent at that moment) comes in: the stop found no cgroup left to
    empty (the poll had taken it) and gave the devices back while the poll was still
    ending what the server left in it; a cgroup that could not be emptied then had
    its devices in the pool, not out of service. The slow emptying is a stand-in
    (a sleep before the real cgroup's end) for many processes or a slow kernel."""
    from gpulease.spawners.local import run_end

    folder = _freezer_cgroup()
    if folder is None:
        pytest.skip("no writable cgroup v1 freezer here (needs root)")
    real_end = run_end.isolation.end_everything

    def slow_end(state: dict):
        time.sleep(0.3)
        return real_end(state)

    monkeypatch.setattr(run_end.isolation, "end_everything", slow_end)
    meter = Meter(engine, heartbeat_s=1)
    meter.acquire_lease()
    meter.open("ann", "", "gpu", "user:ann", RATE, utcnow())
    store = _SeenAtRelease(engine, folder)
    run = Run(SimpleNamespace(meter=meter, assignments=store),
              {"kind": "cgroup1", "unit": folder.name, "dirs": [str(folder)]})

    async def race() -> None:
        died = asyncio.ensure_future(run._release("server_died"))
        await asyncio.sleep(0.05)
        await run._release("user")  # the stop's, after its process was found gone
        await died

    try:
        def join() -> None:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

        subprocess.Popen([sys.executable, "-c", LEFT_RUNNING], preexec_fn=join).wait(10)
        assert cgroup_pids([str(folder)]), "the leftover did not start"
        asyncio.run(race())
    finally:
        for pid in cgroup_pids([str(folder)]):
            os.kill(pid, 9)
        remove_dirs([str(folder)])
    assert store.seen and all(not left for _, left in store.seen), store.seen


def test_a_stop_whose_namespace_name_cannot_be_removed_still_closes_its_session(engine):
    """The idle culler's stop (api/stop recorded "idle") of a server whose sandbox's
    namespace file cannot be unlinked (EBUSY: /run/netns was bound onto itself by a
    later `ip netns add`, hiding the namespace's mount): the release raised before
    closing the session, JupyterHub dropped the error and counted the server gone, and
    the heartbeat closed the session as server_died, up to a beat later. The session
    closes at the stop, with its reason, and the devices go back."""
    meter = Meter(engine, heartbeat_s=1)
    meter.acquire_lease()
    session = meter.open("ann", "", "gpu", "user:ann", RATE, utcnow())
    assert meter.sessions.request_end_reason("ann", "", "idle")
    released: list[tuple[str, str, str]] = []

    class Store(AssignmentStore):
        def release(self, user: str, server: str, reason: str) -> list[str]:
            released.append((user, server, reason))
            return super().release(user, server, reason)

    run = Run(SimpleNamespace(meter=meter, assignments=Store(engine)), None)

    async def busy() -> None:  # what NamespacePool.drop raised (netns.remove_netns)
        raise OSError(errno.EBUSY, "Device or resource busy", "/run/netns/0a1b2c3d-4")

    run._drop_sandbox = busy
    exited = utcnow()
    asyncio.run(run._release("user", exited))
    closed = meter.sessions.get(session.id)
    assert closed.ended is not None and closed.end_reason == "idle", closed
    assert closed.ended == to_ms(exited) and ("ann", "") not in meter.live
    assert released == [("ann", "", "user")]


def test_a_release_that_fails_ending_the_cgroup_still_closes_the_session_first(
        engine, monkeypatch):
    """Whatever fails in ending what the server ran (gpulease's own error), the session
    is closed with the release's reason before the error goes on to the stop."""
    from gpulease.spawners.local import run_end

    def broken(state: dict):
        raise RuntimeError("broken")

    monkeypatch.setattr(run_end.isolation, "end_everything", broken)
    meter = Meter(engine, heartbeat_s=1)
    meter.acquire_lease()
    session = meter.open("ann", "", "gpu", "user:ann", RATE, utcnow())
    run = Run(SimpleNamespace(meter=meter, assignments=AssignmentStore(engine)),
              {"kind": "cgroup1", "unit": "gone", "dirs": ["/nonexistent/gone"]})
    with pytest.raises(RuntimeError):
        asyncio.run(run._release("user", utcnow()))
    closed = meter.sessions.get(session.id)
    assert closed.ended is not None and closed.end_reason == "user", closed
