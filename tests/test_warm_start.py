"""The warm launcher and its children, without a hub (spawners/warm_start.py,
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
import sys
import time
from pathlib import Path

import pytest

from gpulease.spawners.process_spec import warm_request, why_not_warm
from gpulease.spawners.warm_start import WarmLauncher, WarmStartError
from tests.isolation_env import shared_tmpdir
from tests.processes import process_memory


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
        while os.readlink(f"/proc/{child.pid}/exe").endswith("sh") and \
                time.monotonic() < deadline:
            time.sleep(0.02)  # until the shell has exec'd sleep
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{child.pid}/fd")) == [0, 1, 2]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)


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
    request = shell("exit 0", tmp_path)
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
    from gpulease.spawners import warm_start

    monkeypatch.setattr(warm_start, "_launchers", {})
    broken = str(tmp_path / "no-python")
    first, known = warm_start.launcher_for(broken, {})
    assert not known and first.failure.startswith("cannot run")
    again, known = warm_start.launcher_for(broken, {})
    assert again is first and known
    with pytest.raises(warm_start.WarmUnavailable, match="cannot run"):
        again.spawn({"argv": ["x"]}, wait_ready=1)
    monkeypatch.setattr(warm_start, "RETRY_AFTER_S", 0.0)
    retried, known = warm_start.launcher_for(broken, {})
    assert retried is not first and not known


def test_why_cold_names_an_import_time_difference():
    from gpulease.singleuser.warm_child import _why_cold

    base = {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    assert "LANG" in _why_cold({**base, "LANG": "de_DE.UTF-8"}, base)
    assert "PYTHONPATH" in _why_cold({**base, "PYTHONPATH": "/home/x"}, base)
    assert "JUPYTERHUB_SINGLEUSER_APP" in _why_cold(
        {**base, "JUPYTERHUB_SINGLEUSER_APP": "notebook"}, base)
