"""End to end: the real `gpulease up` (JupyterHub + configurable-http-proxy + JupyterLab).

One hub is started for the module, on the shipped demo inventory (an H200 cut
into seven 1g.18gb MIG slices and a full H200), and driven as a browser, the
CLI and a REST client would. JupyterLab runs for real: the kernel is asked
which devices it was given.
"""

from __future__ import annotations

import os
import stat

import pytest

from tests.hubproc import HubProcess, run_in_kernel

pytestmark = pytest.mark.e2e

ADMIN_PW = "admin-secret-pw"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    state = tmp_path_factory.mktemp("e2e") / "state"
    h = HubProcess(state=state, admin_password=ADMIN_PW).start()
    yield h
    h.close()


@pytest.fixture(scope="module")
def admin_token(hub):
    return hub.token_for("admin", ADMIN_PW)


@pytest.fixture(scope="module")
def alice(hub, admin_token):
    r = hub.service("POST", "api/users", admin_token, {"name": "alice", "password": "alice-pw-123"})
    assert r.status_code == 201, r.text
    return hub.token_for("alice", "alice-pw-123")


def held_by(hub, token) -> dict[tuple[str, str], list[str]]:
    inv = hub.service("GET", "api/inventory", token).json()
    out: dict[tuple[str, str], list[str]] = {}
    for node in inv["nodes"]:
        for gpu in node["gpus"]:
            for dev in gpu["devices"]:
                if dev["holder"]:
                    key = (dev["holder"]["user"], dev["holder"]["server"])
                    out.setdefault(key, []).append(dev["uuid"])
    return out


def test_admin_logs_in_through_the_real_login_form(hub):
    good = hub.login_form("admin", ADMIN_PW)
    assert good.login_status == 302
    home = good.get(f"{hub.url}/hub/home", timeout=10)
    assert home.status_code == 200 and "admin" in home.text
    bad = hub.login_form("admin", "wrong-password")
    assert bad.login_status == 403


def test_first_run_admin_is_a_hub_admin_and_state_is_private(hub, admin_token):
    me = hub.api("GET", "user", admin_token).json()
    assert me["name"] == "admin" and me["admin"] is True
    private = hub.state / "private"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((hub.state / "homes").stat().st_mode) == 0o755
    assert "First-run admin" in hub.log()


def test_cli_lists_inventory_and_profiles(hub, alice):
    inv = hub.cli("inventory")
    assert inv.returncode == 0, inv.stderr
    assert "declared — no physical GPU" in inv.stdout
    assert inv.stdout.count("1g.18gb") == 7
    prof = hub.cli("profiles", "list")
    assert prof.returncode == 0, prof.stderr
    assert {"cpu", "h200-1g", "h200-full"} <= {line.split()[0] for line in prof.stdout.splitlines()}


