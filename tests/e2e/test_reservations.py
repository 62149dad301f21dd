"""End to end: reservations on a real hub (embedded shape).

Three 1g.18gb slices; lee's reservation holds one of them for the period:
- it is charged once when made (a `reservation` ledger row), and bad requests
  (more than exists, capacity promised, no offer, an unknown account, a past
  start, a balance that cannot pay) are refused and write nothing;
- a stranger's on-demand starts get only the two others; a spot server may use
  the reserved slice while lee does not, and is preempted, with notice, when
  lee starts; lee's server then runs on the reservation (tier reserved), not
  billed by the millisecond, and the stranger's waiting start does not get the slice;
- at the end (notice ahead), lee's server goes on on demand from that moment;
  a reservation whose holder chose `suspend` suspends its server; a
  cancellation refunds the hours not begun (a `refund` row).

An hour cannot pass in a test: where the end is reached, the test moves the
reservation's end to a few seconds from now in the database (what time passing
would do); everything else goes through the API. Servers are JupyterHub's mock
single-user server (tests/support/isolation_env.py).
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from tests.support.hubproc import HubOptions
from tests.support.reservation_clock import begin_now, end_soon

pytestmark = pytest.mark.e2e

GRACE_S = 4
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "3.6",
     "spot_price_per_hour": "0.36", "reserved_price_per_hour": "1.8", "min_run": "1m"},
    {"slug": "full", "display_name": "Full", "gpu": {"model": "H200", "count": 1},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "8", "min_run": "1m"},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "580.159",
     "mig": ["1g.18gb", "1g.18gb", "1g.18gb"]},
]}]}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, inventory=INVENTORY, mock_catalog=True,
                      config=('c.Spawner.poll_interval = 1\n'
                              'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n'),
                      args=["--GPULeaseHub.culler_enabled=False",
                            "--LocalGPUSpawner.queue_poll_interval=1",
                            "--GPULeaseHub.heartbeat_interval=1",
                            f"--GPULeaseHub.spot_grace_period={GRACE_S}",
                            "--GPULeaseHub.queue_max_wait=2m"])


def _hour(offset: int = 0) -> str:
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    return (now + dt.timedelta(hours=offset)).strftime("%Y-%m-%dT%H:00:00Z")


def _reserve(hub, token, **fields):
    body = {"account": "user:lee", "profile": "slice", "units": 1, "start": _hour(),
            "end": _hour(2), **fields}
    return hub.service("POST", "api/reservations", token, body)


def _start(hub, user, token, options, server=""):
    path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
    return hub.api("POST", path, token, {"user_options": options})


def _sessions(hub, token) -> list[dict]:
    return hub.service("GET", "api/usage", token).json()["sessions"]


def _balance(hub, token) -> str:
    return hub.service("GET", "api/balance", token).json()["balance"]


def _holders(hub, admin) -> dict[tuple[str, str], dict]:
    view = hub.service("GET", "api/inventory", admin).json()
    return {(d["holder"]["user"], d["holder"]["server"]): d["holder"] for n in view["nodes"]
            for g in n["gpus"] for d in g["devices"] if d["holder"]}


def _wait(what, timeout: float = 30, hub=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting; hub log:\n{hub.log()[-4000:] if hub else ''}")


def _notices(hub, token, kind):
    return [n for n in hub.service("GET", "api/notices", token).json()["notices"]
            if n["kind"] == kind]


def test_a_reservation_holds_capacity_lends_it_to_spot_and_ends_on_demand(hub):
    admin = hub.admin_token
    tokens = {n: hub.add_user(admin, n) for n in ("lee", "ann", "sam")}
    tokens["poor"] = hub.add_user(admin, "poor", credit=None)

    # --- made, and charged once; bad requests write nothing ---
    r = _reserve(hub, admin, note="course week")
    assert r.status_code == 201, r.text
    booked = r.json()
    assert booked["cost"] == "3.600000" and booked["state"] == "active"  # 1 × 1.8 × 2 h
    assert _balance(hub, tokens["lee"]) == "96.400000"
    refusals = [
        ({"units": 4}, 422, "more than there are: 3"),
        ({"units": 3}, 409, "only 2 of 3"),
        ({"profile": "full"}, 422, "offers no reservations"),
        ({"account": "user:nobody"}, 400, "nobody"),
        ({"start": _hour(-2)}, 400, "the hour under way"),
        ({"account": "user:poor"}, 402, "has 0.000000 credits"),
        ({"units": "2"}, 400, "whole number"),
        ({"units": 1.5}, 400, "(no decimal point), got 1.5"),
    ]
    for fields, status, words in refusals:
        r = _reserve(hub, admin, **fields)
        assert r.status_code == status and words in r.text, (fields, r.text)
    r = _reserve(hub, tokens["lee"])
    assert r.status_code == 403 and "reservations_by_researchers" in r.text
    listed = hub.service("GET", "api/reservations", admin).json()["reservations"]
    assert [x["id"] for x in listed] == [booked["id"]]
    shown = hub.cli("reservations", "list")  # the CLI reads the same API
    assert shown.returncode == 0 and f"#{booked['id']} user:lee: 1 × slice" in shown.stdout
    bad = hub.cli("reservations", "add", "lee", "slice", "--units", "9", "--start", _hour(),
                  "--end", _hour(1))
    assert bad.returncode == 1 and "more than there are" in bad.stderr
    assert hub.service("GET", "api/reservations", tokens["ann"]).json()["reservations"] == []
    for odd in ("%C2%B2", "%D9%A1", "1.0", "-1"):  # "²" and "١" are digits to Python
        r = hub.service("DELETE", f"api/reservations/{odd}", admin)
        assert r.status_code == 400 and "whole number" in r.text, (odd, r.text)
    assert _balance(hub, tokens["lee"]) == "96.400000"

    # --- a stranger gets what the reservation leaves; spot uses the idle reserved slice ---
    for server in ("a", "b"):
        assert _start(hub, "ann", tokens["ann"], {"profile": "slice"}, server
                      ).status_code in (201, 202)
        hub.wait_server_ready("ann", tokens["ann"], server)
    assert _start(hub, "sam", tokens["sam"], {"profile": "slice", "tier": "spot"}
                  ).status_code in (201, 202)
    hub.wait_server_ready("sam", tokens["sam"])
    assert _start(hub, "ann", tokens["ann"], {"profile": "slice"}, "c").status_code == 202
    time.sleep(2)  # passes over the queue: ann's third start is not given lee's slice
    queue = hub.service("GET", "api/inventory", admin).json()["queue"]
    assert [(q["user"], q["server"]) for q in queue] == [("ann", "c")], queue
    assert not _notices(hub, tokens["sam"], "preemption_warning")  # no preemption for ann

    # --- lee starts: the spot server is preempted with notice, lee runs on the unit ---
    assert _start(hub, "lee", tokens["lee"], {"profile": "slice"}).status_code in (201, 202)
    notice = _wait(lambda: _notices(hub, tokens["sam"], "preemption_warning"), hub=hub)[0]
    assert "Save your work" in notice["message"] and notice["deadline"]
    hub.wait_server_stopped("sam", tokens["sam"], timeout=30)
    hub.wait_server_ready("lee", tokens["lee"], timeout=30)
    (sam,) = _sessions(hub, tokens["sam"])
    assert sam["end_reason"] == "preempted"
    holders = _holders(hub, admin)
    assert holders[("lee", "")]["tier"] == "reserved", holders
    assert holders[("lee", "")]["reservation"] == booked["id"]
    assert ("ann", "c") not in holders  # still waiting
    inventory = hub.service("GET", "api/inventory", admin).json()
    assert inventory["reservations"] == [{
        "id": booked["id"], "account": "user:lee", "profile": "slice",
        "devices": "H200 1g.18gb slices", "units": 1, "in_use": 1, "until": booked["end"]}]
    hub.api("DELETE", "users/ann/servers/c", tokens["ann"])
    time.sleep(3)  # billed seconds would show
    (lee,) = _sessions(hub, tokens["lee"])
    assert lee["tier"] == "reserved" and lee["reservation"] == booked["id"]
    assert lee["cost"] == "0.000000" and lee["billed_ms"] > 2000
    assert _balance(hub, tokens["lee"]) == "96.400000"  # nothing by the millisecond
    csv = hub.service("GET", "api/usage?format=csv", tokens["lee"]).text
    # the reservation's column, then the GPU readings' (none here: no culler readings)
    assert ",reserved,user:lee," in csv and csv.strip().endswith(f",{booked['id']},,,,")

    # --- the end: told ahead, then on demand from that moment ---
    end_soon(hub, booked["id"], 5)
    told = _wait(lambda: _notices(hub, tokens["lee"], "reservation_ending"), hub=hub)[0]
    assert "goes on then on demand" in told["message"]
    _wait(lambda: len(_sessions(hub, tokens["lee"])) == 2, hub=hub)
    reserved, on_demand = _sessions(hub, tokens["lee"])
    assert reserved["end_reason"] == "reservation_ended" and reserved["cost"] == "0.000000"
    assert on_demand["started"] == reserved["ended"] and on_demand["tier"] == "on-demand"
    assert on_demand["ended"] is None and on_demand["reservation"] is None
    assert hub.api("GET", "users/lee", admin).json()["servers"][""]["ready"]
    assert _holders(hub, admin)[("lee", "")]["tier"] == "on-demand"
    _wait(lambda: not _notices(hub, tokens["lee"], "reservation_ending"), hub=hub)
    audit = hub.service("GET", "api/audit?action=reservation.add", admin).json()["entries"]
    assert [e["target"] for e in audit] == ["user:lee"]
    for user, server in (("ann", "a"), ("ann", "b"), ("lee", "")):
        hub.api("DELETE", f"users/{user}/servers/{server}" if server else f"users/{user}/server",
                tokens[user])
        hub.wait_server_stopped(user, tokens[user], server)


def test_suspend_at_the_end_and_a_cancellation_refunds_the_hours_not_begun(hub):
    admin = hub.admin_token
    tokens = {"lee": hub.token_for("lee", "lee-pw-12345")}
    before = _balance(hub, tokens["lee"])
    r = _reserve(hub, admin, end=_hour(3), on_end="suspend")
    assert r.status_code == 201, r.text
    booked = r.json()  # 1 × 1.8 × 3 h
    assert _balance(hub, tokens["lee"]) == f"{float(before) - 5.4:.6f}"
    assert _start(hub, "lee", tokens["lee"], {"profile": "slice"}, "b").status_code in (201, 202)
    hub.wait_server_ready("lee", tokens["lee"], "b")
    # a start beyond the reservation's units is on demand, billed by the millisecond
    assert _start(hub, "lee", tokens["lee"], {"profile": "slice"}, "c").status_code in (201, 202)
    hub.wait_server_ready("lee", tokens["lee"], "c")
    holders = _holders(hub, admin)
    assert holders[("lee", "b")]["tier"] == "reserved", holders
    assert holders[("lee", "c")]["tier"] == "on-demand" and "reservation" not in holders[
        ("lee", "c")]
    hub.api("DELETE", "users/lee/servers/c", tokens["lee"])
    hub.wait_server_stopped("lee", tokens["lee"], "c")
    (extra,) = [x for x in _sessions(hub, tokens["lee"]) if x["server"] == "c"]
    assert extra["tier"] == "on-demand" and extra["cost"] != "0.000000"
    assert _balance(hub, tokens["lee"]) == f"{float(before) - 5.4 - float(extra['cost']):.6f}"
    # cancelled now: the two whole hours not begun come back
    paid = _balance(hub, tokens["lee"])
    r = hub.service("DELETE", f"api/reservations/{booked['id']}", admin)
    assert r.status_code == 200 and r.json()["refund"] == "3.600000", r.text
    assert r.json()["reservation"]["state"] == "cancelled"
    assert _balance(hub, tokens["lee"]) == f"{float(paid) + 3.6:.6f}"
    r = hub.service("DELETE", f"api/reservations/{booked['id']}", admin)
    assert r.status_code == 409 and "was cancelled" in r.text
    # still held to the end of the hour it is in; then suspended, as its holder chose
    assert _holders(hub, admin)[("lee", "b")]["tier"] == "reserved"
    end_soon(hub, booked["id"], 4)
    hub.wait_server_stopped("lee", tokens["lee"], "b", timeout=30)
    last = [x for x in _sessions(hub, tokens["lee"]) if x["server"] == "b"][-1]
    assert last["end_reason"] == "reservation_ended"
    assert last["tier"] == "reserved" and last["cost"] == "0.000000"
    home = hub.api("GET", "users/lee?include_stopped_servers=1", admin).json()
    assert home["servers"]["b"]["user_options"].get("tier", "on-demand") == "on-demand"
    audit = hub.service("GET", "api/audit?action=reservation.cancel", admin).json()["entries"]
    assert audit[0]["after"]["refund"] == "3.600000"


def test_on_demand_servers_running_when_the_period_begins_make_way_for_the_holder(hub):
    """Capacity is there when promised: on-demand servers admitted before the period
    fill every slice, lee's own (the oldest) among them; when lee starts on the
    reservation, lee's own on-demand server makes way before ann's newer ones: it is
    told and stopped after the grace period (reason preempted), and lee runs on the
    unit. (Newest first among strangers: tests/cluster/test_reservations_cluster.py.)"""
    admin = hub.admin_token
    tokens = {"lee": hub.token_for("lee", "lee-pw-12345"),
              "ann": hub.token_for("ann", "ann-pw-12345")}
    for user, server in (("lee", "x"), ("ann", "a"), ("ann", "b")):  # all three slices
        assert _start(hub, user, tokens[user], {"profile": "slice"}, server
                      ).status_code in (201, 202)
        hub.wait_server_ready(user, tokens[user], server)
    # a period beginning within the lead time (24 h) must fit beside what runs:
    # reserving the next hour cannot stop servers
    for start in (_hour(), _hour(1), _hour(23)):
        r = _reserve(hub, admin, start=start, end=_hour(24))
        assert r.status_code == 409 and "only 0 of 3" in r.text and "free now" in r.text, r.text
    # one made further ahead is promised against other reservations only
    r = _reserve(hub, admin, start=_hour(25), end=_hour(26))
    assert r.status_code == 201, r.text
    booked = r.json()
    begin_now(hub, booked["id"])  # the hour comes; the servers still run
    assert _start(hub, "lee", tokens["lee"], {"profile": "slice"}).status_code == 202
    notice = _wait(lambda: _notices(hub, tokens["lee"], "preemption_warning"), hub=hub)[0]
    assert notice["server"] == "x", notice  # the holder's own, not ann's newer b
    assert "reserved for this period" in notice["message"] and notice["deadline"]
    hub.wait_server_stopped("lee", tokens["lee"], "x", timeout=30)
    hub.wait_server_ready("lee", tokens["lee"], timeout=30)
    holders = _holders(hub, admin)
    assert holders[("lee", "")]["tier"] == "reserved", holders
    assert holders[("lee", "")]["reservation"] == booked["id"]
    assert {("ann", "a"), ("ann", "b")} <= set(holders)  # within on-demand's share
    assert not _notices(hub, tokens["ann"], "preemption_warning")
    (x,) = [s for s in _sessions(hub, tokens["lee"]) if s["server"] == "x"]
    assert x["end_reason"] == "preempted" and x["tier"] == "on-demand"
    deadline = dt.datetime.fromisoformat(notice["deadline"].replace("Z", "+00:00"))
    ended = dt.datetime.fromisoformat(x["ended"].replace("Z", "+00:00"))
    assert ended <= deadline + dt.timedelta(seconds=1)  # billed no further than told
    assert all(s["ended"] is None for s in _sessions(hub, tokens["ann"])
               if s["server"] in ("a", "b") and s["end_reason"] != "user")
    for user, server in (("ann", "a"), ("ann", "b"), ("lee", "")):
        hub.api("DELETE", f"users/{user}/servers/{server}" if server else f"users/{user}/server",
                tokens[user])
        hub.wait_server_stopped(user, tokens[user], server)
    hub.service("DELETE", f"api/reservations/{booked['id']}", admin)
