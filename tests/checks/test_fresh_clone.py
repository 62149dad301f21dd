"""`make run` from a fresh clone, as a newcomer runs the README's first command.

Two newcomers: root with the clone in a 0700 folder (what /root is), whose
per-user accounts cannot pass into it; and a normal user with the clone in
their 0700 home. Each runs the Makefile's real `run` target in a clone of
this checkout as it stands (tracked and new files), up to a hub that serves
and a server that answers through the proxy, started as the account it must
run as. Installing is what `make install` does and takes minutes; here the
clone's .venv is the project's own, hard-linked in and pointed at the clone
(`_moved_venv`), and its install stamps are set, so `make run` goes straight
to `gpulease up`. A full `make run` from an empty clone is a manual check.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.support.hubproc import HubProcess, free_port, require_chp
from tests.support.isolation_env import shared_tmpdir

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PW = "fresh-clone-admin-pw"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="makes accounts and 0700 folders as root"),
    pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "gpulease").exists(),
                       reason="needs the project's .venv (`make install`)"),
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="clones this checkout with git"),
]


def _clone(parent: Path) -> Path:
    """`git clone` of this checkout, with its working tree's changes and new files laid over."""
    clone = parent / "gpulease"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=60)
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, capture_output=True, timeout=60)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, target = ROOT / name, clone / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif not source.exists() and target.exists():
            target.unlink()  # deleted in the working tree
    return clone


def _moved_venv(clone: Path) -> None:
    """The project's .venv, as if `make install` had built it in `clone`.

    Hard links (no space, a second) of every file; the few that name the
    project's folder (the editable install's finder, the scripts' #! lines)
    are written anew naming the clone's, so the clone's code is what runs.
    """
    venv = clone / ".venv"
    subprocess.run(["cp", "-al", str(ROOT / ".venv"), str(venv)], check=True, timeout=120)
    old, new = str(ROOT), str(clone)
    site = next(venv.glob("lib/python3*/site-packages"))
    for path in [*site.glob("__editable__*finder.py"), *(venv / "bin").iterdir()]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old.encode() not in data[:4096]:
            continue
        replacement = path.with_name(path.name + ".moved")  # never write through a hard link
        replacement.write_bytes(data.replace(old.encode(), new.encode()))
        replacement.chmod(path.stat().st_mode & 0o7777)
        os.replace(replacement, path)
    for name in ("node_modules",):  # configurable-http-proxy, installed with npm
        subprocess.run(["cp", "-al", str(ROOT / name), str(clone / name)], check=True, timeout=60)
    (venv / ".installed").touch()  # what `make install` leaves: the run target goes on
    (clone / "node_modules" / ".installed").touch()


