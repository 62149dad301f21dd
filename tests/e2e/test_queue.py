"""End to end: the admission queue and GPU limits on a real hub.

The hub runs on a declared inventory of two 1g.18gb slices, and servers run
JupyterHub's mock single-user server (an image of a catalog of our own whose
local environment starts `jupyterhub.tests.mocksu`), so a start takes about a
second. A few tests need a hub with another `queue_max_wait`; they start one
of their own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
import yaml

from gpulease.store.db import open_database, sqlite_url
from tests.support.hubproc import HubProcess, close_together, start_together
from tests.support.isolation_env import mock_server_catalog
from tests.support.queue_reads import queue_of, wait_for_progress

pytestmark = pytest.mark.e2e

ADMIN_PW = "admin-secret-pw"
WAITING = "Waiting for a free H200 slice 1g.18gb: position 1 in the queue"

PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "1.20", "min_run": "1m"},
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["mock"],
     "price_per_hour": "0.60", "min_run": "1m"},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "580.159", "mig": ["1g.18gb", "1g.18gb"]},
]}]}
# Deaths seen in 1s; with `quick`, a pending start answers its REST call after 1s
# (202) instead of 10s.
USER_CONFIG = "c.Spawner.poll_interval = 1\n"
QUICK = 'c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}\n'


def _files(base: Path, quick: bool) -> list[str]:
    catalog = mock_server_catalog(base)
    (base / "profiles.yaml").write_text(yaml.safe_dump(PROFILES))
    (base / "inventory.yaml").write_text(yaml.safe_dump(INVENTORY))
    (base / "config.py").write_text(USER_CONFIG + (QUICK if quick else ""))
    return [f"--profiles={base / 'profiles.yaml'}", f"--inventory={base / 'inventory.yaml'}",
            f"--catalog={catalog}", f"--config={base / 'config.py'}",
            "--GPULeaseHub.culler_enabled=False", "--LocalGPUSpawner.queue_poll_interval=1"]


def new_hub(tmp_path_factory, name: str, *more: str, quick: bool = True) -> HubProcess:
    base = tmp_path_factory.mktemp(name)
    return HubProcess(state=base / "state", admin_password=ADMIN_PW,
                      extra_args=[*_files(base, quick), *more])


# JupyterHub's own 10s before a pending start is answered 202: for test_queue_max_wait
# (quick=False) the refusal is the answer.
MAX_WAITS = ["0", "2s"]


@pytest.fixture(scope="module")
def hubs(tmp_path_factory):
    """The module's hub, and one for each of test_queue_max_wait's queue_max_wait values,
    started (and closed) at once."""
    made = {"queue": new_hub(tmp_path_factory, "queue", "--GPULeaseHub.queue_max_wait=2m",
                             '--GPULeaseHub.auditor_groups=["auditors"]'),
            **{wait: new_hub(tmp_path_factory, f"wait{wait}",
                             f"--GPULeaseHub.queue_max_wait={wait}", quick=False)
               for wait in MAX_WAITS}}
    start_together(*made.values())
    yield made
    close_together(*made.values())


@pytest.fixture(scope="module")
def hub(hubs):
    return hubs["queue"]


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", ADMIN_PW)


def start(hub, user, token, profile="slice", server=""):
    path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
    return hub.api("POST", path, token, {"user_options": {"profile": profile}})


def stop(hub, user, token, server=""):
    path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
    r = hub.api("DELETE", path, token)
    assert r.status_code in (202, 204), r.text
    hub.wait_server_stopped(user, token, server)


def test_a_queued_start_waits_with_its_position_and_starts_when_a_slice_frees(hub, admin):
    tokens = {n: hub.add_user(admin, n) for n in ("ada", "bob", "cy")}
    for n in ("ada", "bob"):
        assert start(hub, n, tokens[n]).status_code in (201, 202)
        hub.wait_server_ready(n, tokens[n])
    r = start(hub, "cy", tokens["cy"])
    assert r.status_code == 202, r.text  # accepted: waiting in the queue
    messages = wait_for_progress(hub, "cy", tokens["cy"], WAITING)
    assert messages[-1] == WAITING
    assert queue_of(hub, admin) == [
        {"user": "cy", "server": "", "profile": "slice", "position": 1}]
    # what the spawn page and api/profiles show: none free, one waiting
    (slice_view,) = [p for p in hub.service("GET", "api/profiles", tokens["bob"]).json()[
        "profiles"] if p["slug"] == "slice"]
    assert slice_view["availability"]["free"] == 0
    assert slice_view["availability"]["queued"] == 1
    stop(hub, "ada", tokens["ada"])
    hub.wait_server_ready("cy", tokens["cy"], timeout=20)
    assert queue_of(hub, admin) == []
    notices = hub.service("GET", "api/notices", tokens["cy"]).json()["notices"]
    (started,) = [n for n in notices if n["kind"] == "queued_started"]
    assert "has started" in started["message"] and "(slice)" in started["message"]
    for n in ("bob", "cy"):
        stop(hub, n, tokens[n])


def test_an_empty_body_start_as_vs_code_sends_waits_in_the_queue_on_its_saved_profile(hub, admin):
    """VS Code sends no body: a named server saved for the slice profile queues like the web."""
    tokens = {n: hub.add_user(admin, n) for n in ("gus", "hal", "ivy")}
    for n in ("gus", "hal"):
        assert start(hub, n, tokens[n]).status_code in (201, 202)
        hub.wait_server_ready(n, tokens[n])
    r = hub.service("POST", "api/servers", tokens["ivy"],
                    {"name": "remote", "user_options": {"profile": "slice"}})
    assert r.status_code == 201, r.text
    r = requests.post(f"{hub.url}/hub/api/users/ivy/servers/remote",
                      headers={"Authorization": f"token {tokens['ivy']}"}, timeout=30)
    assert r.status_code == 202, r.text  # no body at all, as VS Code's extension
    wait_for_progress(hub, "ivy", tokens["ivy"], WAITING, server="remote")
    assert queue_of(hub, admin) == [
        {"user": "ivy", "server": "remote", "profile": "slice", "position": 1}]
    stop(hub, "gus", tokens["gus"])
    hub.wait_server_ready("ivy", tokens["ivy"], server="remote", timeout=20)
    inventory = hub.service("GET", "api/inventory", admin).json()
    held = [d["profile"] for n in inventory["nodes"] for g in n["gpus"] for d in g["devices"]
            if d["holder"] and (d["holder"]["user"], d["holder"]["server"]) == ("ivy", "remote")]
    assert held == ["1g.18gb"]  # the saved profile's slice, once one was free
    for n, server in (("hal", ""), ("ivy", "remote")):
        stop(hub, n, tokens[n], server)


def test_stopping_a_queued_start_takes_it_out_of_the_queue(hub, admin):
    tokens = {n: hub.add_user(admin, n) for n in ("dee", "eli", "fay")}
    for n in ("dee", "eli"):
        assert start(hub, n, tokens[n]).status_code in (201, 202)
        hub.wait_server_ready(n, tokens[n])
    assert start(hub, "fay", tokens["fay"], server="w").status_code == 202
    wait_for_progress(hub, "fay", tokens["fay"], WAITING, server="w")
    assert [q["user"] for q in queue_of(hub, admin)] == ["fay"]
    stop(hub, "fay", tokens["fay"], server="w")
    assert queue_of(hub, admin) == []
    # the slice freed next goes to nobody in the queue
    stop(hub, "dee", tokens["dee"])
    time.sleep(1.5)
    model = hub.api("GET", "users/fay", tokens["fay"]).json()
    assert "w" not in model["servers"]
    stop(hub, "eli", tokens["eli"])


def test_a_start_over_the_users_limit_is_409_and_keeps_its_options(hub, admin):
    token = hub.add_user(admin, "dora")
    r = hub.service("PUT", "api/limits/user:dora", admin, {"max_slices": 1})
    assert r.status_code == 200, r.text
    assert r.json() == {"subject": "user:dora", "max_gpus": None, "max_slices": 1}
    # server "two" has saved options: CPU
    assert start(hub, "dora", token, "cpu", server="two").status_code in (201, 202)
    hub.wait_server_ready("dora", token, "two")
    stop(hub, "dora", token, "two")
    assert start(hub, "dora", token, server="one").status_code in (201, 202)
    hub.wait_server_ready("dora", token, "one")
    r = start(hub, "dora", token, server="two")
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "user:dora" in message and "max_slices 1" in message and "dora/one" in message
    model = hub.api("GET", "users/dora?include_stopped_servers=1", admin).json()
    assert model["servers"]["two"]["user_options"] == {"profile": "cpu"}
    assert queue_of(hub, admin) == []
    stop(hub, "dora", token, "one")


# --- the limits API and CLI -------------------------------------------------------------


@pytest.fixture(scope="module")
def people(hub, admin):
    tokens = {n: hub.add_user(admin, n) for n in ("audrey", "uma")}
    hub.join_group(admin, "auditors", ["audrey"])
    hub.api("POST", "groups/lab", admin)
    r = hub.api("POST", "groups/lab/users", admin, {"users": ["uma"]})
    assert r.status_code == 200, r.text
    return tokens


def test_limits_api_permissions(hub, admin, people):
    body = {"max_gpus": 2}
    r = requests.put(f"{hub.urls.service()}api/limits/user:uma", json=body, timeout=10)
    assert r.status_code == 403 and r.json()["message"]
    assert requests.get(f"{hub.urls.service()}api/limits", timeout=10).status_code == 403
    for who in ("audrey", "uma"):
        r = hub.service("PUT", "api/limits/user:uma", people[who], body)
        assert r.status_code == 403, (who, r.text)
    r = hub.service("PUT", "api/limits/group:lab", admin, {"max_gpus": 2, "max_slices": 3})
    assert r.status_code == 200, r.text
    # auditors see every limit, users those that apply to them
    subjects = [x["subject"] for x in
                hub.service("GET", "api/limits", people["audrey"]).json()["limits"]]
    assert "group:lab" in subjects
    mine = hub.service("GET", "api/limits", people["uma"]).json()["limits"]
    assert mine == [{"subject": "group:lab", "max_gpus": 2, "max_slices": 3}]
    assert hub.service("GET", "api/limits/user:dora", people["uma"]).status_code == 403
    # the change is in the audit log, with before and after
    engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    try:
        from sqlalchemy import select

        from gpulease.store.db import audit_log
        with engine.connect() as conn:
            rows = conn.execute(select(audit_log).where(audit_log.c.target == "group:lab")).all()
    finally:
        engine.dispose()
    assert [(r.actor, r.action, r.before) for r in rows] == [("admin", "limits.set", None)]
    assert json.loads(rows[0].after) == {"max_gpus": 2, "max_slices": 3}


@pytest.mark.parametrize("path, body, fields", [
    ("api/limits/user:uma", {"max_gpus": -1}, ["max_gpus"]),
    ("api/limits/user:uma", {"max_gpus": "2", "max_slices": 1.5}, ["max_gpus", "max_slices"]),
    ("api/limits/user:uma", {"gpus": 1}, ["gpus"]),
    ("api/limits/user:uma", [1], ["body"]),
    ("api/limits/team:x", {"max_gpus": 1}, ["subject"]),  # not a subject
])
def test_limits_api_bad_input_is_400_field_by_field(hub, admin, people, path, body, fields):
    r = hub.service("PUT", path, admin, body)
    if fields is None:
        assert r.status_code == 404, r.text
        return
    assert r.status_code == 400, r.text
    assert [e["field"] for e in r.json()["errors"]] == fields


def test_limits_cli(hub, people):
    done = hub.cli("limits", "set", "uma", "--max-gpus", "1", "--max-slices", "none")
    assert done.returncode == 0, done.stderr
    assert "user:uma: max_gpus 1, max_slices no limit" in done.stdout
    listed = hub.cli("limits", "list")
    assert listed.returncode == 0 and "user:uma: max_gpus 1" in listed.stdout
    bad = hub.cli("limits", "set", "user:uma", "--max-gpus", "-3")
    assert bad.returncode != 0 and "negative" in bad.stderr


# --- queue_max_wait: 0 (no queue) and a few seconds ----------------------------------------


@pytest.mark.parametrize("wait", MAX_WAITS)
def test_queue_max_wait(hubs, wait):
    h = hubs[wait]
    admin = h.token_for("admin", ADMIN_PW)
    tokens = {n: h.add_user(admin, n) for n in ("a1", "a3")}
    for server in ("x", "y"):  # both slices held
        assert start(h, "a1", tokens["a1"], server=server).status_code in (201, 202)
        h.wait_server_ready("a1", tokens["a1"], server)
    t0 = time.monotonic()
    r = start(h, "a3", tokens["a3"])
    took = time.monotonic() - t0
    assert r.status_code == 503, r.text
    message = r.json()["message"]
    assert "Free now: nothing" in message
    if wait == "0":
        assert "0 of 2 free" in message and took < 2
    else:
        assert "queue_max_wait" in message and "2s" in message and took >= 2
    assert queue_of(h, admin) == []
    model = h.api("GET", "users/a3", tokens["a3"]).json()
    assert "" not in model["servers"]
