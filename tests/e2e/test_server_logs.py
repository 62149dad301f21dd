"""End to end (embedded shape): each server writes its own log, and a failed start explains itself.

A researcher's `~/.jupyter/jupyter_server_config.py` is their code, and what it
prints is their text. Each test runs on a hub whose servers are forked warm (as
shipped) and on one whose servers start cold (new programs):

- a config that prints a distinctive line (wrapped in terminal escape sequences
  and HTML) and then fails the start: its owner sees that line, stripped, in the
  spawn's progress and on the home page (escaped), an admin through `gpulease
  logs`; another researcher gets 403 from api/logs and sees nothing of it;
- a config that writes to its stdout and stderr and truncates both leaves the
  hub's log intact (on main it could cut the hub's log to nothing);
- as root with per-user accounts: the log is root's, out of the server's
  account's reach, and no process of a server holds the hub's stdout or stderr.
"""

from __future__ import annotations

import json
import os
import stat
import time

import psutil
import pytest

from tests.support.hubproc import ADMIN_PW, HubProcess, password_of, run_in_kernel
from tests.support.isolation_env import hub_python

pytestmark = pytest.mark.e2e

HTTP_TIMEOUT_S = 30
MARK = "GPULEASE-MARK-7f3a"
PROFILES = """profiles:
  - {slug: cpu, display_name: CPU, cpu: 1, memory: 2Gi, images: [pytorch],
     price_per_hour: "1", min_run: 1s}
"""

# Prints the mark in red, with a window title, HTML and a carriage return, then fails as
# a broken config does: its import error's traceback, and the start ends.
FAILING_CONFIG = f"""
import sys, traceback
print("\\x1b[1;31m{MARK} <b>bold</b> & co\\x1b[0m", flush=True)
print("\\x1b]0;stolen title\\x07progress 10%\\rprogress 100%", file=sys.stderr, flush=True)
try:
    import gpulease_no_such_module_for_the_test
except ImportError:
    traceback.print_exc()
    raise SystemExit(3)
"""

# Writes to both of its outputs, truncates both, and lets the server run on.
TRUNCATING_CONFIG = """
import os
os.write(1, b"GPULEASE-TRUNC-OUT\\n")
os.write(2, b"GPULEASE-TRUNC-ERR\\n")
for _fd in (1, 2):
    try:
        os.ftruncate(_fd, 0)
        os.write(2, b"ftruncate %d worked\\n" % _fd)
    except OSError as _e:
        os.write(2, b"ftruncate %d refused: errno %d\\n" % (_fd, _e.errno))
"""


@pytest.fixture(scope="module", params=["warm", "cold"])
def hub(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"logs-{request.param}")
    (base / "profiles.yaml").write_text(PROFILES)
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--profiles={base / 'profiles.yaml'}", f"--Spawner.http_timeout={HTTP_TIMEOUT_S}",
        "--GPULeaseHub.failed_start_limit=0", "--GPULeaseHub.culler_enabled=False",
        f"--GPULeaseHub.warm_start={request.param == 'warm'}"]).start()
    h.admin_token = h.token_for("admin", ADMIN_PW)
    h.kind = request.param
    yield h
    h.close()


def configure(hub: HubProcess, user: str, config: str) -> None:
    """`config` in the user's home, as theirs (the home is made by their first start)."""
    home = hub.state / "homes" / user
    jupyter = home / ".jupyter"
    jupyter.mkdir(parents=True, exist_ok=True)
    (jupyter / "jupyter_server_config.py").write_text(config)
    owner = home.stat()
    for path in (jupyter, jupyter / "jupyter_server_config.py"):
        os.chown(path, owner.st_uid, owner.st_gid)


