"""End to end on a real hub: what an empty-body start resolved is saved, starts at once
cannot overspend one balance, a paid profile with no minimum run needs credit above
zero, and `gpulease users add --admin` makes a hub admin.

Servers run JupyterHub's mock single-user server (a catalog image of our own whose
local environment starts `jupyterhub.tests.mocksu`), so a start takes about a second.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

PROFILES = {"profiles": [
    # 6 credits/h: its 10-minute minimum run costs exactly 1 credit
    {"slug": "paid", "display_name": "Paid CPU", "cpu": 1, "memory": "1Gi", "images": ["mock"],
     "price_per_hour": "6", "min_run": "10m"},
    {"slug": "paid0", "display_name": "Paid, no minimum run", "cpu": 1, "memory": "1Gi",
     "images": ["mock"], "price_per_hour": "3.6", "min_run": "0"},
    {"slug": "free", "display_name": "Free CPU", "cpu": 1, "memory": "1Gi", "images": ["mock"],
     "price_per_hour": "0", "min_run": "0"},
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "1Gi", "images": ["mock"], "price_per_hour": "1.20", "min_run": "1m"},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "580.159", "mig": ["1g.18gb"]}]}]}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, inventory=INVENTORY, mock_catalog=True,
                      config="c.Spawner.poll_interval = 1\n",
                      args=["--GPULeaseHub.culler_enabled=False", "--GPULeaseHub.queue_max_wait=0",
                            '--GPULeaseHub.admin_groups=["gladmins"]'])


def server_path(user: str, server: str) -> str:
    return f"users/{user}/servers/{server}" if server else f"users/{user}/server"


def saved_options(hub, admin, user: str, server: str = "") -> dict | None:
    model = hub.api("GET", f"users/{user}?include_stopped_servers=1", admin).json()
    srv = model["servers"].get(server)
    return None if srv is None else srv["user_options"]


def stop(hub, user, token, server=""):
    r = hub.api("DELETE", server_path(user, server), token)
    assert r.status_code in (202, 204), r.text
    hub.wait_server_stopped(user, token, server)


# --- 5: what an empty-body start resolved is saved ------------------------------------------

def test_empty_body_start_saves_the_default_profile_it_resolved(hub, admin):
    token = hub.add_user(admin, "dee")
    r = hub.service("PUT", "api/me/default-profile", token, {"profile": "paid"})
    assert r.status_code == 200, r.text
    r = hub.api("POST", "users/dee/server", token)  # no body at all, as VS Code sends
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("dee", token)
    # the user's own view, through JupyterHub's API
    model = hub.api("GET", "users/dee", token).json()
    want = {"profile": "paid", "image": "mock", "account": "user:dee", "tier": "on-demand"}
    assert model["servers"][""]["user_options"] == want
    stop(hub, "dee", token)
    # a later resume with no body gets the same, even after the default changed
    hub.service("PUT", "api/me/default-profile", token, {"profile": "paid0"})
    assert hub.api("POST", "users/dee/server", token).status_code in (201, 202)
    hub.wait_server_ready("dee", token)
    sessions = hub.service("GET", "api/usage", token).json()["sessions"]
    assert [s["profile"] for s in sessions] == ["paid", "paid"]
    assert saved_options(hub, admin, "dee") == want
    stop(hub, "dee", token)


def test_empty_body_start_saves_the_cpu_fallback_it_resolved(hub, admin):
    token = hub.add_user(admin, "eve")
    r = hub.api("POST", "users/eve/servers/vsc", token, {})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("eve", token, "vsc")
    assert saved_options(hub, admin, "eve", "vsc") == {
        "profile": "free", "image": "mock", "account": "user:eve", "tier": "on-demand"}
    stop(hub, "eve", token, "vsc")


def test_refused_empty_body_start_saves_nothing(hub, admin):
    """The default profile resolves, then the user's limit refuses it: nothing is saved."""
    token = hub.add_user(admin, "fay")
    assert hub.service("PUT", "api/me/default-profile", token,
                       {"profile": "slice"}).status_code == 200
    assert hub.service("PUT", "api/limits/user:fay", admin, {"max_slices": 0}).status_code == 200
    r = hub.api("POST", "users/fay/servers/gpu", token)
    assert r.status_code == 409, r.text
    assert saved_options(hub, admin, "fay", "gpu") in (None, {})


# --- 9: starts at once cannot overspend one balance -----------------------------------------

