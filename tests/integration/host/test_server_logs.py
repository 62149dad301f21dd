"""A server's output captured to a log of its own (gpulease/host/server_logs.py and its writer,
gpulease/host/server_log_writer.py), with real processes and pipes.

A stand-in "server" is a Python child given the capture's write end as its stdout and
stderr, as LocalGPUSpawner's cold start does.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpulease.core.server_log import Rotation
from gpulease.host.server_logs import (
    ServerLogError,
    capture,
    read_log,
    remove_logs,
    rename_logs,
)

RULE = Rotation(max_bytes=64 * 1024, keep=2)


def run_server(cap, code: str) -> subprocess.CompletedProcess:
    """Run `code` with the capture as its stdout and stderr, then let go of the hub's copy."""
    try:
        return subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                              stdout=cap.write_fd, stderr=cap.write_fd, timeout=60)
    finally:
        cap.launched()


def test_a_servers_output_goes_to_its_own_log_and_the_writer_ends_with_it(tmp_path):
    cap = capture(tmp_path, "ada", "", RULE)
    run_server(cap, "import sys; print('to stdout'); print('to stderr', file=sys.stderr)")
    assert cap.wait_written(10), "the writer did not end once the server had"
    path = tmp_path / "logs/servers/ada/_default.log"
    assert cap.path == path
    assert path.read_text() == "to stdout\nto stderr\n"
    assert cap.tail() == "to stdout\nto stderr"
    assert read_log(tmp_path, "ada", "", lines=1, limit=4096) == b"to stderr\n"
    # the hub's account only, its group reading: no server's account enters or reads
    for folder in (tmp_path / "logs", tmp_path / "logs/servers", path.parent):
        st = folder.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o750), folder
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_uid == os.geteuid()


def test_a_server_cannot_truncate_or_seek_its_output(tmp_path):
    cap = capture(tmp_path, "ada", "trunc", RULE)
    run_server(cap, "import os\nprint('kept', flush=True)\nfor fd in (1, 2):\n"
                    "    try:\n        os.ftruncate(fd, 0)\n    except OSError as e:\n"
                    "        print('ftruncate', fd, e.errno, flush=True)\n")
    assert cap.wait_written(10)
    text = cap.path.read_text()
    assert text.startswith("kept\n") and "ftruncate 1 22" in text and "ftruncate 2 22" in text


def test_each_start_begins_a_new_file_and_the_last_ones_are_kept(tmp_path):
    for n in range(4):
        cap = capture(tmp_path, "ada", "runs", RULE)
        run_server(cap, f"print('start {n}')")
        assert cap.wait_written(10)
    folder = tmp_path / "logs/servers/ada"
    assert (folder / "runs.log").read_text() == "start 3\n"
    assert (folder / "runs.log.1").read_text() == "start 2\n"
    assert (folder / "runs.log.2").read_text() == "start 1\n"
    assert not (folder / "runs.log.3").exists()  # keep=2


def test_a_log_rotates_at_its_bound_and_stays_bounded(tmp_path):
    cap = capture(tmp_path, "ada", "loud", RULE)
    run_server(cap, "import sys\nfor i in range(5000):\n"
                    "    sys.stdout.write('%05d ' % i + 'x' * 94 + '\\n')\nprint('LAST')")
    assert cap.wait_written(20)
    folder = tmp_path / "logs/servers/ada"
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["loud.log", "loud.log.1", "loud.log.2"], files
    assert all((folder / f).stat().st_size <= RULE.max_bytes for f in files)
    assert cap.tail().endswith("LAST") and "04999 " in cap.tail()


def test_the_writer_outlives_signals_meant_for_the_hub(tmp_path):
    cap = capture(tmp_path, "ada", "sig", RULE)
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nprint('before', flush=True)\n"
         "sys.stdin.readline()\nprint('after', flush=True)"],
        stdin=subprocess.PIPE, stdout=cap.write_fd, stderr=cap.write_fd)
    cap.launched()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not cap.path.exists():
        time.sleep(0.05)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        cap.writer.send_signal(number)
    time.sleep(0.3)
    assert cap.writer.poll() is None, "the log writer ended on a signal"
    server.communicate(b"go\n", timeout=30)
    assert cap.wait_written(10)
    assert cap.path.read_text() == "before\nafter\n"