class MakeRun(HubProcess):
    """`make run` in a session of its own: Ctrl-C reaches make and the hub, as in a terminal."""

    def interrupt(self, timeout: float = 60) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def _make_run(clone: Path, as_user: str | None = None) -> MakeRun:
    """The README's `make run` in `clone` (as `as_user`, else root), once the hub serves."""
    hub = MakeRun(state=clone / ".gpulease", admin_password=ADMIN_PW)
    hub.port, hub_port, api_port = free_port(), free_port(), free_port()
    args = (f"--port={hub.port} --JupyterHub.hub_port={hub_port} "
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{api_port} "
            "--GPULeaseHub.culler_enabled=False")
    env = {"PATH": os.environ["PATH"], "GPULEASE_ADMIN_PASSWORD": ADMIN_PW, "LANG": "C.UTF-8"}
    command = ["make", "--no-print-directory", "run", f"ARGS={args}"]
    if as_user:
        home = pwd.getpwnam(as_user).pw_dir
        env.update(HOME=home, USER=as_user, LOGNAME=as_user)
        command = ["runuser", "-u", as_user, "--", *command]
    else:
        env["HOME"] = str(clone.parent)
    hub.log_path = clone.parent.parent / f"make-run-{uuid.uuid4().hex[:6]}.log"
    hub._log = open(hub.log_path, "wb")
    hub.proc = subprocess.Popen(command, cwd=clone, env=env, stdout=hub._log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        hub.wait_ready(120)
    except BaseException:
        hub.close()
        raise
    return hub


def _banner(hub: HubProcess, what: str) -> str:
    """A line of what `gpulease up` says at start, after `what: `."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(rf"^{re.escape(what)}: (.+)$", hub.log(), re.M)
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise AssertionError(f"`gpulease up` did not say its {what}:\n{hub.log()[-3000:]}")


def _server_process(user: str) -> psutil.Process:
    """The running `gpulease-singleuser` of hub user `user`."""
    for proc in psutil.process_iter(["cmdline", "environ"]):
        cmd = proc.info["cmdline"] or []
        if any(part.endswith("/gpulease-singleuser") for part in cmd[:2]) and (
                (proc.info["environ"] or {}).get("JUPYTERHUB_USER") == user):
            return proc
    raise AssertionError(f"no gpulease-singleuser process of {user}")


def _start_a_server(hub: HubProcess, name: str) -> psutil.Process:
    admin = hub.token_for("admin", ADMIN_PW)
    token = hub.add_user(admin, name)
    hub.start_servers(name, token, {"": {"profile": "cpu"}}, timeout=120)
    return _server_process(name)


def test_make_run_as_root_from_a_clone_in_a_0700_folder(tmp_path):
    """A clone under /root: the state and the servers' environment go where the per-user
    accounts can reach them, per-user isolation stays on, and `up` says where all is."""
    require_chp()
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    clone = _clone(home)
    _moved_venv(clone)
    name = f"fc{uuid.uuid4().hex[:6]}"
    hub = state = None
    try:
        hub = _make_run(clone)
        state = Path(_banner(hub, "State folder").split(" (")[0])
        key = clone.name + "-"
        assert state.parent == Path("/var/lib/gpulease") and state.name.startswith(key), state
        assert not (clone / ".gpulease").exists()  # nothing left the accounts cannot reach
        server_env = _banner(hub, "Server environment")
        assert server_env.startswith(f"{state}/server-env, a copy of {clone}/.venv"), server_env
        assert "Users: each runs as their own Unix account (gl-NAME" in hub.log()
        assert f"gpulease is running at http://localhost:{hub.port}/" in hub.log()

        # the CLI, run in the clone, finds the hub where `up` put its state
        cli = subprocess.run([str(clone / ".venv" / "bin" / "gpulease"), "inventory"], cwd=clone,
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "GPULEASE_STATE"})
        assert cli.returncode == 0 and "own Unix account" in cli.stdout, cli.stderr

        server = _start_a_server(hub, name)
        account = pwd.getpwnam(f"gl-{name}")
        assert server.uids().real == account.pw_uid, (server.uids(), account)
        assert server.cmdline()[0].startswith(f"{state}/server-env/bin/"), server.cmdline()
        assert server.cwd() == str(state / "homes" / name)
    finally:
        if hub:
            hub.close()
        subprocess.run(["userdel", f"gl-{name}"], capture_output=True)
        subprocess.run(["groupdel", f"gl-{name}"], capture_output=True)
        if state and state.parent == Path("/var/lib/gpulease"):
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def newcomer():
    """A throwaway normal account whose home (0700, its own) is in a folder it can pass."""
    name = f"glfc{uuid.uuid4().hex[:6]}"
    home = shared_tmpdir("newcomer-") / name
    subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
                    str(home), "--shell", "/bin/sh", name], check=True, timeout=30)
    home.mkdir(mode=0o700)
    shutil.chown(home, name, name)
    home.chmod(0o700)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)
        shutil.rmtree(home.parent, ignore_errors=True)


def test_make_run_as_a_normal_user_from_their_0700_home(newcomer):
    require_chp()
    home = Path(newcomer.pw_dir)
    clone = _clone(home)
    subprocess.run(["chown", "-R", f"{newcomer.pw_uid}:{newcomer.pw_gid}", str(clone)],
                   check=True, timeout=60)  # before the .venv's links, which stay root's
    _moved_venv(clone)
    hub = None
    try:
        hub = _make_run(clone, as_user=newcomer.pw_name)
        assert _banner(hub, "State folder").startswith(f"{clone}/.gpulease (")
        assert _banner(hub, "Server environment") == f"{clone}/.venv (gpulease's own)"
        assert "the hub does not run as root" in hub.log()
        server = _start_a_server(hub, "ada")
        assert server.uids().real == newcomer.pw_uid
        assert server.cwd() == str(clone / ".gpulease" / "homes" / "ada")
    finally:
        if hub:
            hub.close()
