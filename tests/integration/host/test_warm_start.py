"""The warm launcher and its children, without a hub (spawners/local/warm_start.py,
singleuser/warm_launcher.py, singleuser/warm_child.py).

A real launcher process imports the server's modules and forks. The requests
here set an import-time variable (PYTHONWARMTEST) that differs from the
launcher's, so each child, once it has become what it was asked to be, execs
its command (a shell line) cold: the tests see what a forked server inherits
(descriptors, account, folder, environment) without a notebook server.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpulease.spawners.local.process_spec import warm_request, why_not_warm
from gpulease.spawners.local.warm_start import WarmLauncher, WarmStartError
from tests.support.isolation_env import shared_tmpdir
from tests.support.processes import process_memory


@pytest.fixture(scope="module")
def launcher():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    launched = WarmLauncher(sys.executable, env)
    launched.start()
    assert launched.ready(60), launched.failure
    yield launched
    launched.close()


def shell(line: str, tmp: Path, **over) -> dict:
    request = warm_request(argv=["/bin/sh", "-c", line], env={"PYTHONWARMTEST": "1",
                           "PATH": "/usr/bin:/bin"}, cwd=str(tmp), uid=None, gid=None,
                           groups=None, cgroup_dirs=())
    return {**request, **over}


def test_why_not_warm_names_each_reason():
    ok = dict(enabled=True, shell_cmd=[], cmd_prefix=(), interpreter="/venv/bin/python3.11")
    assert why_not_warm(**ok) == ""
    assert "GPULeaseHub.warm_start" in why_not_warm(**{**ok, "enabled": False})
    assert "shell_cmd" in why_not_warm(**{**ok, "shell_cmd": ["bash", "-c"]})
    assert "systemd" in why_not_warm(**{**ok, "cmd_prefix": ("systemd-run", "--scope")})
    assert "not a Python script" in why_not_warm(**{**ok, "interpreter": "/bin/sh"})
    assert "not a Python script" in why_not_warm(**{**ok, "interpreter": None})


def test_exit_status_reaches_the_hub_as_popen_would(launcher, tmp_path):
    child = launcher.spawn(shell("exit 3", tmp_path))
    assert child.pid > 0
    assert child.wait(30) == 3 and child.poll() == 3


def test_a_server_reaped_before_the_hub_looks_still_gives_its_exit_status(
        launcher, tmp_path, monkeypatch):
    """The race a busy box hits: the server exits at once and the launcher reaps it before
    the hub opens its pidfd. The hub takes the launcher's word for the status instead of
    failing the start with "the forked server is gone"."""
    from gpulease.spawners.local import warm_start

    real = warm_start.launcher_child

    def after_the_reap(pid: int, launcher_pid: int) -> int:
        deadline = time.monotonic() + 30
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the launcher has reaped it: its pid names nothing
        assert not psutil.pid_exists(pid)
        return real(pid, launcher_pid)

    monkeypatch.setattr(warm_start, "launcher_child", after_the_reap)
    child = launcher.spawn(shell("exit 3", tmp_path))
    assert child.pid > 0 and child.launched_at is not None
    assert child.poll() == 3 and child.wait(1) == 3 and child.pidfd() is None
    child.kill()  # a no-op on a server that has ended: nothing else gets the signal
    child.close()


def test_a_signal_is_a_negative_returncode(launcher, tmp_path):
    child = launcher.spawn(shell("sleep 60", tmp_path))
    assert child.poll() is None
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL


def test_child_keeps_no_descriptor_of_the_launcher(launcher, tmp_path):
    """Only stdio reach the server: not the control socket, not its own request socket."""
    child = launcher.spawn(shell("exec sleep 30", tmp_path))
    try:
        deadline = time.monotonic() + 10
        while not os.readlink(f"/proc/{child.pid}/exe").endswith("sleep") and \
                time.monotonic() < deadline:
            time.sleep(0.02)  # until python has exec'd the shell, and it sleep
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{child.pid}/fd")) == [0, 1, 2]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)


def test_child_writes_to_the_output_it_was_sent_never_the_launchers(launcher, tmp_path):
    """The launcher's stdout and stderr are the hub's: a forked server gets the write end
    of its own log's pipe on both instead (and /dev/null when none is sent), and the
    launcher keeps no copy of it, so the log's reader sees its end with the server's."""
    launchers = {os.readlink(f"/proc/{launcher.pid}/fd/{n}") for n in (1, 2)}
    read_end, write_end = os.pipe()
    pipe_id = f"pipe:[{os.fstat(read_end).st_ino}]"
    try:
        child = launcher.spawn(shell("echo out; echo err >&2; readlink /proc/$$/fd/1 "
                                     "/proc/$$/fd/2", tmp_path), write_end)
    finally:
        os.close(write_end)  # the hub's copy, as LocalGPUSpawner lets go of it
    assert child.wait(30) == 0
    with os.fdopen(read_end, "rb") as pipe:
        written = pipe.read().decode()  # ends: neither the launcher nor the hub holds it
    # (the child's own notes come first: "[gpulease] starting cold: ...")
    assert written.endswith("out\nerr\n" + f"{pipe_id}\n" * 2), written
    assert not launchers & set(written.splitlines()), (written, launchers)
    quiet = launcher.spawn(shell("test \"$(readlink /proc/$$/fd/1)\" = /dev/null && "
                                 "test \"$(readlink /proc/$$/fd/2)\" = /dev/null", tmp_path))
    assert quiet.wait(30) == 0


def test_child_runs_in_its_folder_with_exactly_its_environment(launcher, tmp_path):
    out = tmp_path / "env"
    request = shell(f"pwd > {out}; env >> {out}", tmp_path)
    request["env"]["GPULEASE_PROFILE"] = "small"
    assert launcher.spawn(request).wait(30) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == str(tmp_path)
    env = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    env.pop("PWD", None), env.pop("SHLVL", None), env.pop("_", None)
    assert env == {"PYTHONWARMTEST": "1", "PATH": "/usr/bin:/bin", "GPULEASE_PROFILE": "small"}


def test_a_child_that_cannot_join_its_cgroup_fails_the_start_and_says_why(launcher, tmp_path):
    with pytest.raises(WarmStartError, match="cannot join the server's cgroup"):
        launcher.spawn(shell("exit 0", tmp_path, cgroup_dirs=[str(tmp_path / "no-such")]))


def test_a_child_that_cannot_enter_its_folder_says_which(launcher, tmp_path):
    with pytest.raises(WarmStartError, match="cannot enter the server's folder .*no-such"):
        launcher.spawn(shell("exit 0", tmp_path, cwd=str(tmp_path / "no-such")))


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another account needs root")
def test_child_drops_to_the_account_with_only_its_groups(launcher):
    folder = shared_tmpdir("warm-")
    folder.chmod(0o777)
    out = folder / "id"
    request = shell(f"id -u > {out}; id -g >> {out}; id -G >> {out}", folder,
                    uid=65534, gid=65534, groups=[65534])
    assert launcher.spawn(request).wait(30) == 0
    assert out.read_text().split() == ["65534", "65534", "65534"]


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's memory")
def test_no_request_passes_through_the_launchers_memory(launcher, tmp_path):
    """A token sent for one server is never in the launcher, so no later fork inherits it."""
    token = "warm-test-" + secrets.token_hex(16)
    # alive a moment: a child that exits at once can be reaped before the hub has
    # checked it is the launcher's (then the start fails as "gone"), which is not
    # what this test is about
    request = shell("sleep 0.5; exit 0", tmp_path)
    request["env"]["JUPYTERHUB_API_TOKEN"] = token
    assert launcher.spawn(request).wait(30) == 0
    assert token.encode() not in process_memory(launcher.pid)


def test_the_launcher_ends_with_the_hub_and_its_servers_run_on(tmp_path):
    launched = WarmLauncher(sys.executable, {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    launched.start()
    assert launched.ready(60), launched.failure
    child = launched.spawn(shell("sleep 30", tmp_path))
    launched.close()
    assert launched.proc.poll() is not None
    assert child.poll() is None  # orphaned: known by its pid now
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.poll() == 0


def test_json_requests_roundtrip():
    request = warm_request(argv=["a"], env={"X": "1"}, cwd="/", uid=1, gid=2, groups=[2],
                           cgroup_dirs=("/c",))
    assert json.loads(json.dumps(request)) == request


def test_a_failed_launcher_is_not_started_again_at_every_start(tmp_path, monkeypatch):
    from gpulease.spawners.local import warm_start

    monkeypatch.setattr(warm_start, "_launchers", {})
    broken = str(tmp_path / "no-python")
    first, known = warm_start.launcher_for(broken, dict)
    assert not known and first.failure.startswith("cannot run")
    again, known = warm_start.launcher_for(broken, dict)
    assert again is first and known
    with pytest.raises(warm_start.WarmUnavailable, match="cannot run"):
        again.spawn({"argv": ["x"]}, wait_ready=1)
    monkeypatch.setattr(warm_start, "RETRY_AFTER_S", 0.0)
    retried, known = warm_start.launcher_for(broken, dict)
    assert retried is not first and not known


def test_why_cold_names_an_import_time_difference():
    from gpulease.singleuser.warm_child import _why_cold

    base = {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    assert "LANG" in _why_cold({**base, "LANG": "de_DE.UTF-8"}, base)
    assert "PYTHONPATH" in _why_cold({**base, "PYTHONPATH": "/home/x"}, base)
    assert "JUPYTERHUB_SINGLEUSER_APP" in _why_cold(
        {**base, "JUPYTERHUB_SINGLEUSER_APP": "notebook"}, base)


# --- what the attack review found (each fixed; each test fails without its fix) --------


def test_the_child_is_made_dumpable_only_once_its_socket_is_closed(tmp_path):
    """While the child holds its socket to the hub it stays undumpable: no process of the
    researcher's can ptrace it and write the hub a pid of its choosing."""
    from gpulease.singleuser import warm_child

    marker = tmp_path / "socket-at-dumpable"
    ours, theirs = socket.socketpair()
    ours.sendall(json.dumps(shell("exit 0", tmp_path, uid=os.getuid())).encode())
    ours.shutdown(socket.SHUT_WR)
    pid = os.fork()
    if pid == 0:  # the child, as the launcher would run it
        try:
            request_fd = theirs.fileno()

            def record() -> None:
                try:
                    os.fstat(request_fd)
                    marker.write_text("open")
                except OSError:
                    marker.write_text("closed")

            warm_child._dumpable_again = record
            warm_child.run_server(request_fd)
        finally:
            os._exit(3)
    theirs.close()
    answer = b""
    while chunk := ours.recv(4096):
        answer += chunk
    _, status = os.waitpid(pid, 0)
    said = [json.loads(line) for line in answer.splitlines()]
    # first the moment it joined its cgroup (billed from there), then ready
    assert [sorted(m) for m in said] == [["in_cgroup"], ["ready"]]
    assert said[1] == {"ready": True}
    assert abs(said[0]["in_cgroup"] - time.time()) < 30
    assert marker.read_text() == "closed"


