"""End to end: who may call which admin endpoint of the gpulease service.

One hub for the module, with `--GPULeaseHub.admin_groups=["ops"]` and
`auditor_groups=["auditors"]`. Callers:

- admin: the hub's admin flag (first-run admin), with its full token;
- admin-script, admin-server: tokens of that same hub admin, narrowed: one made
  for a script with only `read:users`, and one scoped as the admin's own
  server's token (Spawner.server_token_scopes, JUPYTERHUB_API_TOKEN in the
  server, where the user's code can read it). The hub's identity answer says
  `admin: true` for both; they must be no gpulease admin (attacks);
- olga: not a hub admin, in group `ops`: the `gpulease-admin` role
  (`custom:gpulease:admin`);
- audrey: in group `auditors`: `custom:gpulease:audit`, read-only;
- alice: a researcher;
- anonymous: no token.

Writes: admins only (others 403, nothing changed). Reads of others' records:
admins and auditors. Anonymous: 403 on the API, a redirect to the login on pages.
"""

from __future__ import annotations

import pytest
import requests

from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e
PW = {name: f"{name}-pw-12345" for name in ("olga", "audrey", "alice", "bob")}
ROLES = ("admin", "admin-script", "admin-server", "olga", "audrey", "alice", "anonymous")
NARROWED = {  # tokens of the hub admin, by the scopes it gave them
    "admin-script": ["read:users", "access:services!service=gpulease"],
    "admin-server": ["users:activity!user=admin", "access:servers!server=admin/",
                     "access:services!service=gpulease"],
}
ADMINS = {"admin", "olga"}
READERS = ADMINS | {"audrey"}

PROFILE = {"display_name": "Perm", "cpu": 1, "memory": "1Gi", "images": ["pytorch"],
           "price_per_hour": "0.5"}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(args=['--GPULeaseHub.admin_groups=["ops"]',
                            '--GPULeaseHub.auditor_groups=["auditors"]',
                            "--GPULeaseHub.culler_enabled=False"])


@pytest.fixture(scope="module")
def tokens(hub) -> dict[str, str | None]:
    admin = hub.admin_token
    for name, pw in PW.items():
        r = hub.service("POST", "api/users", admin, {"name": name, "password": pw})
        assert r.status_code == 201, r.text
    for group, members in (("ops", ["olga"]), ("auditors", ["audrey"]), ("lab", ["alice"])):
        hub.api("POST", f"groups/{group}", admin)  # 409 when the role created it: fine
        r = hub.api("POST", f"groups/{group}/users", admin, {"users": members})
        assert r.status_code == 200, r.text
    # What the endpoints below act on.
    hub.grant(admin, "user:alice", "10")
    hub.grant(admin, "group:lab", "10")
    for role in ROLES:
        r = hub.service("PUT", f"api/profiles/del-{role}", admin, PROFILE)
        assert r.status_code == 201, r.text
    narrowed = {}
    for role, scopes in NARROWED.items():
        r = hub.api("POST", "users/admin/tokens", admin, {"scopes": scopes, "note": role})
        assert r.status_code == 201, r.text
        narrowed[role] = r.json()["token"]
        # the hub itself still calls its owner an admin: what the service once trusted
        who = hub.api("GET", "user", narrowed[role]).json()
        assert who["admin"] is True and "admin:users" not in who["scopes"], who
    return {"admin": admin, "anonymous": None, **narrowed,
            **{name: hub.token_for(name, PW[name]) for name in ("olga", "audrey", "alice")}}


def call(hub, token: str | None, method: str, path: str, body=None) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.request(method, f"{hub.urls.service()}{path}", json=body,
                            headers=headers, allow_redirects=False, timeout=60)


# (id, method, path, body) — {role} in a path or body is the caller's role, so that
# each allowed call has something of its own to change.
WRITES = [
    ("profile-put", "PUT", "api/profiles/perm-{role}", PROFILE, (200, 201)),
    ("profile-delete", "DELETE", "api/profiles/del-{role}", None, (200,)),
    ("profiles-bulk-put", "PUT", "api/profiles",
     {"profiles": [{**PROFILE, "slug": "bulk-{role}"}], "prune": False}, (200,)),
    ("credits", "POST", "api/credits",
     {"account": "user:alice", "amount": "1", "note": "{role}"}, (201,)),
    ("adjustments", "POST", "api/adjustments",
     {"account": "user:alice", "amount": "-0.5", "note": "by {role}"}, (201,)),
    ("caps", "PUT", "api/accounts/group:lab/caps/alice", {"monthly": "5"}, (200,)),
    ("users", "POST", "api/users", {"name": "new-{role}", "password": "long-enough-pw-1"},
     (201,)),
    ("limits", "PUT", "api/limits/user:alice", {"max_gpus": 2, "max_slices": 4}, (200, 201)),
]
READS = [
    ("inventory", "api/inventory"),
    ("audit", "api/audit"),
    ("usage-of-others", "api/usage?user=bob"),
    ("balance-of-others", "api/balance?user=bob"),
    ("caps-read", "api/accounts/group:lab/caps/alice"),
    ("report-page", "admin/report?format=csv"),
]


