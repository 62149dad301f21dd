"""End to end: admins change profiles on a running hub; every change is audited.

One hub for the module, started on a state folder whose audit log already
holds an entry older than the retention (pruned at start). Users: admin (the
first-run hub admin) and alice. Covers validation of every profile field
through the API (nothing half-applied), DELETE with 409 / force, starts whose
saved profile was deleted, live profile changes seen by the spawner, a price
change that does not reprice a running session, and `GET api/audit`.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest
import yaml

from gpulease.core.clock import utcnow
from gpulease.host.state import prepare_state_dir
from gpulease.store.audit import AuditLog
from gpulease.store.db import open_database, sqlite_url
from gpulease.store.sessions import SessionLedger
from tests.support.hubproc import HubProcess

pytestmark = pytest.mark.e2e
ADMIN_PW = "admin-secret-pw"
ALICE_PW = "alice-pw-12345"

CPU = {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
       "price_per_hour": "0.10", "min_run": "1m"}
CPU_BODY = {k: v for k, v in CPU.items() if k != "slug"}  # PUT api/profiles/{slug} body
PROFILES = {"profiles": [
    CPU,
    {"slug": "h200-1g", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 2, "memory": "8Gi", "images": ["pytorch"], "price_per_hour": "1.20"},
]}
# A valid body for PUT api/profiles/{slug}; tests break one field at a time.
GOOD = {"display_name": "Test", "description": "", "gpu": {"model": "H200", "mig": "1g.18gb"},
        "cpu": 2, "memory": "8Gi", "images": ["pytorch"], "price_per_hour": "1.50",
        "min_run": "1m", "idle_timeout": "30m", "max_runtime": "0", "groups": [],
        "enabled": True}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("profiles-admin")
    profiles = base / "profiles.yaml"
    profiles.write_text(yaml.safe_dump(PROFILES))
    # An audit log from an earlier run: one entry past the retention, one within.
    state = prepare_state_dir(base / "state")
    engine = open_database(state.gpulease_db_url)
    old = AuditLog(engine)
    old.record("admin", "credits.grant", "user:ancient", None, {}, at=utcnow() - dt.timedelta(40))
    old.record("admin", "credits.grant", "user:recent", None, {}, at=utcnow() - dt.timedelta(20))
    engine.dispose()
    h = HubProcess(state=base / "state", admin_password=ADMIN_PW, extra_args=[
        f"--profiles={profiles}", "--GPULeaseHub.audit_retention=30d",
        "--Spawner.poll_interval=1",
    ]).start()
    yield h
    h.close()


@pytest.fixture(scope="module")
def admin(hub):
    return hub.token_for("admin", ADMIN_PW)


@pytest.fixture(scope="module")
def alice(hub, admin):
    r = hub.service("POST", "api/users", admin, {"name": "alice", "password": ALICE_PW})
    assert r.status_code == 201, r.text
    hub.grant(admin, "user:alice", "50")
    return hub.token_for("alice", ALICE_PW)


@pytest.fixture(scope="module")
def engine(hub):
    eng = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    yield eng
    eng.dispose()


def audit(hub, token, **params) -> dict:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    r = hub.service("GET", f"api/audit?{query}", token)
    assert r.status_code == 200, r.text
    return r.json()


def slugs(hub, admin) -> set[str]:
    return {p["slug"] for p in hub.service("GET", "api/profiles", admin).json()["profiles"]}


def start(hub, token, user, server, options=None):
    body = None if options is None else {"user_options": options}
    return hub.api("POST", f"users/{user}/servers/{server}", token, body)


def stop(hub, token, user, server):
    assert hub.api("DELETE", f"users/{user}/servers/{server}", token).status_code in (202, 204)
    hub.wait_server_stopped(user, token, server)


# --- start: the profiles file is audited, old entries pruned ------------------------------

def test_start_prunes_old_entries_and_audits_the_profiles_file(hub, admin):
    got = audit(hub, admin, target="user:ancient")
    assert got == {"entries": [], "total": 0}
    assert audit(hub, admin, target="user:recent")["total"] == 1
    applied = audit(hub, admin, actor="profiles-file")
    assert applied["total"] == 2
    assert {(e["action"], e["target"]) for e in applied["entries"]} == {
        ("profile.create", "profile:cpu"), ("profile.create", "profile:h200-1g")}
    entry = next(e for e in applied["entries"] if e["target"] == "profile:cpu")
    assert entry["before"] is None and entry["after"]["price_per_hour"] == "0.1"
    assert entry["at"].endswith("Z") and isinstance(entry["id"], int)


def test_a_bad_retention_stops_up_with_a_clear_message(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gpulease.hub.cli", "up", f"--state={tmp_path / 'state'}",
         "--GPULeaseHub.audit_retention=forever"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "audit_retention: 'forever' is not a retention" in r.stderr and "180d" in r.stderr


# --- validation: every field, field by field, nothing half-applied ---------------------

def _with(**changes) -> dict:
    body = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is ...:
            body.pop(key)
        else:
            body[key] = value
    return body


BAD_BODIES = [
    ("gpu.mig", _with(gpu={"model": "H200", "mig": "1g.10gb"}), "1g.18gb"),
    ("gpu.mig", _with(gpu={"model": "L40S", "mig": "1g.10gb"}), "no MIG profiles"),
    ("gpu.mig", _with(gpu={"model": "H200", "mig": 3}), "MIG profile name"),
    ("gpu.model", _with(gpu={"model": "H300", "count": 1}), "known models"),
    ("gpu.model", _with(gpu={"count": 1}), "is required"),
    ("gpu.count", _with(gpu={"model": "H200", "count": 0}), "1 to 8"),
    ("gpu.count", _with(gpu={"model": "H200", "count": 9}), "1 to 8"),
    ("gpu.count", _with(gpu={"model": "H200", "count": "2"}), "whole number"),
    ("gpu.count", _with(gpu={"model": "H200", "mig": "1g.18gb", "count": 2}), "not both"),
    ("gpu.vram", _with(gpu={"model": "H200", "count": 1, "vram": "80Gi"}), "unknown key"),
    ("gpu", _with(gpu="H200"), "mapping"),
    ("images", _with(images=["nope"]), "not in the image catalog"),
    ("images", _with(images=[]), "non-empty list"),
    ("images", _with(images=["pytorch", "pytorch"]), "listed twice"),
    ("memory", _with(memory="32GB"), "not a quantity"),
    ("memory", _with(memory="0"), "more than 0"),
    ("memory", _with(memory=...), "is required"),
    ("cpu", _with(cpu=0), "more than 0"),
    ("cpu", _with(cpu="lots"), "CPU amount"),
    ("price_per_hour", _with(price_per_hour="-1"), "must not be negative"),
    ("price_per_hour", _with(price_per_hour="1.0000001"), "6 decimals"),
    ("price_per_hour", _with(price_per_hour="cheap"), "not an amount"),
    ("price_per_hour", _with(price_per_hour=...), "is required"),
    ("min_run", _with(min_run="10"), "durations look like"),
    ("idle_timeout", _with(idle_timeout="1d"), "durations look like"),
    ("max_runtime", _with(max_runtime="-5m"), "durations look like"),
    ("min_run", _with(min_run="2h", max_runtime="1h"), "longer than max_runtime"),
    ("groups", _with(groups="staff"), "list of group names"),
    ("groups", _with(groups=["lab", "lab"]), "twice"),
    ("groups", _with(groups=["lab, vision"]), "its own item"),
    ("groups", _with(groups=[" lab"]), "surrounding spaces"),
    ("enabled", _with(enabled="yes"), "true or false"),
    ("display_name", _with(display_name=...), "is required"),
    ("description", _with(description=5), "must be a string"),
    ("colour", _with(colour="red"), "unknown key"),
    ("slug", _with(slug="other"), "equal the URL's"),
]


@pytest.mark.parametrize("field, body, words", BAD_BODIES,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_BODIES)])
def test_every_profile_field_is_validated_and_nothing_written(hub, admin, field, body, words):
    r = hub.service("PUT", "api/profiles/bad", admin, body)
    assert r.status_code == 400, r.text
    errors = {e["field"]: e["message"] for e in r.json()["errors"]}
    assert field in errors, errors
    assert words in errors[field], errors[field]
    assert "bad" not in slugs(hub, admin)


def test_every_problem_of_one_body_is_answered_at_once(hub, admin):
    body = _with(gpu={"model": "H200", "mig": "9g.9gb"}, price_per_hour="-1", memory="x",
                 enabled="no", extra=1)
    r = hub.service("PUT", "api/profiles/bad", admin, body)
    assert r.status_code == 400
    fields = {e["field"] for e in r.json()["errors"]}
    assert fields == {"gpu.mig", "price_per_hour", "memory", "enabled", "extra"}
    r = hub.service("PUT", "api/profiles/-dash", admin, GOOD)  # the URL's slug is checked too
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "slug"


def test_a_body_slug_that_differs_is_named_as_written_not_as_python(hub, admin):
    for slug, words in ((None, "slug null (no value) differs"), (7, "slug the number 7 differs"),
                        ("other", "slug 'other' differs")):
        r = hub.service("PUT", "api/profiles/bad", admin, {**GOOD, "slug": slug})
        assert r.status_code == 400 and words in r.json()["message"], r.text
        assert "None" not in r.json()["message"]


def test_bulk_put_with_one_bad_profile_changes_nothing(hub, admin, engine):
    before = slugs(hub, admin)
    entries_before = audit(hub, admin)["total"]
    doc = {"profiles": [{**GOOD, "slug": "bulk-ok"},
                        {**GOOD, "slug": "bulk-bad", "gpu": {"model": "H200", "mig": "1g.5gb"}},
                        {**CPU, "price_per_hour": "9"}], "prune": True}
    r = hub.service("PUT", "api/profiles", admin, doc)
    assert r.status_code == 400, r.text
    assert "nothing was changed" in r.json()["message"]
    assert [e["field"] for e in r.json()["errors"]] == ["profiles[1] (bulk-bad): gpu.mig"]
    assert slugs(hub, admin) == before  # neither created nor pruned nor repriced
    cpu = next(p for p in hub.service("GET", "api/profiles", admin).json()["profiles"]
               if p["slug"] == "cpu")
    assert cpu["price_per_hour"] == "0.1"
    assert audit(hub, admin)["total"] == entries_before
    for doc, field in (({"profiles": "x"}, "profiles"), ({"profiles": [], "prune": "y"}, "prune")):
        r = hub.service("PUT", "api/profiles", admin, doc)
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == field


def test_bulk_apply_audits_one_entry_per_change(hub, admin):
    doc = {"profiles": [CPU, PROFILES["profiles"][1], {**GOOD, "slug": "bulk-a"},
                        {**GOOD, "slug": "bulk-b"}]}
    r = hub.service("PUT", "api/profiles", admin, doc)
    assert r.status_code == 200, r.text
    assert sorted(r.json()["created"]) == ["bulk-a", "bulk-b"]
    doc["profiles"] = doc["profiles"][:2] + [{**GOOD, "slug": "bulk-a", "price_per_hour": "2"}]
    r = hub.service("PUT", "api/profiles", admin, {**doc, "prune": True})
    assert r.status_code == 200 and r.json()["deleted"] == ["bulk-b"], r.text
    mine = [(e["action"], e["target"]) for e in audit(hub, admin, actor="admin")["entries"]
            if e["target"] in ("profile:bulk-a", "profile:bulk-b")]
    # newest first: the second apply's delete and update, then the first apply's creates
    assert sorted(mine[:2]) == [("profile.delete", "profile:bulk-b"),
                                ("profile.update", "profile:bulk-a")]
    assert sorted(mine[2:]) == [("profile.create", "profile:bulk-a"),
                                ("profile.create", "profile:bulk-b")]
    update = audit(hub, admin, target="profile:bulk-a", action="profile.update")["entries"][0]
    assert (update["before"]["price_per_hour"], update["after"]["price_per_hour"]) == ("1.5", "2")


# --- live changes, price changes, deletion ---------------------------------------------

def test_profile_changes_reach_the_spawner_without_restart(hub, admin, alice, engine):
    # a profile created through the API is startable at once
    r = hub.service("PUT", "api/profiles/live", admin, CPU_BODY)
    assert r.status_code == 201 and r.json()["result"] == "created", r.text
    assert start(hub, alice, "alice", "early", {"profile": "live"}).status_code in (201, 202)
    hub.wait_server_ready("alice", alice, "early")
    early = SessionLedger(engine).open_for("alice", "early")
    assert early.profile == "live" and early.rate_per_hour_ucr == 100_000
    # a new price applies to new starts only
    r = hub.service("PUT", "api/profiles/live", admin, {**CPU_BODY, "price_per_hour": "0.36"})
    assert r.status_code == 200 and r.json()["result"] == "updated", r.text
    assert start(hub, alice, "alice", "late", {"profile": "live"}).status_code in (201, 202)
    hub.wait_server_ready("alice", alice, "late")
    assert SessionLedger(engine).open_for("alice", "late").rate_per_hour_ucr == 360_000
    assert SessionLedger(engine).open_for("alice", "early").rate_per_hour_ucr == 100_000
    usage = {s["server"]: s for s in hub.service("GET", "api/usage", alice).json()["sessions"]}
    assert usage["early"]["profile"] == usage["late"]["profile"] == "live"
    # the change is audited with who, before and after
    entry = audit(hub, admin, target="profile:live", limit=1)["entries"][0]
    assert (entry["action"], entry["actor"]) == ("profile.update", "admin")
    assert (entry["before"]["price_per_hour"], entry["after"]["price_per_hour"]) == ("0.1",
                                                                                     "0.36")
    # disabled or group-restricted at once, refused at spawn
    r = hub.service("PUT", "api/profiles/shut", admin, {**CPU_BODY, "enabled": False})
    assert r.status_code == 201, r.text
    r = start(hub, alice, "alice", "nope", {"profile": "shut"})
    assert r.status_code == 400 and "is disabled" in r.json()["message"], r.text
    r = hub.service("PUT", "api/profiles/vision", admin, {**CPU_BODY, "groups": ["vision"]})
    assert r.status_code == 201, r.text
    r = start(hub, alice, "alice", "nope", {"profile": "vision"})
    assert r.status_code == 403 and "vision" in r.json()["message"], r.text


def test_delete_is_refused_while_servers_keep_the_profile_unless_forced(hub, admin, alice):
    r = hub.service("DELETE", "api/profiles/no-such", admin)
    assert r.status_code == 404 and r.json()["errors"][0]["field"] == "slug"
    stop(hub, alice, "alice", "late")  # stopped servers keep their saved options too
    r = hub.service("DELETE", "api/profiles/live", admin)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["servers"] == [{"user": "alice", "server": "early", "running": True},
                               {"user": "alice", "server": "late", "running": False}]
    assert "alice/early (running)" in body["message"] and "alice/late (stopped)" in body["message"]
    assert "?force=true" in body["message"]
    assert "live" in slugs(hub, admin)
    r = hub.service("DELETE", "api/profiles/live?force=maybe", admin)
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "force"
    r = hub.service("DELETE", "api/profiles/live?force=true", admin)
    assert r.status_code == 200 and r.json()["result"] == "deleted", r.text
    assert "live" not in slugs(hub, admin)
    entry = audit(hub, admin, target="profile:live", limit=1)["entries"][0]
    assert (entry["action"], entry["actor"], entry["after"]) == ("profile.delete", "admin", None)
    assert entry["before"]["price_per_hour"] == "0.36"
    # a profile nobody saved goes without force
    assert hub.service("DELETE", "api/profiles/shut", admin).status_code == 200


def test_a_server_whose_profile_was_deleted_asks_for_a_new_one(hub, admin, alice):
    r = start(hub, alice, "alice", "late")  # empty body: reuse the saved options
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert "'live'" in message and "deleted by an admin" in message
    assert "cpu" in message and "h200-1g (GPU)" in message
    model = hub.api("GET", "users/alice?include_stopped_servers=1", admin).json()
    assert model["servers"]["late"]["user_options"]["profile"] == "live"  # kept, not overwritten
    # the running one keeps running on its rate; choosing a new profile works
    assert model["servers"]["early"]["ready"]
    stop(hub, alice, "alice", "early")
    assert start(hub, alice, "alice", "late", {"profile": "cpu"}).status_code in (201, 202)
    hub.wait_server_ready("alice", alice, "late")
    stop(hub, alice, "alice", "late")


# --- the audit API ----------------------------------------------------------------------

def test_credits_caps_and_users_are_audited_without_passwords(hub, admin, alice):
    r = hub.service("POST", "api/credits", admin,
                    {"account": "group:lab", "amount": "10", "note": "start-up"})
    assert r.status_code == 201, r.text
    r = hub.service("POST", "api/adjustments", admin,
                    {"account": "group:lab", "amount": "-2.5", "note": "refund"})
    assert r.status_code == 201, r.text
    assert hub.service("PUT", "api/accounts/group:lab/caps/alice", admin,
                       {"monthly": "3"}).status_code == 200
    assert hub.service("PUT", "api/accounts/group:lab/caps/alice", admin,
                       {"monthly": None}).status_code == 200
    r = hub.service("POST", "api/users", admin, {"name": "zed", "password": "zed-secret-pw-1"})
    assert r.status_code == 201
    lab = audit(hub, admin, target="group:lab")["entries"]
    assert [e["action"] for e in lab] == ["cap.set", "cap.set", "credits.adjust",
                                          "credits.grant"]
    grant = lab[3]
    assert grant["before"] == {"balance": "0.000000"}
    assert grant["after"]["balance"] == "10.000000" and grant["after"]["note"] == "start-up"
    assert lab[2]["after"]["amount"] == "-2.500000" and lab[2]["after"]["balance"] == "7.500000"
    assert lab[1]["before"]["monthly"] is None and lab[1]["after"]["monthly"] == "3.000000"
    assert lab[0]["before"]["monthly"] == "3.000000" and lab[0]["after"]["monthly"] is None
    assert all(e["actor"] == "admin" for e in lab)
    created = audit(hub, admin, target="user:zed")["entries"]
    assert [(e["action"], e["after"]) for e in created] == [
        ("user.create", {"name": "zed", "admin": False})]
    everything = hub.service("GET", "api/audit?limit=1000", admin).text
    for secret in ("zed-secret-pw-1", ALICE_PW):
        assert secret not in everything


def test_audit_filters_paging_and_bad_values(hub, admin):
    whole = audit(hub, admin, limit=1000)
    total = whole["total"]
    assert total == len(whole["entries"]) > 10
    stamps = [e["at"] for e in whole["entries"]]
    assert stamps == sorted(stamps, reverse=True)  # newest first
    page = audit(hub, admin, limit=3, offset=2)
    assert page["total"] == total and page["entries"] == whole["entries"][2:5]
    assert len(audit(hub, admin)["entries"]) == min(total, 100)
    today = dt.datetime.now(dt.UTC).date()
    assert audit(hub, admin, since=today.isoformat())["total"] == total - 1  # not "recent"
    assert audit(hub, admin, until=today.isoformat())["total"] == 1
    assert audit(hub, admin, until=f"{today}T00:00:00Z")["total"] == 1
    for query, field in (("limit=0", "limit"), ("limit=1001", "limit"), ("offset=-3", "offset"),
                         ("since=soon", "since"), ("until=2020-01-01&since=2021-01-01", "until"),
                         ("limit=many", "limit")):
        r = hub.service("GET", f"api/audit?{query}", admin)
        assert r.status_code == 400, (query, r.text)
        assert r.json()["errors"][0]["field"] == field