def test_the_hub_acts_on_the_launchers_pid_not_the_childs_word():
    from gpulease.spawners.local.warm_process import launcher_child, read_answer

    ours, theirs = socket.socketpair()
    theirs.sendall(b'{"ready": true, "forked": 1}\n{"forked": 4242}\n')
    assert read_answer(ours, 5)["forked"] == 1  # the first word on each key holds
    with pytest.raises(OSError, match="not the warm launcher's child"):
        launcher_child(1, os.getpid())  # init is nobody's forked server


def test_a_child_that_is_not_ready_in_time_is_killed_and_the_server_starts_cold(
        tmp_path, monkeypatch):
    from gpulease.spawners.local import warm_start

    stuck = tmp_path / "cgroup"
    stuck.mkdir()
    os.mkfifo(stuck / "cgroup.procs")  # joining it blocks: a child that never gets ready
    launched = WarmLauncher(sys.executable, {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    launched.start()
    try:
        assert launched.ready(60), launched.failure
        monkeypatch.setattr(warm_start, "ANSWER_TIMEOUT_S", 1.0)
        before = set(_children(launched.pid))
        with pytest.raises(warm_start.WarmUnavailable, match="not ready within"):
            launched.spawn(shell("exit 0", tmp_path, cgroup_dirs=[str(stuck)]))
        deadline = time.monotonic() + 10
        while set(_children(launched.pid)) - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(_children(launched.pid)) - before  # killed, and reaped
        assert not launched.failure  # the launcher itself is fine
    finally:
        launched.close()


def _children(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children()]


def test_a_launcher_that_never_gets_ready_is_killed(tmp_path, monkeypatch):
    from gpulease.spawners.local import warm_start

    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(warm_start, "READY_TIMEOUT_S", 1.0)
    launched = WarmLauncher(str(fake), {"PATH": "/usr/bin:/bin"})
    launched.start()
    assert not launched.ready(10)
    assert "did not start" in launched.failure
    assert launched.proc.poll() is not None  # not left running (as root)


@pytest.mark.skipif(os.geteuid() != 0, reason="the launcher runs as root only when the hub does")
def test_an_environment_others_may_change_is_not_run_by_the_root_launcher(tmp_path):
    from gpulease.spawners.local.warm_start import root_would_run_others_code

    env = tmp_path / "env"
    site = env / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    python = env / "bin" / "python3"
    python.write_text("")
    for path in (env, env / "bin", env / "lib", site.parent, site):
        path.chmod(0o755)
    assert root_would_run_others_code(str(python)) == ""
    site.chmod(0o777)
    assert "site-packages may be changed by an account other than root" in \
        root_would_run_others_code(str(python))
    site.chmod(0o755)
    os.chown(env / "bin", 65534, 65534)
    assert "owner uid 65534" in root_would_run_others_code(str(python))


def test_no_preimported_module_keeps_the_launchers_account_or_home():
    """What the launcher imports as root with HOME=/nonexistent must not keep either,
    unless the child imports it again as the researcher (REIMPORT_AS_RESEARCHER)."""
    from gpulease.singleuser.warm_child import REIMPORT_AS_RESEARCHER

    scan = (
        "import sys, json\n"
        "from gpulease.singleuser.warm_launcher import preimport\n"
        "preimport()\n"
        "found = set()\n"
        "def home(v):\n"
        "    return isinstance(v, str) and v.startswith('/nonexistent')\n"
        "for name, m in list(sys.modules.items()):\n"
        "    for k, v in list(getattr(m, '__dict__', {}).items()):\n"
        "        if home(v) or k.lower() in ('uid', 'euid', '_uid') and v == 0:\n"
        "            found.add(name)\n"
        "        # a class's traitlets defaults, computed as the class was defined\n"
        "        # (JupyterLab's LabApp.workspaces_dir is one)\n"
        "        if isinstance(v, type) and v.__module__ == name:\n"
        "            for attr in list(vars(v).values()):\n"
        "                if type(attr).__module__ == 'traitlets.traitlets' and \\\n"
        "                        home(getattr(attr, 'default_value', None)):\n"
        "                    found.add(name)\n"
        "print(json.dumps(sorted(found)))\n")
    import subprocess

    done = subprocess.run([sys.executable, "-c", scan], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/",
                          timeout=120)
    assert done.returncode == 0, done.stderr
    found = set(json.loads(done.stdout.splitlines()[-1])) - {"site"}  # site: warm_child
    assert found <= set(REIMPORT_AS_RESEARCHER), found


def test_a_usercustomize_in_the_user_site_makes_the_start_cold(tmp_path, monkeypatch):
    import site as site_module

    from gpulease.singleuser import warm_child

    user_site = tmp_path / "site-packages"
    user_site.mkdir()
    (user_site / "usercustomize.py").write_text("print('mine')\n")
    monkeypatch.setattr(site_module, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site_module, "check_enableusersite", lambda: True)
    monkeypatch.setattr(site_module, "getusersitepackages", lambda: str(user_site))
    monkeypatch.setattr(sys, "flags", type("F", (), {"no_user_site": 0})())
    assert "usercustomize.py would run" in warm_child._user_site_differs()


def test_only_gpulease_own_server_script_is_forked(tmp_path):
    """The child runs gpulease.singleuser.launch in-process: an image whose script is
    another Python program (a wrapper of its own) starts cold, as that program."""
    from gpulease.singleuser import SERVER_SCRIPT
    from gpulease.spawners.local.warm_start import check_script

    ours = str(Path(sys.executable).parent / SERVER_SCRIPT)
    assert check_script(ours) == (check_script(ours)[0], "")
    other = tmp_path / SERVER_SCRIPT
    other.write_text(f"#!{sys.executable}\nprint('my own server')\n")
    interpreter, why = check_script(str(other))
    assert interpreter == sys.executable and "is not gpulease's own server script" in why


def test_a_cancelled_warm_start_kills_the_server_it_forked(monkeypatch):
    """The researcher's DELETE or a timeout cancels a pending start: the fork in flight
    must not leave a server running that the hub no longer knows of."""
    import asyncio

    from gpulease.spawners.local import isolation
    from gpulease.spawners.local.spawner import LocalGPUSpawner

    class Child:
        pid = 4242
        killed = closed = False

        def kill(self) -> None:
            self.killed = True

        def close(self) -> None:
            self.closed = True

    child = Child()

    class SlowLauncher:
        pid = 1

        def spawn(self, request: dict, output: int) -> Child:
            time.sleep(0.5)  # the fork in flight when the start is cancelled
            os.fstat(output)  # still open: the start's cancel did not close the fork's
            return child

    spawner = LocalGPUSpawner()
    spawner.gpulease_isolation = isolation.Prepared(None, None, "", ())
    spawner.popen_kwargs = {"cwd": "/"}
    spawner.cmd = ["gpulease-singleuser"]
    monkeypatch.setattr(spawner, "get_env", lambda: {})
    monkeypatch.setattr(spawner, "get_args", lambda: [])

    async def cancel_midway() -> None:
        start = asyncio.ensure_future(spawner._start_warm(SlowLauncher(), output))
        await asyncio.sleep(0.1)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        await asyncio.sleep(0.8)

    read_end, output = os.pipe()
    try:
        asyncio.run(cancel_midway())
    finally:
        os.close(output)
    os.set_blocking(read_end, False)
    assert os.read(read_end, 10) == b""  # no copy of it is left open
    os.close(read_end)
    assert child.killed and child.closed
    assert spawner.proc is None


def test_a_server_forked_from_a_launcher_started_with_sigint_ignored_still_gets_it(tmp_path):
    """A hub started in the background has SIGINT ignored until JupyterHub handles it;
    a launcher started then inherits that, and a forked server ignored the hub's
    SIGINT stop for the whole interrupt timeout (caught by the culler e2e test)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        launched = WarmLauncher(sys.executable, {"PATH": "/usr/bin:/bin",
                                                 "HOME": "/nonexistent"})
        launched.start()
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        assert launched.ready(60), launched.failure
        child = launched.spawn(shell("exec sleep 30", tmp_path))
        deadline = time.monotonic() + 10
        while not os.readlink(f"/proc/{child.pid}/exe").endswith("sleep") and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        ignored = int(Path(f"/proc/{child.pid}/status").read_text()
                      .split("SigIgn:")[1].split()[0], 16)
        assert not ignored & (1 << (signal.SIGINT - 1))
        os.kill(child.pid, signal.SIGINT)
        assert child.wait(10) == -signal.SIGINT
    finally:
        launched.close()


def test_the_child_reports_its_launch_from_its_cgroup_before_it_becomes_the_researcher(
        monkeypatch, tmp_path):
    """Billing starts at the child's report: sent once it is in its cgroup (with its
    devices), while still root, before groups, gid and uid are the account's."""
    from gpulease.singleuser import warm_child

    events: list = []
    monkeypatch.chdir(tmp_path)  # _become enters the server's folder: put back after
    for name in ("setsid", "setgroups", "setgid", "setuid"):
        monkeypatch.setattr(os, name, lambda *a, _n=name: events.append(_n))
    monkeypatch.setattr(os, "getuid", lambda: 61234)
    monkeypatch.setattr(os, "geteuid", lambda: 61234)
    monkeypatch.setattr(os, "getgroups", lambda: [61234])
    monkeypatch.setattr(warm_child, "_say", lambda fd, m: events.append(("told", sorted(m))) or True)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("")
    warm_child._become({"cgroup_dirs": [str(cgroup)], "uid": 61234, "gid": 61234,
                        "groups": [61234], "cwd": str(tmp_path)}, (b"x", b"x"), 99)
    assert (cgroup / "cgroup.procs").read_text() == str(os.getpid())
    told = events.index(("told", ["in_cgroup"]))
    assert events.index("setsid") < told < events.index("setgroups") < events.index("setuid")


def test_the_launch_moment_is_the_childs_report_within_the_fork_and_now():
    from datetime import timedelta

    from gpulease.core.clock import utcnow
    from gpulease.spawners.local.warm_start import in_cgroup_moment

    asked = utcnow() - timedelta(seconds=2)
    reported = time.time() - 1
    moment = in_cgroup_moment(reported, asked)
    assert asked <= moment <= utcnow()
    assert abs((utcnow() - moment).total_seconds() - 1) < 0.5
    assert in_cgroup_moment(time.time() - 3600, asked) == asked  # never before it was asked
    assert in_cgroup_moment(time.time() + 3600, asked) <= utcnow()  # nor in the future
    assert asked <= in_cgroup_moment("soon", asked) <= utcnow()  # nothing usable: now
    assert asked <= in_cgroup_moment(True, asked) <= utcnow()
