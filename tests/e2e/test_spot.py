"""End to end: the spot tier on a real hub (embedded shape).

Two 1g.18gb slices, both taken by spot servers; an on-demand start arrives and
waits; the most recently started spot server is told at once (a
preemption_warning notice with its deadline), suspended with reason preempted
after the grace period (billed up to it, its home kept), and the on-demand start
then runs. Each session is billed at its own tier's rate. Servers are
JupyterHub's mock single-user server (tests/support/isolation_env.py).
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

GRACE_S = 6
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "3.6",
     "spot_price_per_hour": "0.36", "min_run": "1m"},
    {"slug": "full", "display_name": "Full", "gpu": {"model": "H200", "count": 1},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "8", "min_run": "1m"},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "580.159", "mig": ["1g.18gb", "1g.18gb"]},
]}]}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    # a pending start answers its REST call after 1 s (202), not when it is ready
    return HubOptions(profiles=PROFILES, inventory=INVENTORY, mock_catalog=True,
                      config=('c.Spawner.poll_interval = 1\n'
                              'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n'),
                      args=["--GPULeaseHub.culler_enabled=False",
                            "--LocalGPUSpawner.queue_poll_interval=1",
                            "--GPULeaseHub.heartbeat_interval=1",
                            f"--GPULeaseHub.spot_grace_period={GRACE_S}",
                            "--GPULeaseHub.queue_max_wait=2m"])


def _start(hub, user, token, options, server=""):
    path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
    return hub.api("POST", path, token, {"user_options": options})


def _sessions(hub, token) -> list[dict]:
    return hub.service("GET", "api/usage", token).json()["sessions"]


def _holders(hub, admin) -> dict[str, dict]:
    """api/inventory's holders by user."""
    view = hub.service("GET", "api/inventory", admin).json()
    return {d["holder"]["user"]: d["holder"] for n in view["nodes"] for g in n["gpus"]
            for d in g["devices"] if d["holder"]}


def test_spot_servers_are_preempted_with_notice_for_an_on_demand_start(hub):
    admin = hub.admin_token
    tokens = {n: hub.add_user(admin, n) for n in ("sam", "sue", "odin")}
    # the tier's refusals write nothing
    r = _start(hub, "odin", tokens["odin"], {"profile": "full", "tier": "spot"})
    assert r.status_code == 400 and "offers no spot tier" in r.json()["message"], r.text
    r = _start(hub, "odin", tokens["odin"], {"profile": "slice", "tier": "cheap"})
    assert r.status_code == 400 and "allowed: on-demand, spot" in r.json()["message"], r.text

    assert _start(hub, "sam", tokens["sam"], {"profile": "slice", "tier": "spot"}
                  ).status_code in (201, 202)
    hub.wait_server_ready("sam", tokens["sam"])
    (hub.state / "homes" / "sam" / "notes.txt").write_text("keep me")
    time.sleep(1.5)  # sue's server is the more recent: hers is the one preempted
    assert _start(hub, "sue", tokens["sue"], {"profile": "slice", "tier": "spot"}
                  ).status_code in (201, 202)
    hub.wait_server_ready("sue", tokens["sue"])
    # the inventory says whose devices are spot (the admin page shows the same rows)
    holders = _holders(hub, admin)
    assert {holders[u]["tier"] for u in ("sam", "sue")} == {"spot"}, holders

    asked = time.monotonic()
    r = _start(hub, "odin", tokens["odin"], {"profile": "slice"})
    assert r.status_code in (201, 202), r.text
    # sue is told at once, with the deadline
    notice = None
    while notice is None and time.monotonic() - asked < 15:
        found = [n for n in hub.service("GET", "api/notices", tokens["sue"]).json()["notices"]
                 if n["kind"] == "preemption_warning"]
        notice = found[0] if found else None
        time.sleep(0.3)
    assert notice is not None, hub.log()[-3000:]
    assert "on-demand start needs its GPU" in notice["message"]
    assert "Your home is kept" in notice["message"] and notice["deadline"]
    assert not [n for n in hub.service("GET", "api/notices", tokens["sam"]).json()["notices"]
                if n["kind"] == "preemption_warning"]
    # still running during the grace period
    model = hub.api("GET", "users/sue", admin).json()
    assert model["servers"][""]["ready"], (model, hub.log()[-4000:])

    hub.wait_server_stopped("sue", tokens["sue"], timeout=30)
    hub.wait_server_ready("odin", tokens["odin"], timeout=30)
    assert hub.api("GET", "users/sam", admin).json()["servers"][""]["ready"]
    assert (hub.state / "homes" / "sam" / "notes.txt").read_text() == "keep me"

    (sue,) = _sessions(hub, tokens["sue"])
    assert sue["tier"] == "spot" and sue["end_reason"] == "preempted"
    deadline = dt.datetime.fromisoformat(notice["deadline"].replace("Z", "+00:00"))
    ended = dt.datetime.fromisoformat(sue["ended"].replace("Z", "+00:00"))
    assert ended <= deadline + dt.timedelta(milliseconds=1)  # billed to the deadline at most
    # 0.36 credits/h = 0.1 µcr per ms: the spot rate, not the profile's 3.6
    assert sue["cost"] == f"{-(-sue['billed_ms'] // 10) / 1e6:.6f}"
    (odin,) = _sessions(hub, tokens["odin"])
    assert odin["tier"] == "on-demand" and odin["end_reason"] is None
    holders = _holders(hub, admin)
    assert holders["odin"]["tier"] == "on-demand" and "sue" not in holders, holders
    page = hub.service("GET", "admin/inventory", admin).text
    assert "<th>tier</th>" in page and "<td>spot</td>" in page and "<td>on-demand</td>" in page
    home = hub.api("GET", "users/sue?include_stopped_servers=1", admin).json()
    assert home["servers"][""]["user_options"]["tier"] == "spot"  # resume: spot again
    for user in ("sam", "odin"):
        hub.api("DELETE", f"users/{user}/server", tokens[user])
        hub.wait_server_stopped(user, tokens[user])
