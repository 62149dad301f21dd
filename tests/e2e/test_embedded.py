"""End to end: the real `gpulease up` (JupyterHub + configurable-http-proxy + JupyterLab).

One hub is started for the module, on the shipped demo inventory (an H200 cut
into seven 1g.18gb MIG slices and a full H200), and driven as a browser, the
CLI and a REST client would. JupyterLab runs for real: the kernel is asked
which devices it was given.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml

from tests.support.hubproc import ADMIN_PW, HubOptions, run_in_kernel

pytestmark = pytest.mark.e2e



# A user config file laid over gpulease's defaults: fast death detection and a
# short lockout, so the tests below need not wait minutes.
USER_CONFIG = """
c.Spawner.poll_interval = 1
c.LocalAccountsAuthenticator.max_failures = 3
c.LocalAccountsAuthenticator.lockout_seconds = 4
"""


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    # No queue: a start without capacity is refused at once (tests/e2e/test_queue.py
    # covers the queue). alice keeps a named server of each test here, more than the
    # default 5 (tests/e2e/test_user_limits.py attacks that limit).
    return HubOptions(config=USER_CONFIG, args=["--GPULeaseHub.queue_max_wait=0",
                                                "--JupyterHub.named_server_limit_per_user=20"])


@pytest.fixture(scope="module")
def admin_token(hub):
    return hub.admin_token


@pytest.fixture(scope="module")
def alice(hub, admin_token):
    r = hub.service("POST", "api/users", admin_token, {"name": "alice", "password": "alice-pw-123"})
    assert r.status_code == 201, r.text
    hub.grant(admin_token, "user:alice")
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
    assert sum(line.split()[0] == "1g.18gb" for line in inv.stdout.splitlines()) == 7
    prof = hub.cli("profiles", "list")
    assert prof.returncode == 0, prof.stderr
    assert {"cpu", "h200-1g", "h200-full"} <= {line.split()[0] for line in prof.stdout.splitlines()}


def test_mig_server_kernel_sees_exactly_its_slice(hub, admin_token, alice):
    ready = hub.start_servers("alice", alice, {"": {"profile": "h200-1g"},
                                              "second": {"profile": "h200-1g"}})
    srv = ready[""]
    devices = held_by(hub, admin_token)[("alice", "")]
    assert len(devices) == 1 and devices[0].startswith("MIG-")
    seen = run_in_kernel(hub.url, srv["url"], alice,
                         "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['HOME'])")
    cuda, home = seen.split()
    assert cuda == devices[0]
    assert home == str(hub.state / "homes" / "alice")

    # a second server gets a different slice
    srv2 = ready["second"]
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
        if b"gpulease-singleuser" in cmdline and str(state).encode() in environ:
            pids.append(int(pid))
    return pids


def _service_pids(state) -> list[int]:
    return [p for p in _pids_with(b"gpulease.hub.service") if str(state).encode() in _environ(p)]


def _pids_with(needle: bytes) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if needle in open(f"/proc/{pid}/cmdline", "rb").read():
                    pids.append(int(pid))
            except OSError:
                pass
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


def test_local_accounts_login_lockout_and_no_plaintext(hub, admin_token):
    password = "carol-Pw-7f3e9a"
    added = hub.cli("users", "add", "carol", "--password-stdin", stdin=password + "\n")
    assert added.returncode == 0, added.stderr
    assert hub.login_form("carol", password).login_status == 302
    assert hub.login_form("carol", "not-her-password").login_status == 403
    # max_failures = 3 (the user config above): after three failures even the
    # right password is held back until the lockout passes
    for _ in range(2):
        assert hub.login_form("carol", "still-wrong").login_status == 403
    assert hub.login_form("carol", password).login_status == 403
    time.sleep(4.5)
    assert hub.login_form("carol", password).login_status == 302
    log = hub.log()
    assert "carol" in log and "127.0.0.1" in log
    assert password not in log and "still-wrong" not in log
    # no password in plain text anywhere in the state folder
    for path in hub.state.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (password, ADMIN_PW, "alice-pw-123"):
                assert secret.encode() not in data, f"{secret!r} found in {path}"


def test_cli_profiles_export_apply_round_trip_and_group_restriction(hub, alice, tmp_path):
    exported = hub.cli("profiles", "export")
    assert exported.returncode == 0, exported.stderr
    original = yaml.safe_load(exported.stdout)
    restricted = {
        "slug": "vision-1g", "display_name": "Vision group slice",
        "gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 2, "memory": "16Gi",
        "images": ["pytorch"], "price_per_hour": "0.90", "groups": ["vision"],
    }
    doc = {"profiles": [*original["profiles"], restricted]}
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump(doc))
    applied = hub.cli("profiles", "apply", str(path))
    assert applied.returncode == 0, applied.stderr
    assert "created: vision-1g" in applied.stdout
    listed = hub.cli("profiles", "list").stdout
    assert "vision-1g" in listed
    # group restrictions are enforced at spawn, not only hidden
    r = hub.api("POST", "users/alice/servers/vis", alice, {"user_options": {"profile": "vision-1g"}})
    assert r.status_code == 403, r.text
    assert "vision" in r.json()["message"]
    # export then apply is a no-op by meaning
    again = yaml.safe_load(hub.cli("profiles", "export").stdout)
    path.write_text(yaml.safe_dump(again))
    assert "updated" not in hub.cli("profiles", "apply", str(path)).stdout
    # apply --prune with the original file removes the extra profile
    path.write_text(exported.stdout)
    pruned = hub.cli("profiles", "apply", str(path), "--prune")
    assert pruned.returncode == 0 and "deleted: vision-1g" in pruned.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n  - slug: x\n    display_name: X\n    gpu: {model: H200, mig: 1g.10gb}\n"
                   "    cpu: 1\n    memory: 1Gi\n    images: [pytorch]\n    price_per_hour: '-1'\n")
    refused = hub.cli("profiles", "apply", str(bad))
    assert refused.returncode == 1
    assert "gpu.mig" in refused.stderr and "price_per_hour" in refused.stderr


def _scheduled_resources(hub) -> set[str]:
    printed = hub.cli("cluster", "scheduler-config")
    assert printed.returncode == 0, printed.stderr
    (profile,) = yaml.safe_load(printed.stdout)["profiles"]
    (fit,) = [c for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    return {r["name"] for r in fit["args"]["scoringStrategy"]["resources"]}


def test_scheduler_config_follows_the_hubs_profiles(hub, admin_token, alice):
    """A MIG profile an admin adds at run time is in the next generated configuration."""
    # a researcher's token sees only their own profiles: refused, not a partial configuration
    partial = hub.cli("--token", alice, "--url", hub.url, "cluster", "scheduler-config")
    assert partial.returncode == 2 and "admin's token" in partial.stderr, partial
    assert partial.stdout == ""
    assert "nvidia.com/mig-1g.18gb" in _scheduled_resources(hub)  # the demo's h200-1g
    assert "nvidia.com/mig-3g.71gb" not in _scheduled_resources(hub)
    added = {"slug": "h200-3g", "display_name": "H200 3g slice",
             "gpu": {"model": "H200", "mig": "3g.71gb"}, "cpu": 8, "memory": "64Gi",
             "images": ["pytorch"], "price_per_hour": "2.00"}
    r = hub.service("PUT", "api/profiles/h200-3g", admin_token, added)
    assert r.status_code in (200, 201), r.text
    try:
        assert "nvidia.com/mig-3g.71gb" in _scheduled_resources(hub)
    finally:
        assert hub.service("DELETE", "api/profiles/h200-3g", admin_token).status_code in (200, 204)
    assert "nvidia.com/mig-3g.71gb" not in _scheduled_resources(hub)


def test_a_server_that_dies_frees_its_slice(hub, admin_token, alice):
    r = hub.api("POST", "users/alice/servers/doomed", alice, {"user_options": {"profile": "h200-1g"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", alice, "doomed")
    assert ("alice", "doomed") in held_by(hub, admin_token)
    pids = [p for p in _singleuser_pids(hub.state) if b"doomed" in _environ(p)]
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while ("alice", "doomed") in held_by(hub, admin_token):
        assert time.monotonic() < deadline, "the slice of a dead server was not released"
        time.sleep(0.5)
    hub.wait_server_stopped("alice", alice, "doomed")


def _environ(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return b""


def test_spawn_page_offers_profiles_and_starts_the_chosen_one(hub, admin_token, alice):
    browser = hub.login_form("alice", "alice-pw-123")
    page = browser.get(f"{hub.url}/hub/spawn/alice/formpage", timeout=30)
    assert page.status_code == 200, page.text[:500]
    for slug in ("cpu", "h200-1g", "h200-full"):
        assert f'value="{slug}"' in page.text
    assert "of 7 free" in page.text
    xsrf = browser.cookies.get("_xsrf")
    r = browser.post(f"{hub.url}/hub/spawn/alice/formpage",
                     data={"profile": "cpu", "image_cpu": "cuda", "_xsrf": xsrf},
                     allow_redirects=False, timeout=60)
    assert r.status_code == 302, r.text[:500]
    hub.wait_server_ready("alice", alice, "formpage")
    model = hub.api("GET", "users/alice", admin_token).json()
    assert model["servers"]["formpage"]["user_options"] == {"profile": "cpu", "image": "cuda"}
    assert ("alice", "formpage") not in held_by(hub, admin_token)  # CPU only: no device
    assert hub.api("DELETE", "users/alice/servers/formpage", alice).status_code in (202, 204)
    hub.wait_server_stopped("alice", alice, "formpage")


def test_service_permissions(hub, admin_token, alice):
    anonymous = requests.get(f"{hub.urls.service()}api/inventory", timeout=10)
    assert anonymous.status_code == 403 and anonymous.json()["status"] == 403
    assert hub.service("GET", "api/inventory", alice).status_code == 403
    r = hub.service("POST", "api/users", alice, {"name": "mallory", "password": "x" * 12})
    assert r.status_code == 403
    # a researcher sees the profiles they may use, without admin fields
    profiles = hub.service("GET", "api/profiles", alice).json()["profiles"]
    assert {p["slug"] for p in profiles} >= {"cpu", "h200-1g"}
    assert all("enabled" not in p for p in profiles)
    bad = hub.service("POST", "api/users", admin_token, {"name": "Bad Name!", "password": "short"})
    assert bad.status_code == 400
    assert {e["field"] for e in bad.json()["errors"]} == {"name", "password"}
    dup = hub.service("POST", "api/users", admin_token, {"name": "alice", "password": "y" * 12})
    assert dup.status_code == 409
    assert hub.service("GET", "api/nope", admin_token).status_code == 404


# These two restart the hub: they run last.
def test_sigkill_and_restart_keeps_the_running_server_on_its_slice(hub, admin_token, alice):
    before = held_by(hub, admin_token)
    alice_slice = before[("alice", "")]
    hub.kill()
    hub.start()
    # the killed hub's service followed it; only the new hub's runs
    deadline = time.monotonic() + 10
    while len(_service_pids(hub.state)) != 1:
        assert time.monotonic() < deadline, f"services: {_service_pids(hub.state)}"
        time.sleep(0.3)
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
    hub.grant(admin_token, "user:bob")
    taken = ["", *(f"s{i}" for i in range(5))]  # his default and 5 named: the most he may have

    def path(name: str) -> str:
        return f"users/bob/servers/{name}" if name else "users/bob/server"

    hub.start_servers("bob", bob, {name: {"profile": "h200-1g"} for name in taken})
    held = held_by(hub, admin_token)
    bob_slices = {d for (u, _), ds in held.items() if u == "bob" for d in ds}
    assert len(bob_slices) == 6 and alice_slice[0] not in bob_slices
    r = hub.api("POST", "users/alice/servers/more", alice,
                {"user_options": {"profile": "h200-1g"}})
    assert r.status_code == 503, r.text
    with ThreadPoolExecutor(len(taken)) as pool:  # the stops at once too
        list(pool.map(lambda name: hub.api("DELETE", path(name), bob), taken))
    for name in taken:
        hub.wait_server_stopped("bob", bob, name)


def test_ctrl_c_stops_everything_and_up_keeps_state(hub, admin_token, alice):
    srv_pids = _singleuser_pids(hub.state)
    assert srv_pids, "alice's server should be running"
    assert hub.interrupt() == 0, hub.log()[-3000:]
    for pid in srv_pids:
        assert not _alive(pid), f"server process {pid} survived Ctrl-C"
    assert not [p for p in _service_pids(hub.state) if _alive(p)], "the service survived Ctrl-C"
    assert not _alive_chp(hub.state)
    hub.start()
    token = hub.token_for("alice", "alice-pw-123")
    model = hub.api("GET", "users/alice?include_stopped_servers=1", token).json()
    assert model["servers"][""]["user_options"] == {"profile": "h200-1g"}
    assert model["servers"][""]["ready"] is False
    assert (hub.state / "homes" / "alice" / "notes.txt").exists()
    assert held_by(hub, hub.admin_token) == {}