def _fill(value, role: str):
    if isinstance(value, str):
        return value.replace("{role}", role)
    if isinstance(value, list):
        return [_fill(v, role) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, role) for k, v in value.items()}
    return value


def _audit_total(hub, tokens) -> int:
    return call(hub, tokens["admin"], "GET", "api/audit?limit=1").json()["total"]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name, method, path, body, ok", WRITES, ids=[w[0] for w in WRITES])
def test_admin_writes(hub, tokens, role, name, method, path, body, ok):
    before = _audit_total(hub, tokens)
    r = call(hub, tokens[role], method, _fill(path, role), _fill(body, role))
    if r.status_code == 404 and "No such gpulease API path" in r.text:
        pytest.skip(f"{path} is not served by this build")
    if role in ADMINS:
        assert r.status_code in ok, r.text
        # every admin change is recorded, naming who made it
        latest = call(hub, tokens["admin"], "GET", "api/audit?limit=1").json()["entries"][0]
        assert latest["actor"] == role, latest
    else:
        assert r.status_code == 403, r.text
        assert r.json()["status"] == 403 and r.json()["message"]
        assert _audit_total(hub, tokens) == before  # nothing changed


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name, path", READS, ids=[r[0] for r in READS])
def test_reads_of_others_records(hub, tokens, role, name, path):
    r = call(hub, tokens[role], "GET", path)
    if role in READERS:
        assert r.status_code == 200, r.text
    elif role == "anonymous" and path.startswith("admin/"):
        assert r.status_code == 302 and "/hub/" in r.headers["Location"]  # to the login
    else:
        assert r.status_code == 403, r.text


def test_nothing_was_done_by_those_who_may_not(hub, tokens):
    entries = call(hub, tokens["admin"], "GET", "api/audit?limit=1000").json()["entries"]
    assert {e["actor"] for e in entries} <= {"admin", "olga", "profiles-file"}
    profiles = {p["slug"] for p in call(hub, tokens["admin"], "GET",
                                        "api/profiles").json()["profiles"]}
    for role in ("admin-script", "admin-server", "audrey", "alice", "anonymous"):
        assert f"del-{role}" in profiles and f"perm-{role}" not in profiles
        assert f"bulk-{role}" not in profiles


def test_an_auditor_reads_the_audit_log_but_a_researcher_sees_only_own_usage(hub, tokens):
    r = call(hub, tokens["audrey"], "GET", "api/audit?actor=olga")
    assert r.status_code == 200 and r.json()["total"] >= 1
    assert call(hub, tokens["alice"], "GET", "api/usage").status_code == 200
    assert call(hub, tokens["alice"], "GET", "api/balance").status_code == 200
    r = call(hub, tokens["alice"], "GET", "api/audit")
    assert "custom:gpulease:audit" in r.json()["message"]


def test_only_a_hub_admins_full_token_gives_an_existing_hub_admin_a_password(hub, tokens):
    """Giving an existing hub admin a gpulease account sets its password: a hub
    admin's power. A hub admin's token narrowed to gpulease's admin scope is a
    gpulease admin, not a hub admin: refused, as for olga (admin by group)."""
    admin = tokens["admin"]
    r = hub.api("POST", "users/boss", admin, {"admin": True})  # a hub admin, no account
    assert r.status_code == 201, r.text
    body = {"name": "boss", "password": "takeover-pw-12345"}
    r = hub.api("POST", "groups/ops/users", admin, {"users": ["admin"]})
    assert r.status_code == 200, r.text
    try:
        r = hub.api("POST", "users/admin/tokens", admin, {
            "scopes": ["custom:gpulease:admin", "access:services!service=gpulease"]})
        assert r.status_code == 201, r.text
        gpulease_only = r.json()["token"]
        for token in (gpulease_only, tokens["olga"]):
            r = call(hub, token, "POST", "api/users", body)
            assert r.status_code == 403 and "hub admin already" in r.json()["message"], r.text
        assert call(hub, admin, "POST", "api/users", body).status_code == 201
    finally:
        hub.api("DELETE", "groups/ops/users", admin, {"users": ["admin"]})
