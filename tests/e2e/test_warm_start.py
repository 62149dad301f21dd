"""End to end: servers forked warm hold nothing of the hub, and their first kernel is waiting.

A real `gpulease up` as root with per-user accounts and cgroups (CI): ada's
and bob's servers are forked by the warm launcher (spawners/local/warm_start.py).
What ada's server holds is read from /proc as root: its memory and its open
descriptors. The kernel started with the server (singleuser/kernel_pool.py)
is looked for in the listings and asked for the way JupyterLab asks. A second
hub with GPULeaseHub.warm_start = False says so and starts servers cold.
The isolation tests (tests/e2e/test_isolation.py) run on the warm path too:
it is the default.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import time
from pathlib import Path
from urllib.parse import urljoin

import psutil
import pytest
import requests

from tests.support.hubproc import (
    ADMIN_PW,
    HubOptions,
    HubProcess,
    execute_over_websocket,
    run_in_kernel,
)
from tests.support.isolation_env import isolation_gate
from tests.support.processes import process_memory

pytestmark, _runs_where_it_must = isolation_gate()


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(args=["--GPULeaseHub.culler_enabled=False"])


def started(hub, admin, name: str) -> tuple[str, str]:
    token = hub.add_user(admin, name)
    url = hub.start_servers(name, token, {"": {}})[""]["url"]
    return token, url


@pytest.fixture(scope="module")
def ada(hub, admin):
    return started(hub, admin, "ada")


@pytest.fixture(scope="module")
def bob(hub, admin):
    return started(hub, admin, "bob")


def server_pid(hub, who) -> int:
    token, url = who
    return int(run_in_kernel(hub.url, url, token, "import os; print(os.getppid())").strip())


def launcher_pid(hub) -> int:
    found = re.findall(r"warm launcher (\d+) ready", hub.log())
    assert found, hub.log()[-3000:]
    return int(found[-1])


def environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def tree(pid: int) -> set[int]:
    """pid and every process below it."""
    return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}


def open_files(pid: int) -> dict[int, str]:
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return out


def test_hub_says_at_start_that_servers_are_forked_warm(hub, ada, bob):
    log = hub.log()
    assert "Warm starts: on" in log
    assert len(re.findall(r"Spawning \S+gpulease-singleuser.* \(forked by warm launcher \d+\)",
                          log)) >= 2, log[-3000:]


def test_a_warm_server_holds_no_hub_secret_in_memory_or_descriptors(hub, ada, bob):
    pid = server_pid(hub, ada)
    uid = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]
    assert pwd.getpwuid(int(uid)).pw_name == "gl-ada"
    mine = tree(pid)
    private = hub.state / "private"
    secrets = hub.secrets()
    # Every API token of another process: bob's server, the gpulease services, the hub.
    for other in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if other in mine:
            continue
        try:
            env = environ(other)
        except psutil.Error:
            continue
        for key in ("JUPYTERHUB_API_TOKEN", "CONFIGPROXY_AUTH_TOKEN", "GPULEASE_TOKEN"):
            if len(env.get(key, "")) >= 16:
                secrets[f"{key} of pid {other} ({env.get('USER', '?')})"] = env[key]
    assert any(k.startswith("JUPYTERHUB_API_TOKEN") and "gl-bob" in k for k in secrets), secrets
    memory = process_memory(pid)
    assert len(memory) > 10_000_000  # the whole server was read
    own = run_in_kernel(hub.url, ada[1], ada[0],
                        "import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
    assert own.encode() in memory  # the scan finds a token where one is
    found = [what for what, secret in secrets.items() if secret.encode() in memory]
    assert not found, f"in the memory of ada's warm server: {found}"

    # Its descriptors: none shared with the hub or the launcher but stdio, none on the
    # hub's databases or private folder.
    theirs = {target for p in (hub.proc.pid, launcher_pid(hub))
              for fd, target in open_files(p).items() if fd > 2}
    files = open_files(pid)
    # (anon_inode:[eventpoll] names a kind, not an object; tests/integration/host/test_warm_start.py
    # checks that a forked child starts with stdio only)
    shared = {fd: target for fd, target in files.items()
              if fd > 2 and target in theirs and not target.startswith("anon_inode:")}
    assert not shared, f"ada's server shares these with the hub or the launcher: {shared}"
    private_files = {fd: t for fd, t in files.items() if str(private) in t or t.endswith(".sqlite")}
    assert not private_files


def test_a_researcher_can_look_at_their_own_warm_server_as_at_a_cold_one(hub, ada):
    """Dropping to the account without an exec leaves a process undumpable, its /proc
    files root's: the forked server is made dumpable again, as an exec would."""
    token, url = ada
    seen = run_in_kernel(hub.url, url, token, (
        "import os; p = os.getppid(); st = os.stat(f'/proc/{p}/status'); "
        "print(st.st_uid == os.getuid(), len(os.listdir(f'/proc/{p}/fd')) > 3)"))
    assert seen.split() == ["True", "True"]