def failed_event(hub: HubProcess, user: str, token: str, timeout: float = 60) -> dict:
    """The failed event of the user's last start, as the spawn's progress page gets it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = hub.api("GET", f"users/{user}/server/progress", token)
        events = [json.loads(line[len("data:"):]) for line in r.text.splitlines()
                  if line.startswith("data:")]
        failed = [e for e in events if e.get("failed")]
        if failed:
            return failed[-1]
        time.sleep(0.3)
    raise AssertionError(f"no failed start of {user}:\n{hub.log()[-3000:]}")


def test_a_failed_start_shows_its_own_lines_to_its_owner_only(hub):
    admin = hub.admin_token
    token = hub.add_user(admin, "ada")
    hub.add_user(admin, "eve")
    configure(hub, "ada", FAILING_CONFIG)
    r = hub.api("POST", "users/ada/server", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202, 502), r.text
    event = failed_event(hub, "ada", token)
    message = event["message"]
    # the progress: the researcher's own line, stripped of what a terminal would obey
    assert "exited before it answered (exit status 3)" in message, message
    assert f"{MARK} <b>bold</b> & co" in message, message
    assert "ModuleNotFoundError: No module named 'gpulease_no_such_module_for_the_test'" \
        in message, message
    assert "progress 100%" in message and "progress 10%" not in message, message
    assert "\x1b" not in message and "stolen title" not in message and "\x07" not in message
    # ... and on its page (html_message), escaped: the text, never markup
    page = event["html_message"]
    assert f"{MARK} &lt;b&gt;bold&lt;/b&gt; &amp; co" in page and "<b>bold" not in page, page
    # the hub's log has gpulease's words, none of the server's lines
    assert MARK not in hub.log()

    # the home page, as ada sees it: the failure and its lines, escaped by the page
    ada = hub.signed_in("ada", password_of("ada"))
    home = ada.get(f"{hub.url}/hub/home", timeout=30)
    assert home.status_code == 200
    assert "Its last start failed" in home.text, home.text[-3000:]
    assert f"{MARK} &lt;b&gt;bold&lt;/b&gt; &amp;" in home.text and "<b>bold" not in home.text
    assert "gpulease_no_such_module_for_the_test" in home.text and "\x1b" not in home.text

    # an admin, through the CLI: the log, stripped
    shown = hub.cli("logs", "ada")
    assert shown.returncode == 0, shown.stderr
    assert f"{MARK} <b>bold</b> & co" in shown.stdout and "\x1b" not in shown.stdout
    assert "progress 100%" in shown.stdout and "stolen title" not in shown.stdout
    tail = hub.cli("logs", "ada", "--lines", "1")
    assert tail.stdout.strip().startswith("ModuleNotFoundError"), tail.stdout

    # another researcher: 403 from the API, nothing on their home page
    eve_token = hub.token_for("eve", password_of("eve"))
    r = hub.service("GET", "api/logs/ada", eve_token)
    assert r.status_code == 403 and "owner" in r.json()["message"], r.text
    eve = hub.signed_in("eve", password_of("eve"))
    assert MARK not in eve.get(f"{hub.url}/hub/home", timeout=30).text
    # her own log through the API: hers to read (and a bad name names the rule)
    assert hub.service("GET", "api/logs/ada", token).status_code == 200
    r = hub.service("GET", "api/logs/ada/Not_A_Server", admin)
    assert r.status_code == 400 and "server name" in r.json()["message"], r.text
    r = hub.service("GET", "api/logs/eve", admin)
    assert r.status_code == 404 and "no log" in r.json()["message"], r.text


def server_processes(user: str, hub: HubProcess) -> list[psutil.Process]:
    """The processes of `user`'s server: those whose environment names them and this hub."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("JUPYTERHUB_USER") == user and str(hub.state) in env.get("HOME", ""):
            found.append(proc)
    return found


def open_files(pid: int) -> dict[int, str]:
    held = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return held


def test_a_server_that_truncates_its_output_leaves_the_hubs_log_intact(hub):
    admin = hub.admin_token
    token = hub.add_user(admin, "bob")
    configure(hub, "bob", TRUNCATING_CONFIG)
    before = hub.log()
    assert len(before) > 1000
    url = hub.start_servers("bob", token, {"": {"profile": "cpu"}}, timeout=90)[""]["url"]
    after = hub.log()
    assert after.startswith(before), "the hub's log was cut while bob's server started"
    assert "GPULEASE-TRUNC" not in after
    shown = hub.cli("logs", "bob")
    assert "GPULEASE-TRUNC-OUT" in shown.stdout and "GPULEASE-TRUNC-ERR" in shown.stdout
    assert "ftruncate 1 refused: errno 22" in shown.stdout, shown.stdout  # a pipe: EINVAL

    # no process of the server holds the hub's stdout or stderr (its log file)
    hub_outputs = {os.readlink(f"/proc/{hub.proc.pid}/fd/{n}") for n in (1, 2)}
    assert str(hub.log_path) in hub_outputs
    procs = server_processes("bob", hub)
    assert procs, "bob's server processes were not found"
    for proc in procs:
        held = set(open_files(proc.pid).values())
        assert not hub_outputs & held, (proc.pid, held)
    # the server's stdout and stderr are its log writer's pipe; the writer is the hub's
    # account's, in a session of its own (a Ctrl-C of the hub does not reach it)
    log = hub.state / "logs" / "servers" / "bob" / "_default.log"
    (writer,) = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
                 and "gpulease.host.server_log_writer" in p.info["cmdline"]
                 and str(log) in p.info["cmdline"]]
    assert writer.uids().effective == os.geteuid()
    assert os.getsid(writer.pid) not in (os.getsid(hub.proc.pid), *(os.getsid(p.pid)
                                                                     for p in procs))
    (server,) = [p for p in procs if "gpulease-singleuser" in " ".join(p.cmdline())]
    out = open_files(server.pid)
    assert out[1] == out[2] == open_files(writer.pid)[0] and out[1].startswith("pipe:"), out
    st = log.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_uid == os.geteuid()
    if os.geteuid() == 0 and not hub_python()[1]:
        # per-user accounts: the server's own account cannot read, write or truncate it
        said = run_in_kernel(hub.url, url, token, (
            "import os\nfor mode in ('r', 'a'):\n    try:\n"
            f"        open({str(log)!r}, mode); print('opened', mode)\n"
            "    except PermissionError:\n        print('refused', mode)\n"
            "print(os.getuid())"))
        refused, uid = said.strip().rsplit("\n", 1)
        assert refused.split("\n") == ["refused r", "refused a"], said
        assert int(uid) != 0 and int(uid) != st.st_uid
    hub.api("DELETE", "users/bob/server", token)
    hub.wait_server_stopped("bob", token)