def test_six_concurrent_starts_on_two_minimum_runs_start_exactly_two(hub, admin):
    token = hub.add_user(admin, "gus", "2")  # exactly two 10-minute runs of `paid`
    names = ["", "s1", "s2", "s3", "s4", "s5"]  # his default and 5 named: the most he may have

    def start(i: int):
        return hub.api("POST", server_path("gus", names[i]), token,
                       {"user_options": {"profile": "paid"}})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(start, range(6)))
    statuses = sorted(r.status_code for r in answers)
    assert sum(s in (201, 202) for s in statuses) == 2, [r.text for r in answers]
    refused = [r for r in answers if r.status_code == 402]
    assert len(refused) == 4, [r.text for r in answers]
    for r in refused:
        message = r.json()["message"]
        assert "Not enough credit on user:gus: balance 2.000000, of which 2.000000 is held" \
            in message, message
        assert "needs 1.000000 for paid's minimum run of 10m" in message
    started = [names[i] for i, r in enumerate(answers) if r.status_code in (201, 202)]
    for name in started:
        hub.wait_server_ready("gus", token, name)
    # once both run, another start is still refused: their minimum runs are not used up
    r = start(next(i for i, r in enumerate(answers) if r.status_code == 402))
    assert r.status_code == 402 and "2 running servers within their minimum run" in r.text, r.text
    for name in started:
        stop(hub, "gus", token, name)


# --- 3: a paid profile with min_run 0 needs credit above zero -------------------------------

def test_paid_profile_without_minimum_run_refuses_a_balance_at_zero(hub, admin):
    token = hub.add_user(admin, "hal", None)  # balance 0
    r = hub.api("POST", "users/hal/servers/p", token, {"user_options": {"profile": "paid0"}})
    assert r.status_code == 402, r.text
    assert "balance 0.000000" in r.json()["message"] and "above zero" in r.json()["message"]
    assert saved_options(hub, admin, "hal", "p") in (None, {})
    # the free profile still starts in debt: the user reaches their files
    r = hub.api("POST", "users/hal/servers/f", token, {"user_options": {"profile": "free"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("hal", token, "f")
    stop(hub, "hal", token, "f")
    hub.grant(admin, "user:hal", "0.000001")
    r = hub.api("POST", "users/hal/servers/p", token, {"user_options": {"profile": "paid0"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("hal", token, "p")
    stop(hub, "hal", token, "p")


# --- 10: `gpulease users add --admin` ------------------------------------------------------

def test_cli_users_add_admin_makes_a_hub_admin(hub, admin):
    password = "ivy-Pw-93f1c2"
    added = hub.cli("users", "add", "ivy", "--admin", "--password-stdin", stdin=password + "\n")
    assert added.returncode == 0, added.stderr
    assert "created user ivy (admin)" in added.stdout
    assert hub.api("GET", "users/ivy", admin).json()["admin"] is True
    # the new admin can log in and act as one
    ivy = hub.token_for("ivy", password)
    assert hub.api("GET", "users", ivy).status_code == 200


def test_only_a_hub_admin_may_create_an_admin(hub, admin):
    """A gpulease admin by group (not a hub admin) may create users, not hub admins."""
    token = hub.add_user(admin, "jon", None)
    assert hub.api("POST", "groups/gladmins", admin).status_code in (201, 409)
    assert hub.api("POST", "groups/gladmins/users", admin, {"users": ["jon"]}).status_code == 200
    r = hub.service("POST", "api/users", token,
                    {"name": "kim", "password": "kim-pw-123456", "admin": True})
    assert r.status_code == 403, r.text
    assert "only a hub admin may" in r.json()["message"] and "jon" in r.json()["message"]
    assert hub.api("GET", "users/kim", admin).status_code == 404
    assert hub.login_form("kim", "kim-pw-123456").login_status == 403  # no account left
    r = hub.service("POST", "api/users", token, {"name": "kim", "password": "kim-pw-123456"})
    assert r.status_code == 201, r.text
    assert hub.api("GET", "users/kim", admin).json()["admin"] is False


def test_a_gpulease_admin_cannot_take_over_a_hub_admin_without_an_account(hub, admin):
    """A hub admin made on the hub itself (its admin page, its API, admin_users)
    has no local account yet: giving it one with a password of the gpulease
    admin's choosing would make them that hub admin, which JupyterHub lets
    only a hub admin do ("Only admins can modify other admins")."""
    r = hub.api("POST", "users/leo", admin, {"admin": True})
    assert r.status_code == 201, r.text
    token = hub.add_user(admin, "mia", None)
    assert hub.api("POST", "groups/gladmins", admin).status_code in (201, 409)
    assert hub.api("POST", "groups/gladmins/users", admin, {"users": ["mia"]}).status_code == 200
    r = hub.service("POST", "api/users", token, {"name": "leo", "password": "leo-pw-mine-1"})
    assert r.status_code == 403, r.text
    assert "leo is a hub admin" in r.json()["message"], r.text
    assert hub.login_form("leo", "leo-pw-mine-1").login_status == 403  # no account was made
    # a hub admin may give it its account
    r = hub.service("POST", "api/users", admin, {"name": "leo", "password": "leo-pw-admin-1"})
    assert r.status_code == 201, r.text
    assert hub.login_form("leo", "leo-pw-admin-1").login_status == 302