def test_ps_shows_a_warm_server_as_a_cold_one(hub, ada):
    """/proc/PID/cmdline and environ are the server's, not the launcher's."""
    pid = server_pid(hub, ada)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1].endswith(b"/gpulease-singleuser"), cmdline
    assert b"warm_launcher" not in b" ".join(cmdline)
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "gpulease-single"  # as exec'd
    env = environ(pid)
    assert env["USER"] == "gl-ada" and env["JUPYTERHUB_USER"] == "ada"
    assert "GPULEASE_WARM_ROOM" not in env and env["HOME"] != "/nonexistent"


def test_the_kernel_started_with_the_server_is_unseen_until_asked_for(hub, admin):
    token, url = started(hub, admin, "cy")
    api = urljoin(f"{hub.url}/", url) + "api"
    headers = {"Authorization": f"token {token}"}
    assert requests.get(f"{api}/kernels", headers=headers, timeout=30).json() == []
    handed_out = hub.server_log("cy").count("(started with the server)")
    first = requests.post(f"{api}/kernels", json={"name": "python3"}, headers=headers,
                          timeout=30).json()
    assert f"Kernel started: {first['id']} (started with the server)" in hub.server_log("cy")
    assert [k["id"] for k in requests.get(f"{api}/kernels", headers=headers,
                                          timeout=30).json()] == [first["id"]]
    ws = api.replace("http://", "ws://") + f"/kernels/{first['id']}/channels"
    assert execute_over_websocket(ws, "print(1+1)", headers).strip() == "2"
    second = requests.post(f"{api}/kernels", json={"name": "python3"}, headers=headers,
                           timeout=30).json()
    assert second["id"] != first["id"]  # a pool of one: the next is started as usual
    assert hub.server_log("cy").count("(started with the server)") == handed_out + 1


def test_a_notebook_gets_the_pooled_kernel_named_for_it(hub, admin):
    token, url = started(hub, admin, "dee")
    api = urljoin(f"{hub.url}/", url) + "api"
    headers = {"Authorization": f"token {token}"}
    notebook = "analysis-\U0001f600.ipynb"  # a name beyond the BMP: a literal, not JSON
    r = requests.post(f"{api}/sessions", headers=headers, timeout=60, json={
        "path": notebook, "name": notebook, "type": "notebook",
        "kernel": {"name": "python3"}})
    assert r.status_code == 201, r.text
    kernel_id = r.json()["kernel"]["id"]
    assert f"Kernel started: {kernel_id} (started with the server)" in hub.server_log("dee")
    ws = api.replace("http://", "ws://") + f"/kernels/{kernel_id}/channels"
    seen = json.loads(execute_over_websocket(
        ws, "import os, json; print(json.dumps([os.environ.get('JPY_SESSION_NAME'), "
            "__session__, os.getcwd()]))", headers))
    home = str(hub.state / "homes" / "dee")
    assert seen == [f"{home}/{notebook}", f"{home}/{notebook}", home]


def test_warm_start_off_says_so_and_starts_cold(tmp_path):
    h = HubProcess(state=tmp_path / "state", admin_password=ADMIN_PW, extra_args=[
        "--GPULeaseHub.culler_enabled=False", "--GPULeaseHub.warm_start=False"]).start()
    try:
        admin = h.token_for("admin", ADMIN_PW)
        token, url = started(h, admin, "eve")
        assert run_in_kernel(h.url, url, token, "print(6*7)").strip() == "42"
        log = h.log()
        assert "Warm starts: off, warm starts are off (GPULeaseHub.warm_start)" in log
        assert "forked by warm launcher" not in log and "warm launcher" not in log
    finally:
        h.close()


def test_a_first_kernel_asked_for_elsewhere_shuts_the_pooled_one_down(hub, admin):
    """Unlisted, the pooled kernel could not be stopped by the researcher: once the first
    kernel asked for is another (here: in a sub-folder), it goes."""
    token, url = started(hub, admin, "fay")
    api = urljoin(f"{hub.url}/", url) + "api"
    headers = {"Authorization": f"token {token}"}
    r = requests.put(f"{api}/contents/sub", json={"type": "directory"}, headers=headers,
                     timeout=30)
    assert r.status_code in (200, 201), r.text
    kernel = requests.post(f"{api}/kernels", json={"name": "python3", "path": "sub"},
                           headers=headers, timeout=60).json()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(kernels_of("gl-fay")) != 1:
        time.sleep(0.2)
    assert len(kernels_of("gl-fay")) == 1, kernels_of("gl-fay")
    assert "shutting down the kernel started with the server: the first kernel asked for " \
        "is another" in hub.server_log("fay")
    ws = api.replace("http://", "ws://") + f"/kernels/{kernel['id']}/channels"
    assert execute_over_websocket(ws, "import os; print(os.path.basename(os.getcwd()))",
                                  headers).strip() == "sub"


def kernels_of(account: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["username", "cmdline"])
            if p.info["username"] == account
            and any("ipykernel_launcher" in arg for arg in p.info["cmdline"] or ())]
