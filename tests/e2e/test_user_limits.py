"""Attacks on the per-user limits of a real hub (issue 12, item 2): a sixth named server,
a seventeenth core, a fourth queue place, a 2 MiB body and a 400-day usage query are each
refused with the documented status and a message naming the limit, and leave nothing
half-written (no server row, no queue row, no session, the saved options as they were).

Servers run JupyterHub's mock single-user server (tests/support/isolation_env.py's mock_server_catalog);
the inventory is one MIG slice, so a second slice start waits in the queue. Every limit
is at its default. The pure decisions are tested in tests/unit/core/policy/test_user_limits.py.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from gpulease.core.clock import utcnow
from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

FREE = {"images": ["mock"], "price_per_hour": "0", "min_run": "0"}
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "1Gi", **FREE},
    {"slug": "cpu8", "display_name": "8 cores", "cpu": 8, "memory": "2Gi", **FREE},
    {"slug": "cpu1", "display_name": "1 core", "cpu": 1, "memory": "1Gi", **FREE},
    {"slug": "mem40", "display_name": "40Gi", "cpu": 1, "memory": "40Gi", **FREE},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "580.159", "mig": ["1g.18gb"]}]}]}
# Deaths seen in 1 s; a pending start answers its REST call after 1 s (202).
CONFIG = ('c.Spawner.poll_interval = 1\n'
          'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n')
MIB = 1 << 20


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, inventory=INVENTORY, mock_catalog=True, config=CONFIG,
                      args=["--GPULeaseHub.culler_enabled=False",
                            "--GPULeaseHub.queue_max_wait=5m",
                            "--LocalGPUSpawner.queue_poll_interval=1"])


def _path(user: str, server: str) -> str:
    return f"users/{user}/servers/{server}" if server else f"users/{user}/server"


def start(hub, user, token, profile, server=""):
    return hub.api("POST", _path(user, server), token, {"user_options": {"profile": profile}})


def stop(hub, user, token, server=""):
    r = hub.api("DELETE", _path(user, server), token)
    assert r.status_code in (202, 204), r.text
    hub.wait_server_stopped(user, token, server)


def servers_of(hub, user, token) -> dict:
    return hub.api("GET", f"users/{user}?include_stopped_servers=1", token).json()["servers"]


def sessions_of(hub, token) -> list[dict]:
    since = (utcnow() - dt.timedelta(days=2)).date()  # today's, also on a month's first day
    return hub.service("GET", f"api/usage?since={since}", token).json()["sessions"]


def queue_of(hub, admin) -> list[tuple[str, str]]:
    return [(q["user"], q["server"]) for q in hub.service("GET", "api/inventory",
                                                          admin).json()["queue"]]


def test_a_sixth_named_server_is_refused_409_on_every_way_in_and_not_created(hub, admin):
    token = hub.add_user(admin, "nia")
    for i in range(5):  # created without starting them (JupyterHub's PUT, 6.0)
        assert hub.api("PUT", f"users/nia/servers/n{i}", token, {}).status_code == 201
    for method, body in (("PUT", {}), ("POST", {"user_options": {"profile": "cpu1"}})):
        r = hub.api(method, "users/nia/servers/n5", token, body)
        assert r.status_code == 409, (method, r.status_code, r.text)
        message = r.json()["message"]
        assert "named_server_limit_per_user 5" in message and "n5 is not created" in message
    r = hub.api("PATCH", "users/nia/server", token, {"name": "n5"})  # renaming the default one
    assert r.status_code == 409 and "named_server_limit_per_user 5" in r.json()["message"]
    r = hub.service("POST", "api/servers", token, {"name": "n5", "user_options": {"profile": "cpu1"}})
    assert r.status_code == 409 and "named_server_limit_per_user 5" in r.json()["message"], r.text
    assert r.json()["errors"][0]["field"] == "name"
    browser = hub.login_form("nia", "nia-pw-12345")
    page = browser.get(f"{hub.url}/hub/spawn/nia/n5", timeout=30)
    assert page.status_code == 409 and "named_server_limit_per_user 5" in page.text
    assert set(servers_of(hub, "nia", token)) - {""} == {f"n{i}" for i in range(5)}
    # one of them still starts; deleting one makes room for another
    assert start(hub, "nia", token, "cpu1", "n0").status_code in (201, 202)
    hub.wait_server_ready("nia", token, "n0")
    stop(hub, "nia", token, "n0")
    assert hub.api("DELETE", "users/nia/servers/n4", token, {"remove": True}).status_code in (202, 204)
    assert hub.api("PUT", "users/nia/servers/n5", token, {}).status_code == 201


def test_a_seventeenth_core_is_refused_409_and_nothing_is_written(hub, admin):
    token = hub.add_user(admin, "cyd")
    for server in ("", "b"):
        assert start(hub, "cyd", token, "cpu8", server).status_code in (201, 202)
        hub.wait_server_ready("cyd", token, server)
    assert hub.api("PUT", "users/cyd/servers/c", token,
                   {"user_options": {"profile": "cpu8"}}).status_code == 201
    r = start(hub, "cyd", token, "cpu1", "c")
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "cpu_only_cpu_per_user 16 cores: 16 cores held, this start asks for 1 core more" \
        in message and "cyd/(default), cyd/b" in message
    saved = servers_of(hub, "cyd", token)["c"]
    assert saved["user_options"] == {"profile": "cpu8"} and not saved["ready"]
    assert "c" not in {s["server"] for s in sessions_of(hub, token)}
    stop(hub, "cyd", token, "b")  # its cores are free again
    assert start(hub, "cyd", token, "cpu1", "c").status_code in (201, 202)
    hub.wait_server_ready("cyd", token, "c")
    for server in ("", "c"):
        stop(hub, "cyd", token, server)


def test_memory_counts_too(hub, admin):
    token = hub.add_user(admin, "dee")
    assert start(hub, "dee", token, "mem40").status_code in (201, 202)
    hub.wait_server_ready("dee", token)
    r = start(hub, "dee", token, "mem40", "more")
    assert r.status_code == 409, r.text
    assert "cpu_only_memory_per_user 64Gi: 40Gi held" in r.json()["message"]
    stop(hub, "dee", token)


def test_cpu_only_starts_sent_at_once_cannot_together_pass_the_total(hub, admin):
    token = hub.add_user(admin, "eve")
    servers = ["a", "b", "c"]
    with ThreadPoolExecutor(len(servers)) as pool:
        answers = list(pool.map(lambda s: start(hub, "eve", token, "cpu8", s), servers))
    codes = sorted(r.status_code for r in answers)
    assert codes[-1] == 409 and all(c in (201, 202) for c in codes[:2]), [
        (r.status_code, r.text[:200]) for r in answers]
    started = [s for s, r in zip(servers, answers, strict=True) if r.status_code != 409]
    for server in started:
        hub.wait_server_ready("eve", token, server)
    for server in started:
        stop(hub, "eve", token, server)


def test_a_fourth_queue_place_is_refused_409_and_leaves_no_queue_row(hub, admin):
    holder, hog, other = (hub.add_user(admin, n) for n in ("holder", "hog", "ora"))
    assert start(hub, "holder", holder, "slice").status_code in (201, 202)
    hub.wait_server_ready("holder", holder)
    for server in ("q0", "q1", "q2"):
        r = start(hub, "hog", hog, "slice", server)
        assert r.status_code == 202, r.text  # waiting in the queue
    deadline = time.monotonic() + 20
    while len(queue_of(hub, admin)) < 3:
        assert time.monotonic() < deadline, queue_of(hub, admin)
        time.sleep(0.3)
    r = start(hub, "hog", hog, "slice", "q3")
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "queue_places_per_user 3" in message and "hog/q0, hog/q1, hog/q2" in message
    assert queue_of(hub, admin) == [("hog", "q0"), ("hog", "q1"), ("hog", "q2")]
    assert start(hub, "ora", other, "slice").status_code == 202  # others still queue
    deadline = time.monotonic() + 20
    while ("ora", "") not in queue_of(hub, admin):
        assert time.monotonic() < deadline, queue_of(hub, admin)
        time.sleep(0.3)
    for user, token, server in (("hog", hog, "q0"), ("hog", hog, "q1"), ("hog", hog, "q2"),
                                ("ora", other, "")):
        hub.api("DELETE", _path(user, server), token)
    for user, token, server in (("hog", hog, "q0"), ("hog", hog, "q1"), ("hog", hog, "q2"),
                                ("ora", other, "")):
        hub.wait_server_stopped(user, token, server)
    stop(hub, "holder", holder)
    assert queue_of(hub, admin) == []


def _profile_body(size: int) -> bytes:
    body = {"display_name": "Big", "cpu": 1, "memory": "1Gi", "images": ["mock"],
            "price_per_hour": "0", "description": "x" * size}
    return json.dumps(body).encode()


def test_a_body_over_one_mib_is_refused_413_before_it_is_read(hub, admin):
    service_url = hub.api("GET", "services/gpulease", admin).json()["url"].rstrip("/")
    huge = _profile_body(2 * MIB)
    headers = {"Authorization": f"token {admin}", "Content-Type": "application/json"}
    # To the service directly (as servers reach it) and through the proxy (as everyone else)
    for url in (f"{service_url}/services/gpulease/api/profiles/big",
                hub.urls.service("api/profiles/big")):
        r = requests.put(url, data=huge, headers=headers, timeout=60)
        assert r.status_code == 413, (url, r.status_code, r.text[:300])
        assert r.json()["status"] == 413 and "at most 1048576 bytes (1 MiB)" in r.json()["message"]
        assert f"has {len(huge)} bytes" in r.json()["message"]
    # without a length (chunked): the connection is cut once past 1 MiB
    def chunks():
        for _ in range(32):
            yield b"x" * (64 * 1024)

    try:
        r = requests.put(f"{service_url}/services/gpulease/api/profiles/big", data=chunks(),
                         headers=headers, timeout=60)
        assert r.status_code == 400, r.text  # tornado's own answer, before any handler
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
        pass  # cut while sending, or before the answer was read
    # a length that is a lie does not get the body read either
    host, port = service_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"PUT /services/gpulease/api/profiles/big HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 99999999999\r\n\r\n{")
        answer = s.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 413") and "at most 1048576 bytes" in answer
    slugs = {p["slug"] for p in hub.service("GET", "api/profiles", admin).json()["profiles"]}
    assert "big" not in slugs
    # a body under the bound is read as before
    r = requests.put(f"{hub.urls.service()}api/profiles/big", data=_profile_body(100),
                     headers=headers, timeout=60)
    assert r.status_code == 201, r.text
    assert hub.service("DELETE", "api/profiles/big", admin).status_code == 200


def test_usage_queries_default_to_the_month_and_span_at_most_366_days(hub, admin):
    token = hub.add_user(admin, "ugo")
    r = hub.service("GET", "api/usage?since=2025-01-01&until=2026-02-05", token)
    assert r.status_code == 400, r.text
    body = r.json()
    assert "at most 366 days" in body["message"] and "is 400 days" in body["message"]
    assert body["errors"] == [{"field": "until", "message": body["message"]}]
    r = hub.service("GET", "api/usage?since=2000-01-01&format=csv", token)
    assert r.status_code == 400 and "until, left out" in r.json()["message"]
    r = hub.service("GET", "api/usage?since=2026-03-02&until=2026-03-01", token)
    assert r.status_code == 400 and "later than since" in r.json()["message"]
    assert hub.service("GET", "api/usage?since=2025-01-01&until=2026-01-01", token).status_code == 200
    assert hub.service("GET", "api/usage", token).json() == {
        "sessions": [], "totals": {"billed_seconds": 0, "billed_ms": 0, "cost": "0.000000"},
        "advice": []}
    page = hub.login_form("ugo", "ugo-pw-12345").get(
        f"{hub.urls.service()}usage?since=2000-01-01", timeout=30)
    assert page.status_code == 400 and re.search(r"at most 366 days", page.text)
