"""End to end: sign-in through a real OpenID Connect provider (tests/oidc/provider.mjs).

A real hub and proxy, and the npm package oidc-provider on loopback; every
login walks the authorize redirect, the provider's login form, its consent
step and the hub's callback over HTTP. Groups at the provider decide what a
researcher may rent; changing them there changes it at the hub.
"""

from __future__ import annotations

import time

import pytest
import requests
import yaml

from gpulease.core.model.profiles import SAMPLE_PROFILES
from tests.support.hubproc import HubProcess, free_port
from tests.support.oidc_provider import (
    OIDCProvider,
    sign_in,
    sign_in_up_to_the_callback,
    signed_in_session,
    xsrf_headers,
)

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLE_PROFILES
REFRESH_S = 2  # auth_refresh_age of this hub

ACCOUNTS = {
    "s-alice": dict(login="alice", password="alice-pw", email="alice@uni.example",
                    preferred_username="alice", groups=["researchers", "vision"]),
    "s-bob": dict(login="bob", password="bob-pw", email="Bob.Smith@uni.example",
                  groups=["researchers"]),
    "s-bob2": dict(login="bob2", password="bob2-pw", preferred_username="bob-smith",
                   email="other.bob@uni.example", groups=["researchers"]),
    "s-mallory": dict(login="mallory", password="mallory-pw", preferred_username="admin",
                      groups=["researchers"]),
    "s-carol": dict(login="carol", password="carol-pw", preferred_username="carol",
                    email="carol@uni.example", groups=["researchers", "hub-admins", "vision"]),
    "s-dave": dict(login="dave", password="dave-pw", preferred_username="dave",
                   groups=["researchers", "vision"]),
    "s-erin": dict(login="erin", password="erin-pw", preferred_username="erin",
                   groups=["researchers"]),
    "s-frank": dict(login="frank", password="frank-pw", preferred_username="frank",
                    groups=["researchers", "auditors"]),
    "s-eve": dict(login="eve", password="eve-pw", preferred_username="eve", groups=["visitors"]),
    "s-gwen": dict(login="gwen", password="gwen-pw", preferred_username="gwen",
                   groups=["researchers"]),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("oidc")
    port = free_port()
    hub_url = f"http://localhost:{port}"  # its public URL (the subdomain host)
    provider = OIDCProvider(base / "provider", [f"{hub_url}/hub/oauth_callback"],
                            [f"{hub_url}/hub/login"]).start()
    for sub, claims in ACCOUNTS.items():
        provider.set_account(sub, **claims)
    profiles = yaml.safe_load(SAMPLE.read_text())
    for p in profiles["profiles"]:
        if p["slug"] == "h200-full":
            p["groups"] = ["vision"]
    (base / "profiles.yaml").write_text(yaml.safe_dump(profiles))
    config = base / "gpulease_config.py"
    config.write_text(provider.hub_config(hub_url, **{
        "GPULeaseOIDCAuthenticator.allowed_groups": {"researchers"},
        "GPULeaseOIDCAuthenticator.auth_refresh_age": REFRESH_S,
        "GPULeaseHub.admin_groups": ["hub-admins"],
        "GPULeaseHub.auditor_groups": ["auditors"],
    }))
    hub = HubProcess(state=base / "state", extra_args=[
        f"--config={config}", f"--GPULeaseHub.profiles_file={base / 'profiles.yaml'}"])
    hub.port, hub.hub_port, hub.api_port = port, free_port(), free_port()
    hub.start()
    hub.admin_token = (hub.state / "private" / "cli_token").read_text().strip()
    hub.granted = set()
    yield hub, provider
    hub.close()
    provider.stop()


def _researcher(hub: HubProcess, login: str, password: str) -> requests.Session:
    """Signed in through the provider, with credit on their hub name."""
    browser = signed_in_session(hub.url, login, password)
    name = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()["name"]
    if name not in hub.granted:
        hub.grant(hub.admin_token, f"user:{name}")
        hub.granted.add(name)
    return browser


def _start(session: requests.Session, hub: HubProcess, user: str, server: str,
           options: dict | None) -> requests.Response:
    body = {"user_options": options} if options is not None else None
    return session.post(f"{hub.url}/hub/api/users/{user}/servers/{server}", json=body,
                        headers=xsrf_headers(session), timeout=60)


def _token(session: requests.Session, hub: HubProcess, user: str) -> str:
    r = session.post(f"{hub.url}/hub/api/users/{user}/tokens", headers=xsrf_headers(session),
                     json={"note": "vscode", "expires_in": 3600}, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["token"]


def _stop(hub: HubProcess, user: str, token: str, server: str) -> None:
    hub.api("DELETE", f"users/{user}/servers/{server}", token)
    hub.wait_server_stopped(user, token, server)


def test_a_login_through_the_provider_and_groups_that_decide_the_profiles(site):
    hub, provider = site
    browser = _researcher(hub, "alice", "alice-pw")
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert me["name"] == "alice" and set(me["groups"]) == {"researchers", "vision"}
    assert not me["admin"]
    token = _token(browser, hub, "alice")

    r = _start(browser, hub, "alice", "big", {"profile": "h200-full"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", token, "big")
    _stop(hub, "alice", token, "big")

    # Removed from `vision` at the provider: the resume (an empty-body start on the
    # saved profile), a new start and a VS Code token's start all lose h200-full.
    provider.set_account("s-alice", groups=["researchers"])
    r = _start(browser, hub, "alice", "big", None)
    assert r.status_code == 403, r.text
    assert "h200-full" in r.json()["message"]
    r = hub.api("POST", "users/alice/servers/other", token, {"user_options": {"profile": "h200-full"}})
    assert r.status_code == 403, r.text
    me = hub.api("GET", "user", token).json()
    assert me["groups"] == ["researchers"]
    # the profiles still theirs start
    r = hub.api("POST", "users/alice/servers/small", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", token, "small")
    _stop(hub, "alice", token, "small")
    provider.set_account("s-alice", groups=["researchers", "vision"])


def test_an_email_identity_gets_a_mapped_name_a_home_and_a_server(site):
    hub, provider = site
    browser = _researcher(hub, "bob", "bob-pw")
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert me["name"] == "bob-smith"
    token = _token(browser, hub, "bob-smith")
    r = hub.api("POST", "users/bob-smith/servers/", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("bob-smith", token)
    assert (hub.state / "homes" / "bob-smith").is_dir()
    home = browser.get(f"{hub.url}/hub/home", timeout=10).text
    assert "Bob.Smith@uni.example via " + provider.issuer in home
    _stop(hub, "bob-smith", token, "")

    # A changed e-mail keeps the name; someone else calling themselves bob-smith, and
    # someone calling themselves admin (the local admin's name), get names of their own.
    provider.set_account("s-bob", email="robert.smith@uni.example")
    again = _researcher(hub, "bob", "bob-pw")
    assert again.get(f"{hub.url}/hub/api/user", timeout=10).json()["name"] == "bob-smith"
    other = _researcher(hub, "bob2", "bob2-pw")
    assert other.get(f"{hub.url}/hub/api/user", timeout=10).json()["name"] == "bob-smith-2"
    mallory = _researcher(hub, "mallory", "mallory-pw")
    them = mallory.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert them["name"] == "admin-2" and not them["admin"]

    # a local account cannot be made under an identity's name (its password would sign in
    # as them wherever local login is on)
    r = hub.service("POST", "api/users", hub.admin_token,
                    {"name": "bob-smith", "password": "a-long-password-1"})
    assert r.status_code == 409 and "robert.smith@uni.example" in r.json()["message"], r.text

    audit = hub.service("GET", "api/audit?limit=200", hub.admin_token).json()["entries"]
    bound = {e["target"]: e for e in audit if e["action"] == "identity.bind"}
    assert bound["user:bob-smith"]["after"]["email"] == "Bob.Smith@uni.example"
    assert bound["user:bob-smith"]["after"]["issuer"] == provider.issuer
    assert bound["user:bob-smith-2"]["after"]["subject"] == "s-bob2"
    changed = [e for e in audit if e["action"] == "identity.update"
               and e["target"] == "user:bob-smith"]
    assert changed and changed[0]["after"]["email"] == "robert.smith@uni.example"
    assert changed[0]["before"]["email"] == "Bob.Smith@uni.example"


def test_admin_groups_make_hub_and_gpulease_admins(site):
    hub, provider = site
    browser = _researcher(hub, "carol", "carol-pw")
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert me["admin"] and "hub-admins" in me["groups"]
    token = _token(browser, hub, "carol")
    group = hub.api("GET", "groups/hub-admins", token).json()
    assert "gpulease-admin" in group["roles"] and "carol" in group["users"]
    assert hub.service("GET", "api/audit", token).status_code == 200
    erin = _researcher(hub, "erin", "erin-pw")
    erin_token = _token(erin, hub, "erin")
    assert hub.service("GET", "api/audit", erin_token).status_code == 403
    # the admin's credits page names who each provider's user signed in as
    page = browser.get(f"{hub.urls.service()}admin/credits", timeout=30)
    assert page.status_code == 200, page.text
    assert f"carol@uni.example via {provider.issuer}" in page.text


def test_auditor_groups_read_but_do_not_administer(site):
    hub, _ = site
    frank = _researcher(hub, "frank", "frank-pw")
    me = frank.get(f"{hub.url}/hub/api/user", timeout=10).json()
    assert not me["admin"] and "auditors" in me["groups"]
    token = _token(frank, hub, "frank")
    assert "gpulease-auditor" in hub.api("GET", "groups/auditors", hub.admin_token).json()["roles"]
    assert hub.service("GET", "api/audit", token).status_code == 200
    r = hub.service("POST", "api/credits", token,
                    {"account": "user:frank", "amount": "5", "note": "mine"})
    assert r.status_code == 403, r.text


def test_a_queued_start_loses_a_profile_its_user_lost_meanwhile(site):
    hub, provider = site
    carol = _researcher(hub, "carol", "carol-pw")
    carol_token = _token(carol, hub, "carol")
    r = hub.api("POST", "users/carol/servers/card", carol_token,
                {"user_options": {"profile": "h200-full"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("carol", carol_token, "card")

    dave = _researcher(hub, "dave", "dave-pw")
    dave_token = _token(dave, hub, "dave")
    r = hub.api("POST", "users/dave/servers/card", dave_token,
                {"user_options": {"profile": "h200-full"}})
    assert r.status_code == 202, r.text  # the only full card is carol's: dave waits
    provider.set_account("s-dave", groups=["researchers"])
    _stop(hub, "carol", carol_token, "card")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        server = hub.api("GET", "users/dave", dave_token).json()["servers"].get("card")
        if server is None or not server.get("pending"):
            break
        time.sleep(0.5)
    assert server is None or not server.get("ready"), server
    assert "no longer in any of them" in hub.log()
    inv = hub.service("GET", "api/inventory", hub.admin_token).json()
    holders = [d["holder"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]
               if d["holder"]]
    assert not [h for h in holders if h.get("user") == "dave"], holders


def test_a_token_of_someone_the_provider_no_longer_allows_stops_working(site):
    hub, provider = site
    erin = _researcher(hub, "erin", "erin-pw")
    token = _token(erin, hub, "erin")
    assert hub.api("GET", "user", token).status_code == 200
    provider.set_account("s-erin", groups=["visitors"])
    time.sleep(REFRESH_S + 0.5)
    assert hub.api("GET", "user", token).status_code == 403
    assert erin.get(f"{hub.url}/hub/api/user", timeout=10).status_code == 403
    provider.set_account("s-erin", groups=["researchers"])


def test_refusals_are_pages_that_say_what_happened(site):
    hub, _ = site
    outsider = sign_in(hub.url, "eve", "eve-pw")
    assert outsider.status_code == 403, outsider.text[:500]
    assert "text/html" in outsider.headers["content-type"]

    # an answer from the provider for a sign-in this browser never started
    stranger = requests.get(f"{hub.url}/hub/oauth_callback?code=abc&state=xyz", timeout=10)
    assert stranger.status_code == 400
    assert "Sign-in refused" in stranger.text and "/hub/login" in stranger.text

    # a state that is not this browser's (tampered with on the way back)
    s = requests.Session()
    started = s.get(f"{hub.url}/hub/oauth_login", allow_redirects=False, timeout=10)
    assert started.status_code == 302
    tampered = s.get(f"{hub.url}/hub/oauth_callback?code=abc&state=eyJzdGF0ZV9pZCI6ICJ4In0",
                     timeout=10)
    assert tampered.status_code == 400, tampered.text[:500]
    assert "belongs to another sign-in" in tampered.text


def test_a_restart_keeps_the_session_and_its_refresh(site):
    hub, _ = site
    browser = _researcher(hub, "alice", "alice-pw")
    token = _token(browser, hub, "alice")
    hub.interrupt()
    hub.start()
    time.sleep(REFRESH_S + 0.5)  # the next request refreshes: auth state must decrypt
    me = browser.get(f"{hub.url}/hub/api/user", timeout=10)
    assert me.status_code == 200 and me.json()["name"] == "alice"
    assert hub.api("GET", "user", token).status_code == 200
    assert "auth_state" not in hub.log() or "encryption is not available" not in hub.log()


def test_logout_ends_the_hub_session_and_the_providers(site):
    hub, provider = site
    browser = _researcher(hub, "alice", "alice-pw")
    out = browser.get(f"{hub.url}/hub/logout", allow_redirects=False, timeout=10)
    assert out.status_code == 302
    assert out.headers["location"].startswith(f"{provider.issuer}/session/end")
    assert browser.get(f"{hub.url}/hub/api/user", timeout=10).status_code == 403


def test_signed_in_through_the_provider_a_browser_reaches_jupyterlab(site, browser_context):
    """In Chromium: the provider's own sign-in form, the spawn page, Start, and JupyterLab,
    where a notebook's cell prints the slice the hub assigned."""
    from tests.support.browser import devices_seen_in_lab

    hub, _ = site
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.locator('a[href*="oauth_login"]').first.click()
    page.fill('input[name="login"]', "gwen")
    page.fill('input[name="password"]', "gwen-pw")
    page.get_by_role("button", name="Sign in").click()
    page.locator("tr.gpulease-server, form#spawn_form").first.wait_for()
    hub.grant(hub.admin_token, "user:gwen")
    page.goto(f"{hub.url}/hub/spawn")
    page.locator('input[name="profile"][value="h200-1g"]').check()
    page.locator('form#spawn_form [type="submit"]').click()
    seen = devices_seen_in_lab(page)
    assert seen == hub.assigned_devices(hub.admin_token, "gwen") and seen[0].startswith("MIG-")
    browser_context.http_errors.check()
    hub.api("DELETE", "users/gwen/server", hub.admin_token)
    hub.wait_server_stopped("gwen", hub.admin_token)


def test_a_provider_that_is_down(site):
    """Last: the provider's in-memory sessions and tokens do not survive its restart."""
    hub, provider = site
    browser = _researcher(hub, "alice", "alice-pw")
    midway = requests.Session()
    callback = sign_in_up_to_the_callback(hub.url, "dave", "dave-pw", midway)
    provider.stop()
    try:
        time.sleep(REFRESH_S + 0.5)
        # a refresh that cannot reach the provider keeps the session
        me = browser.get(f"{hub.url}/hub/api/user", timeout=30)
        assert me.status_code == 200, me.text
        # a login whose code cannot be exchanged gets a page naming the provider
        page = midway.get(callback, timeout=60)
        assert page.status_code == 503, page.text[:500]
        assert "could not be reached" in page.text and "127.0.0.1" in page.text
    finally:
        provider.start()