def test_a_folder_that_is_not_the_hubs_own_is_refused(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/servers").symlink_to(tmp_path)
    with pytest.raises(ServerLogError, match="not a folder"):
        capture(tmp_path, "ada", "", RULE)
    with pytest.raises(ServerLogError, match="not allowed"):
        capture(tmp_path, "ada", "../x", RULE)


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's view needs root")
def test_another_account_cannot_read_or_write_the_log():
    state = Path(tempfile.mkdtemp(prefix="gpulease-logs-"))  # a folder others may pass
    try:
        state.chmod(0o711)
        cap = capture(state, "ada", "", RULE)
        run_server(cap, "print('secret')")
        assert cap.wait_written(10)
        (state / "open.txt").write_text("anyone's\n")  # the control: a file they may read
        (state / "open.txt").chmod(0o644)
        probe = ("import sys\nfor path, mode in ((sys.argv[1], 'r'), (sys.argv[2], 'r'), "
                 "(sys.argv[2], 'a')):\n    try:\n        open(path, mode)\n"
                 "        print('opened', mode)\n    except PermissionError:\n"
                 "        print('refused', mode)\n")
        seen = subprocess.run(
            [sys.executable, "-c", probe, str(state / "open.txt"), str(cap.path)],
            capture_output=True, text=True, timeout=30, user=65534, group=65534,
            extra_groups=[], cwd="/")
        assert seen.stdout.split("\n")[:3] == ["opened r", "refused r", "refused a"], seen
        assert cap.path.read_text() == "secret\n"
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: a disk that fills")
def test_a_full_disk_costs_output_never_the_server_or_its_writer():
    """A disk with no inode left (a researcher's home on the state folder's disk can use
    them all up): the writer cannot begin a file at its rotation, nor at its start. It
    reads on, dropping what it cannot keep, so the server's writes never fail (a process
    writing to a pipe no one reads dies of SIGPIPE), and it keeps what comes once there
    is room again."""
    state = Path(tempfile.mkdtemp(prefix="gpulease-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=6", "gpulease-full",
                    str(state)], check=True)
    try:
        # inodes: the root, logs/, servers/, ada/, the log; its first rotation takes the last
        cap = capture(state, "ada", "", RULE)
        code = ("import os, sys\nfor i in range(12):\n    os.write(1, b'x' * 16000 + b'\\n')\n"
                "sys.stdin.readline()\nos.write(2, b'after the room came back\\n')\n")
        server = subprocess.Popen(
            ["sh", "-c", f'{sys.executable} -c "$0"; echo "the shell lived on: $?"', code],
            stdin=subprocess.PIPE, stdout=cap.write_fd, stderr=cap.write_fd)
        cap.launched()
        deadline = time.monotonic() + 10
        folder = state / "logs/servers/ada"
        while time.monotonic() < deadline and not (folder / "_default.log.2").exists():
            time.sleep(0.05)
        time.sleep(0.3)
        assert cap.writer.poll() is None, "the log writer died of the full disk"
        (folder / "_default.log.2").unlink()  # room again: one inode
        server.communicate(b"go\n", timeout=30)
        assert server.returncode == 0, "the server died of its output (SIGPIPE)"
        assert cap.wait_written(10) and cap.writer.returncode == 0
        assert cap.path.read_text().endswith(
            "after the room came back\nthe shell lived on: 0\n"), cap.path.read_text()[-200:]
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: a disk that fills")
def test_a_writer_that_cannot_begin_its_file_still_reads():
    state = Path(tempfile.mkdtemp(prefix="gpulease-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=4", "gpulease-full",
                    str(state)], check=True)
    try:
        cap = capture(state, "ada", "", RULE)  # its folders take every inode: no file
        done = run_server(cap, "import time\nfor i in range(3):\n"
                               "    print('lost', flush=True); time.sleep(0.2)")
        assert done.returncode == 0, "the server's writes failed: its writer had ended"
        assert cap.wait_written(10) and cap.writer.returncode == 0
        assert not cap.path.exists() and cap.tail() == ""
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
        shutil.rmtree(state, ignore_errors=True)


def test_a_deleted_servers_logs_go_and_no_other_servers(tmp_path):
    folder = tmp_path / "logs/servers/ada"
    folder.mkdir(parents=True)
    for name in ("n1.log", "n1.log.1", "n1.log.7", "n10.log", "n1.logx", "_default.log"):
        (folder / name).write_text(name)
    assert remove_logs(tmp_path, "ada", "n1") == 3
    assert sorted(p.name for p in folder.iterdir()) == ["_default.log", "n1.logx", "n10.log"]
    assert remove_logs(tmp_path, "ada", "n1") == 0
    assert remove_logs(tmp_path, "bob", "") == 0  # never started: nothing to remove
    with pytest.raises(ValueError):
        remove_logs(tmp_path, "ada", "../ada")


def test_a_renamed_servers_logs_take_its_new_name(tmp_path):
    folder = tmp_path / "logs/servers/ada"
    folder.mkdir(parents=True)
    for name in ("a.log", "a.log.1", "b.log.2", "ab.log"):
        (folder / name).write_text(name)
    assert rename_logs(tmp_path, "ada", "a", "b") == 2
    assert sorted(p.name for p in folder.iterdir()) == ["ab.log", "b.log", "b.log.1"]
    assert (folder / "b.log.1").read_text() == "a.log.1"  # b's stale .2 was removed first
    assert rename_logs(tmp_path, "ada", "a", "c") == 0
    assert rename_logs(tmp_path, "ada", "b", "") == 2  # to the default server's name
    assert sorted(p.name for p in folder.iterdir()) == ["_default.log", "_default.log.1",
                                                        "ab.log"]