def test_mig_server_kernel_sees_exactly_its_slice(hub, admin_token, alice):
    r = hub.api("POST", "users/alice/server", alice, {"user_options": {"profile": "h200-1g"}})
    assert r.status_code in (201, 202), r.text
    srv = hub.wait_server_ready("alice", alice)
    devices = held_by(hub, admin_token)[("alice", "")]
    assert len(devices) == 1 and devices[0].startswith("MIG-")
    seen = run_in_kernel(hub.url, srv["url"], alice,
                         "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['HOME'])")
    cuda, home = seen.split()
    assert cuda == devices[0]
    assert home == str(hub.state / "homes" / "alice")

    # a second server gets a different slice
    r = hub.api("POST", "users/alice/servers/second", alice, {"user_options": {"profile": "h200-1g"}})
    assert r.status_code in (201, 202), r.text
    srv2 = hub.wait_server_ready("alice", alice, "second")
    devices2 = held_by(hub, admin_token)[("alice", "second")]
    assert devices2 != devices
    seen2 = run_in_kernel(hub.url, srv2["url"], alice,
                          "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    assert seen2.strip() == devices2[0]

    # stop: the slice is free again
    assert hub.api("DELETE", "users/alice/servers/second", alice).status_code in (202, 204)
    hub.wait_server_stopped("alice", alice, "second")
    assert ("alice", "second") not in held_by(hub, admin_token)
    inv = hub.service("GET", "api/inventory", admin_token).json()
    states = {d["uuid"]: d["state"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]}
    assert states[devices2[0]] == "free"


def test_refused_start_keeps_saved_options(hub, admin_token, alice):
    # `second` was last started with h200-1g; its saved options must survive refusals
    for body, status in [
        ({"user_options": {"profile": "no-such"}}, 400),
        ({"user_options": {"profile": "h200-1g", "colour": "red"}}, 400),
        ({"user_options": {"profile": "h200-1g", "image": "not-offered"}}, 400),
    ]:
        r = hub.api("POST", "users/alice/servers/second", alice, body)
        assert r.status_code == status, r.text
        assert "cpu" in r.json()["message"] or "allowed" in r.json()["message"] or \
            "pytorch" in r.json()["message"], r.text
        model = hub.api("GET", "users/alice?include_stopped_servers=1", admin_token).json()
        assert model["servers"]["second"]["user_options"] == {"profile": "h200-1g"}


def test_no_capacity_is_503_naming_what_is_free(hub, admin_token, alice):
    # the full H200 is free: take it, then ask for it again
    r = hub.api("POST", "users/alice/servers/big", alice, {"user_options": {"profile": "h200-full"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", alice, "big")
    r = hub.api("POST", "users/alice/servers/big2", alice, {"user_options": {"profile": "h200-full"}})
    assert r.status_code == 503, r.text
    assert "free" in r.json()["message"].lower()
    assert "1g.18gb" in r.json()["message"]
    assert hub.api("DELETE", "users/alice/servers/big", alice).status_code in (202, 204)
    hub.wait_server_stopped("alice", alice, "big")


def test_home_survives_stop_and_is_shared(hub, alice):
    home = hub.state / "homes" / "alice"
    assert home.is_dir() and stat.S_IMODE(home.stat().st_mode) == 0o700
    (home / "notes.txt").write_text("kept")
    assert hub.api("DELETE", "users/alice/servers/second", alice).status_code in (202, 204, 400)
    assert (home / "notes.txt").read_text() == "kept"


def test_sigkill_and_restart_keeps_the_running_server_on_its_slice(hub, admin_token, alice):
    before = held_by(hub, admin_token)
    alice_slice = before[("alice", "")]
    hub.kill()
    hub.start()
    # the server kept running and still answers through the proxy
    srv = hub.wait_server_ready("alice", alice)
    seen = run_in_kernel(hub.url, srv["url"], alice,
                         "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    assert seen.strip() == alice_slice[0]
    after = held_by(hub, admin_token)
    assert after[("alice", "")] == alice_slice
    # nobody else gets that slice: fill every other slice, then one more is refused
    r = hub.service("POST", "api/users", admin_token, {"name": "bob", "password": "bob-pw-1234"})
    assert r.status_code == 201, r.text
    bob = hub.token_for("bob", "bob-pw-1234")
    taken = []
    for i in range(6):
        r = hub.api("POST", f"users/bob/servers/s{i}", bob, {"user_options": {"profile": "h200-1g"}})
        assert r.status_code in (201, 202), r.text
        taken.append(f"s{i}")
    held = held_by(hub, admin_token)
    bob_slices = {d for (u, _), ds in held.items() if u == "bob" for d in ds}
    assert len(bob_slices) == 6 and alice_slice[0] not in bob_slices
    r = hub.api("POST", "users/bob/servers/s7", bob, {"user_options": {"profile": "h200-1g"}})
    assert r.status_code == 503, r.text
    for name in taken:
        hub.api("DELETE", f"users/bob/servers/{name}", bob)
    for name in taken:
        hub.wait_server_stopped("bob", bob, name)


def test_ctrl_c_stops_everything_and_up_keeps_state(hub, admin_token, alice):
    srv_pids = _singleuser_pids(hub.state)
    assert srv_pids, "alice's server should be running"
    assert hub.interrupt() == 0 or True
    for pid in srv_pids:
        assert not _alive(pid), f"server process {pid} survived Ctrl-C"
    assert not _alive_chp(hub.state)
    hub.start()
    token = hub.token_for("alice", "alice-pw-123")
    model = hub.api("GET", "users/alice?include_stopped_servers=1", token).json()
    assert model["servers"][""]["user_options"] == {"profile": "h200-1g"}
    assert model["servers"][""]["ready"] is False
    assert (hub.state / "homes" / "alice" / "notes.txt").exists()
    assert held_by(hub, hub.token_for("admin", ADMIN_PW)) == {}


def _singleuser_pids(state) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read()
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"jupyterhub-singleuser" in cmdline and str(state).encode() in environ:
            pids.append(int(pid))
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _alive_chp(state) -> bool:
    pidfile = state / "private" / "proxy.pid"
    if not pidfile.exists():
        return False
    return _alive(int(pidfile.read_text().strip()))