def writers_of(log) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
            and "gpulease.host.server_log_writer" in p.info["cmdline"]
            and str(log) in p.info["cmdline"]]


def test_a_deleted_server_takes_its_logs_and_its_writer_with_it(hub):
    """A named server deleted (and a user) leaves no log behind: else creating, starting
    and deleting names without end would fill the disk with the hub's files, beyond any
    quota of the researcher's account. While it runs the hub holds no end of its log's
    pipe (its writer could never end); once stopped, its writer has ended."""
    admin = hub.admin_token
    token = hub.add_user(admin, "cid")
    configure(hub, "cid", "print('GPULEASE-DELETED-MARK', flush=True)\n")
    hub.start_servers("cid", token, {"n1": {"profile": "cpu"}}, timeout=90)
    folder = hub.state / "logs" / "servers" / "cid"
    log = folder / "n1.log"
    (writer,) = writers_of(log)
    pipe = open_files(writer.pid)[0]
    assert pipe.startswith("pipe:") and pipe not in open_files(hub.proc.pid).values()
    hub.api("DELETE", "users/cid/servers/n1", token)
    hub.wait_server_stopped("cid", token, "n1")
    writer.wait(30)  # the server's last process gone: its writer ended, the hub reaped it
    assert not writers_of(log)
    assert "GPULEASE-DELETED-MARK" in log.read_text()
    (folder / "n1.log.1").write_text("an earlier start\n")
    r = hub.api("DELETE", "users/cid/servers/n1", token, {"remove": True})
    assert r.status_code == 204, r.text
    assert not folder.exists(), sorted(p.name for p in folder.iterdir())  # cid's only server
    # a server renamed takes its logs to its new name: none is left under the old one,
    # where no deletion would find them
    hub.start_servers("cid", token, {"n2": {"profile": "cpu"}}, timeout=90)
    hub.api("DELETE", "users/cid/servers/n2", token)
    hub.wait_server_stopped("cid", token, "n2")
    r = hub.api("PATCH", "users/cid/servers/n2", token, {"name": "n3"})
    assert r.status_code == 200, r.text
    assert sorted(p.name for p in folder.iterdir()) == ["n3.log"]
    assert "GPULEASE-DELETED-MARK" in hub.service("GET", "api/logs/cid/n3", token).json()["log"]
    r = hub.api("DELETE", "users/cid/servers/n3", token, {"remove": True})
    assert r.status_code == 204, r.text
    assert not folder.exists(), sorted(p.name for p in folder.iterdir())


# Writes a numbered line every 0.1 s for as long as the server runs.
TICKING_CONFIG = """
import os, threading, time
def _tick():
    n = 0
    while True:
        os.write(1, b"GPULEASE-TICK %d\\n" % n)
        n += 1
        time.sleep(0.1)
threading.Thread(target=_tick, daemon=True).start()
"""


def ticks(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines()
            if line.startswith("GPULEASE-TICK ")]


def test_a_server_and_its_writer_outlive_a_killed_hub_and_the_next_hub_adds_none(tmp_path):
    """The hub killed (SIGKILL) while a server writes: its writer writes on (the server's
    writes never fail), the restarted hub starts no second writer, nothing is written
    twice or lost, and the server's stop ends its writer, which leaves no zombie."""
    (tmp_path / "profiles.yaml").write_text(PROFILES)
    h = HubProcess(state=tmp_path / "state", admin_password=ADMIN_PW, extra_args=[
        f"--profiles={tmp_path / 'profiles.yaml'}", "--GPULeaseHub.culler_enabled=False"])
    h.start()
    try:
        admin = h.token_for("admin", ADMIN_PW)
        token = h.add_user(admin, "dan")
        configure(h, "dan", TICKING_CONFIG)
        h.start_servers("dan", token, {"": {"profile": "cpu"}}, timeout=90)
        log = h.state / "logs" / "servers" / "dan" / "_default.log"
        (writer,) = writers_of(log)
        h.kill()
        seen = len(ticks(log.read_text()))
        time.sleep(1.5)
        assert writer.is_running() and writer.status() != psutil.STATUS_ZOMBIE
        assert len(ticks(log.read_text())) > seen + 5, "the server's output stopped"
        h.start()
        assert writers_of(log) == [writer]
        assert h.api("GET", "users/dan", token).json()["servers"][""]["ready"]
        assert h.api("DELETE", "users/dan/server", token).status_code in (202, 204)
        h.wait_server_stopped("dan", token)
        writer.wait(30)  # ended; reaped by init, not left a zombie of the dead hub
        numbers = ticks(log.read_text())
        assert numbers == list(range(len(numbers))) and len(numbers) > 20, numbers[-5:]
        assert "GPULEASE-TICK" not in h.log()
    finally:
        h.close()
