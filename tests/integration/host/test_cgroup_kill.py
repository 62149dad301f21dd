"""Ending a cgroup's processes: the decision over fake folders, and real cgroups as root.

The attack is a "respawn to a new pid" loop: each process forks a child and
exits at once, in several chains, so a list of pids read a moment ago is
always stale. Real cgroups are used where this host lets root make them
(v1 freezer, the v2 hierarchy's cgroup.kill); the tests say what they could
not check otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpulease.spawners.local.cgroup_kill import (
    Emptied,
    cgroup_pids,
    devices_may_go,
    empty_cgroup,
    remove_dirs,
)
from gpulease.spawners.local.cgroups import HostReader, parse_mounts

NO_SUCH_PID = 4_194_305  # above the kernel's largest pid_max: never a process

RESPAWN = """
import os, sys, time
for _ in range(4):          # four chains
    if os.fork() == 0:
        break
else:
    os._exit(0)
while True:                 # fork a child, exit: the chain moves on to a new pid
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.001)
        continue
    if pid:
        os._exit(0)
    try:
        os.setsid()
    except OSError:
        pass
    time.sleep(0.005)       # paced: each orphan's zombie waits for PID 1 to reap it
"""


def fake_cgroup(tmp_path: Path, pids: str) -> Path:
    folder = tmp_path / "gpulease" / "gl-ada._.t"
    folder.mkdir(parents=True)
    (folder / "cgroup.procs").write_text(pids)
    return folder


def test_a_cgroup_that_cannot_be_emptied_keeps_its_devices(tmp_path):
    folder = fake_cgroup(tmp_path, f"{NO_SUCH_PID}\n")
    sent = []
    emptied = empty_cgroup("cgroup1", "gl-ada._.t", [str(folder)], wait_s=0.2,
                           kill=lambda pid, sig: sent.append((pid, sig)))
    assert emptied.left == (NO_SUCH_PID,) and not emptied.empty and emptied.how == "signals"
    assert sent and {pid for pid, _ in sent} == {NO_SUCH_PID}  # tried, round after round
    assert not devices_may_go(emptied)
    assert f"pids {NO_SUCH_PID}" in emptied.describe() and str(folder) in emptied.describe()
    assert emptied.state() == {"kind": "cgroup1", "unit": "gl-ada._.t", "dirs": [str(folder)]}
    (folder / "cgroup.procs").write_text("")  # what was left has gone
    again = empty_cgroup("cgroup1", "gl-ada._.t", [str(folder)], wait_s=0.2,
                         kill=lambda pid, sig: None)
    assert again.empty and devices_may_go(again) and again.how == "nothing left"
    assert devices_may_go(None)  # no cgroup on this host: the process tree was all


def test_emptied_states_round_trip():
    e = Emptied("systemd", "gpulease-x.scope", ("/sys/fs/cgroup/x",), "cgroup.kill", 1, ())
    assert e.empty and "empty" in e.describe()


# --- real cgroups (root) -------------------------------------------------------------

def _mounts() -> tuple[dict[str, str], str | None]:
    try:
        return parse_mounts(Path("/proc/self/mounts").read_text())
    except OSError:
        return {}, None


def _make(root: str | None) -> Path | None:
    if os.geteuid() != 0 or not root:
        return None
    folder = Path(root) / f"gpulease-test-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir()
    except OSError:
        return None
    return folder


def _start_respawner(folder: Path, marker: str) -> None:
    def join() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    subprocess.Popen([sys.executable, "-c", RESPAWN, marker], preexec_fn=join,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL).wait(10)  # the first parent exits at once


def _marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _attack_and_stop(folder: Path) -> Emptied:
    return _attack_and_stop_with(
        folder, lambda: empty_cgroup("test", folder.name, [str(folder)], wait_s=5.0))


def _attack_and_stop_with(folder: Path, stop) -> Emptied:
    """Start the respawn loop in `folder`, then `stop()`: nothing of it may be left."""
    marker = f"gpulease-respawn-{uuid.uuid4().hex[:8]}"
    try:
        _start_respawner(folder, marker)
        time.sleep(0.3)
        assert cgroup_pids([str(folder)]), "the respawn loop did not start"
        emptied = stop()
        time.sleep(0.3)  # anything that escaped would have forked on by now
        assert not _marked(marker), "a respawned process survived the stop"
        return emptied
    finally:
        for pid in _marked(marker):  # never leave the loop behind, whatever happened
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def test_the_v1_freezer_ends_a_respawn_loop():
    v1, _ = _mounts()
    folder = _make(v1.get("freezer"))
    if folder is None:
        pytest.skip("no writable cgroup v1 freezer here (needs root): the freezer path is "
                    "not checked on this host")
    try:
        emptied = _attack_and_stop(folder)
        assert emptied.empty and emptied.how == "freezer", emptied
        assert (folder / "freezer.state").read_text().strip() == "THAWED"
    finally:
        remove_dirs([str(folder)])


def test_cgroup_kill_ends_a_respawn_loop():
    _, v2 = _mounts()
    folder = _make(v2)
    if folder is None or not (folder / "cgroup.kill").exists():
        if folder is not None:
            remove_dirs([str(folder)])
        pytest.skip("no writable cgroup v2 with cgroup.kill here (needs root, Linux 5.14+): "
                    "the cgroup.kill path is not checked on this host")
    try:
        emptied = _attack_and_stop(folder)
        assert emptied.empty and emptied.how == "cgroup.kill", emptied
    finally:
        remove_dirs([str(folder)])


def test_host_reader_sees_the_freezer_where_there_is_one():
    v1, _ = _mounts()
    facts = HostReader().facts()
    assert facts.v1.get("freezer") == v1.get("freezer")
