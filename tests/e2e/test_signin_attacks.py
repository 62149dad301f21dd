"""Attacks on sign-in through OpenID Connect, end to end, from a fresh-context review.

A real hub and the real npm oidc-provider (tests/oidc/provider.mjs), with a second
client registered at the provider (another application). Each test asserts the
safe behaviour: forged, foreign and replayed callbacks are pages, not 500s; `next`
never leaves the hub; hostile preferred names map into the name rule and never
onto someone else's name or an admin's; racing first logins get distinct names;
odd group claims are read as group names or left out; a server gets no provider
token; a provider name in admin_users or allowed_users makes no hub user; with
userdata_from_id_token a refresh reads a fresh ID token (groups re-read).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests
import yaml

from gpulease.core.model.profiles import SAMPLE_PROFILES
from tests.support.hubproc import HubProcess, free_port
from tests.support.oidc_provider import (
    CLIENT_ID,
    CLIENT_SECRET,
    SCRIPT,
    OIDCProvider,
    _form,
    require_provider,
    sign_in,
    sign_in_up_to_the_callback,
    signed_in_session,
    xsrf_headers,
)

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLE_PROFILES
OTHER_CLIENT = "other-app"
OTHER_REDIRECT = "http://127.0.0.1:9/other/callback"


class TwoClientProvider(OIDCProvider):
    """The test provider with a second client (another application at the same provider)."""

    def start(self):
        node = require_provider()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.set_account("nobody-yet", login="", password="")
        (self.folder / "clients.json").write_text(json.dumps([
            {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
             "redirect_uris": self.redirect_uris,
             "post_logout_redirect_uris": self.post_logout_uris},
            {"client_id": OTHER_CLIENT, "client_secret": "other-secret",
             "redirect_uris": [OTHER_REDIRECT]},
        ]))
        self._log = open(self.folder / "provider.log", "ab")
        self.proc = subprocess.Popen(
            [node, str(SCRIPT), str(self.port), str(self.folder / "accounts.json"),
             str(self.folder / "clients.json")],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=SCRIPT.parent.parent.parent)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.issuer}/.well-known/openid-configuration",
                                timeout=2).ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise TimeoutError(self.log())


ACCOUNTS = {
    "s-alice": dict(login="alice", password="pw", preferred_username="alice",
                    email="alice@uni.example", groups=["researchers", "vision"]),
    "s-root": dict(login="root", password="pw", preferred_username="root",
                   groups=["researchers"]),
    "s-ROOT": dict(login="ROOT", password="pw", preferred_username="ROOT",
                   groups=["researchers"]),
    "s-jov": dict(login="jov", password="pw", preferred_username="Jovyan",
                  groups=["researchers"]),
    "s-uni": dict(login="uni", password="pw", preferred_username="Zoë Ünïcødé 東京",
                  groups=["researchers"]),
    "s-long": dict(login="long", password="pw", preferred_username="x" * 200,
                   groups=["researchers"]),
    "s-empty": dict(login="empty", password="pw", groups=["researchers"]),
    "s-symbols": dict(login="symbols", password="pw", preferred_username="!!!___...",
                      groups=["researchers"]),
    "s-digits": dict(login="digits", password="pw", preferred_username="0alice",
                     groups=["researchers"]),
    "s-localguy": dict(login="localguy", password="pw", preferred_username="localguy",
                       groups=["researchers"]),
    "s-gstring": dict(login="gstring", password="pw", preferred_username="gstring",
                      groups="researchers"),
    "s-gnull": dict(login="gnull", password="pw", preferred_username="gnull",
                    groups=["researchers", None]),
    "s-gint": dict(login="gint", password="pw", preferred_username="gint",
                   groups=["researchers", 7]),
    "s-gdict": dict(login="gdict", password="pw", preferred_username="gdict",
                    groups=[{"name": "researchers"}]),
    "s-godd": dict(login="godd", password="pw", preferred_username="godd",
                   groups=["researchers", "", "a" * 400, "x/y", "../..", "<script>"]),
    "s-gcase": dict(login="gcase", password="pw", preferred_username="gcase",
                    groups=["researchers", "Hub-Admins", " hub-admins", "hub-admins ",
                            "hub-admins\n", "hub\u2010admins", "ｈｕｂ-admins"]),
    "s-twin1": dict(login="twin1", password="pw", preferred_username="twin",
                    groups=["researchers"]),
    "s-twin2": dict(login="twin2", password="pw", preferred_username="twin",
                    groups=["researchers"]),
    "s-mail1": dict(login="mail1", password="pw", email="shared@uni.example",
                    groups=["researchers"]),
    "s-mail2": dict(login="mail2", password="pw", email="other@uni.example",
                    groups=["researchers"]),
    "s-boss": dict(login="boss", password="pw", preferred_username="boss",
                   groups=["researchers"]),
    "s-fakeboss": dict(login="fakeboss", password="pw", preferred_username="boss.",
                       groups=["researchers"]),
    "s-fakeboss2": dict(login="fakeboss2", password="pw", preferred_username="0boss",
                        groups=["researchers"]),
}


def _write_config(base: Path, provider, hub_url: str, **extra) -> Path:
    config = base / "gpulease_config.py"
    config.write_text(provider.hub_config(hub_url, **{
        "GPULeaseOIDCAuthenticator.allowed_groups": {"researchers"},
        "GPULeaseOIDCAuthenticator.auth_refresh_age": 2,
        "GPULeaseHub.admin_groups": ["hub-admins"],
        **extra,
    }))
    return config


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("attack-oidc")
    port = free_port()
    hub_url = f"http://localhost:{port}"  # its public URL (the subdomain host)
    provider = TwoClientProvider(base / "provider", [f"{hub_url}/hub/oauth_callback"],
                                 [f"{hub_url}/hub/login"]).start()
    for sub, claims in ACCOUNTS.items():
        provider.set_account(sub, **claims)
    profiles = yaml.safe_load(SAMPLE.read_text())
    for p in profiles["profiles"]:
        if p["slug"] == "h200-full":
            p["groups"] = ["vision"]
    (base / "profiles.yaml").write_text(yaml.safe_dump(profiles))
    config = _write_config(base, provider, hub_url)
    hub = HubProcess(state=base / "state", extra_args=[
        f"--config={config}", f"--GPULeaseHub.profiles_file={base / 'profiles.yaml'}"])
    hub.port, hub.hub_port, hub.api_port = port, free_port(), free_port()
    hub.start()
    hub.admin_token = (hub.state / "private" / "cli_token").read_text().strip()
    hub.base = base
    yield hub, provider
    hub.close()
    provider.stop()


def _name(session: requests.Session, hub) -> str:
    return session.get(f"{hub.url}/hub/api/user", timeout=10).json()["name"]


def _started(hub) -> tuple[requests.Session, str, str]:
    """A browser that started a sign-in: (session, the state, the authorize URL)."""
    s = requests.Session()
    r = s.get(f"{hub.url}/hub/oauth_login", allow_redirects=False, timeout=10)
    assert r.status_code == 302, r.text
    loc = r.headers["location"]
    state = parse_qs(urlsplit(loc).query)["state"][0]
    return s, state, loc


# --- 1. strangers at the login page -------------------------------------------------

def test_callback_with_valid_state_and_a_bogus_code_is_a_page_not_500(site):
    hub, _ = site
    s, state, _ = _started(hub)
    r = s.get(f"{hub.url}/hub/oauth_callback?code=bogus&state={state}", timeout=30)
    print("bogus code:", r.status_code, r.text[:300])
    assert r.status_code in (400, 403), r.status_code


def test_callback_with_provider_error_param(site):
    hub, _ = site
    s, state, _ = _started(hub)
    r = s.get(f"{hub.url}/hub/oauth_callback?error=access_denied&state={state}", timeout=30)
    print("error=access_denied:", r.status_code, r.text[:300])
    assert r.status_code in (400, 403)
    s, state, _ = _started(hub)
    r = s.get(f"{hub.url}/hub/oauth_callback?state={state}", timeout=30)
    print("no code:", r.status_code, r.text[:300])
    assert r.status_code in (400, 403)
    r = requests.get(f"{hub.url}/hub/oauth_callback", timeout=30)
    print("nothing:", r.status_code, r.text[:300])
    assert r.status_code in (400, 403)


def test_a_code_issued_to_another_client_is_refused_with_a_page(site):
    hub, provider = site
    # the other application's sign-in, done by the victim: its code
    other = requests.Session()
    q = urlencode({"client_id": OTHER_CLIENT, "redirect_uri": OTHER_REDIRECT,
                   "response_type": "code", "scope": "openid profile groups",
                   "state": "x" * 16})
    page = other.get(f"{provider.issuer}/auth?{q}", timeout=30)
    action, _ = _form(page.text)
    r = other.post(requests.compat.urljoin(page.url, action),
                   data={"login": "alice", "password": "pw"}, allow_redirects=False, timeout=30)
    while r.is_redirect:
        loc = requests.compat.urljoin(r.url, r.headers["location"])
        if loc.startswith(OTHER_REDIRECT):
            break
        r = other.get(loc, allow_redirects=False, timeout=30)
    code = parse_qs(urlsplit(loc).query)["code"][0]
    s, state, _ = _started(hub)
    r = s.get(f"{hub.url}/hub/oauth_callback?code={code}&state={state}", timeout=30)
    print("other client's code:", r.status_code, r.text[:300])
    assert r.status_code in (400, 403)
    assert s.get(f"{hub.url}/hub/api/user", timeout=10).status_code == 403


def test_a_replayed_callback(site):
    hub, _ = site
    s = requests.Session()
    callback = sign_in_up_to_the_callback(hub.url, "alice", "pw", s)
    state_cookie = s.cookies.get("oauthenticator-state")
    assert state_cookie
    first = s.get(callback, timeout=30)
    assert first.status_code == 200
    # same browser again: the state cookie is gone
    again = s.get(callback, timeout=30, allow_redirects=False)
    print("replay same browser:", again.status_code, again.text[:200])
    assert again.status_code in (302, 400)
    # an attacker who captured both the URL and the state cookie
    thief = requests.Session()
    thief.cookies.set("oauthenticator-state", state_cookie, domain="localhost.local", path="/hub/")  # host-only
    stolen = thief.get(callback, timeout=30)
    print("replay with the cookie:", stolen.status_code, stolen.text[:300])
    assert stolen.status_code in (400, 403)
    assert thief.get(f"{hub.url}/hub/api/user", timeout=10).status_code == 403


NEXTS = ["//evil.example/x", "https://evil.example/", "/\\evil.example/", "\\\\evil.example",
         "http:evil.example", "/%2F%2Fevil.example", "%2F%2Fevil.example", "///evil.example",
         "/\t/evil.example", "https:/evil.example", "javascript:alert(1)"]


@pytest.mark.parametrize("nxt", NEXTS)
def test_next_never_leaves_the_hub(site, nxt):
    hub, _ = site
    s = requests.Session()
    page = s.get(f"{hub.url}/hub/oauth_login?{urlencode({'next': nxt})}", timeout=30)
    if "/interaction/" not in page.url:
        # already signed in? no: fresh session. A refusal is fine too.
        assert page.status_code < 500
        return
    action, _ = _form(page.text)
    r = s.post(requests.compat.urljoin(page.url, action),
               data={"login": "alice", "password": "pw"}, allow_redirects=False, timeout=30)
    hops = []
    while r.is_redirect and len(hops) < 20:
        loc = requests.compat.urljoin(r.url, r.headers["location"])
        hops.append(r.headers["location"])
        host = urlsplit(loc).netloc
        if host not in (f"localhost:{hub.port}", urlsplit(site[1].issuer).netloc):
            pytest.fail(f"next={nxt!r} sent the browser to {loc!r} (hops {hops})")
        if urlsplit(loc).scheme not in ("http", "https"):
            pytest.fail(f"next={nxt!r}: {loc!r}")
        r = s.get(loc, allow_redirects=False, timeout=30)
    print(nxt, "->", hops[-2:], r.status_code)
    assert r.status_code < 500


# also the /hub/login page's next for a signed-in user
@pytest.mark.parametrize("nxt", NEXTS)
def test_login_page_next_for_a_signed_in_user(site, nxt):
    hub, _ = site
    s = signed_in_session(hub.url, "alice", "pw")
    for path in ("/hub/login", "/hub/oauth_login"):
        r = s.get(f"{hub.url}{path}?{urlencode({'next': nxt})}", allow_redirects=False,
                  timeout=30)
        if r.is_redirect:
            loc = requests.compat.urljoin(r.url, r.headers["location"])
            assert urlsplit(loc).netloc in (f"localhost:{hub.port}",
                                            urlsplit(site[1].issuer).netloc), (path, loc)


# --- names -------------------------------------------------------------------------

def test_names_from_hostile_preferred_usernames(site):
    hub, _ = site
    # a local account made before anyone signs in with its name
    r = hub.service("POST", "api/users", hub.admin_token,
                    {"name": "localguy", "password": "a-long-password-1"})
    assert r.status_code == 201, r.text
    got = {}
    for login in ("root", "ROOT", "jov", "uni", "long", "empty", "symbols", "digits",
                  "localguy"):
        s = requests.Session()
        final = sign_in(hub.url, login, "pw", s)
        got[login] = (final.status_code, _name(s, hub) if final.status_code == 200 else None)
    print(json.dumps(got, indent=1))
    pat = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
    for login, (status, name) in got.items():
        assert status == 200, (login, status)
        assert pat.fullmatch(name), (login, name)
    assert got["root"][1] not in ("root",) and got["ROOT"][1] != "root"
    assert got["jov"][1] != "jovyan"
    assert got["localguy"][1] != "localguy"
    assert len({n for _, n in got.values()}) == len(got)


def test_two_identities_racing_for_one_name(site):
    hub, _ = site
    sessions, callbacks = [], []
    for login in ("twin1", "twin2"):
        s = requests.Session()
        callbacks.append(sign_in_up_to_the_callback(hub.url, login, "pw", s))
        sessions.append(s)
    results = [None, None]

    def go(i):
        results[i] = sessions[i].get(callbacks[i], timeout=60).status_code

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [_name(s, hub) for s in sessions]
    print("race:", results, names)
    assert results == [200, 200]
    assert sorted(names) == ["twin", "twin-2"]


def test_an_email_changed_to_another_users_email(site):
    hub, provider = site
    a = signed_in_session(hub.url, "mail1", "pw")
    b = signed_in_session(hub.url, "mail2", "pw")
    na, nb = _name(a, hub), _name(b, hub)
    provider.set_account("s-mail2", email="shared@uni.example")
    b2 = signed_in_session(hub.url, "mail2", "pw")
    print("mail:", na, nb, _name(b2, hub))
    assert _name(b2, hub) == nb != na


# --- groups ------------------------------------------------------------------------

@pytest.mark.parametrize("login", ["gstring", "gnull", "gint", "gdict", "godd"])
def test_odd_group_claims_never_500(site, login):
    hub, _ = site
    s = requests.Session()
    final = sign_in(hub.url, login, "pw", s)
    me = s.get(f"{hub.url}/hub/api/user", timeout=10)
    print(login, final.status_code, me.status_code,
          me.json().get("groups") if me.status_code == 200 else final.text[:300])
    assert final.status_code != 500 and final.status_code < 500


def test_string_groups_claim(site):
    """A provider that sends a single group as a string (not a list)."""
    hub, _ = site
    s = requests.Session()
    final = sign_in(hub.url, "gstring", "pw", s)
    me = s.get(f"{hub.url}/hub/api/user", timeout=10)
    print("gstring:", final.status_code, me.json() if me.status_code == 200 else None)
    if me.status_code == 200:
        assert set(me.json()["groups"]) <= {"researchers"}, me.json()["groups"]


def test_admin_group_lookalikes_do_not_make_an_admin(site):
    hub, _ = site
    s = signed_in_session(hub.url, "gcase", "pw")
    me = s.get(f"{hub.url}/hub/api/user", timeout=10).json()
    print("gcase:", me)
    assert not me["admin"]
    token = s.post(f"{hub.url}/hub/api/users/{me['name']}/tokens", headers=xsrf_headers(s),
                   json={"expires_in": 600}, timeout=30).json()["token"]
    assert hub.service("GET", "api/audit", token).status_code == 403


# --- 2. a researcher's own server and tokens ---------------------------------------

def test_tokens_expire_and_carry_scopes(site):
    hub, _ = site
    s = signed_in_session(hub.url, "alice", "pw")
    h = xsrf_headers(s)
    url = f"{hub.url}/hub/api/users/alice/tokens"
    out = {}
    for body in ({}, {"expires_in": None}, {"expires_in": 0}, {"expires_in": -5},
                 {"expires_in": 10 ** 12}, {"expires_in": 1.5}, {"expires_in": "100"},
                 {"expires_in": True}, {"expires_in": 90 * 86400 + 1},
                 {"scopes": ["admin:users"]}, {"scopes": ["admin:auth_state!user"]},
                 {"roles": ["gpulease-admin"]}, {"scopes": ["read:users:name!user=root"]}):
        r = s.post(url, headers=h, json=body, timeout=30)
        out[json.dumps(body)] = (r.status_code, r.json().get("expires_at"),
                                 r.json().get("scopes"), r.json().get("message"))
    print(json.dumps(out, indent=1))
    for body, (status, expires_at, scopes, _) in out.items():
        if status == 201:
            assert expires_at, body
            assert "admin:users" not in (scopes or []), body
    # the token page
    page = s.get(f"{hub.url}/hub/token", timeout=30)
    options = re.findall(r"<option[^>]*>[^<]*</option>", page.text)
    assert not [o for o in options if "Never" in o or 'value="0"' in o], options


def test_a_server_gets_no_provider_tokens(site):
    hub, _ = site
    s = signed_in_session(hub.url, "alice", "pw")
    hub.grant(hub.admin_token, "user:alice")
    token = s.post(f"{hub.url}/hub/api/users/alice/tokens", headers=xsrf_headers(s),
                   json={"expires_in": 3600}, timeout=30).json()["token"]
    # the user's own token: no auth_state
    mine = hub.api("GET", "users/alice", token).json()
    assert "auth_state" not in mine or not mine["auth_state"], mine
    admin_view = hub.api("GET", "users/alice", hub.admin_token).json()
    state = admin_view.get("auth_state") or {}
    print("auth_state keys:", sorted(state), "token_response keys:",
          sorted(state.get("token_response") or {}))
    secrets = [v for k, v in [("access_token", state.get("access_token")),
                              ("refresh_token", state.get("refresh_token")),
                              ("id_token", state.get("id_token"))] if v]
    secrets.append(CLIENT_SECRET)
    key = (hub.state / "private").glob("*crypt*")
    for p in key:
        secrets.append(p.read_text().strip())
    print("private/:", sorted(p.name for p in (hub.state / "private").iterdir()))
    r = hub.api("POST", "users/alice/servers/", token, {"user_options": {"profile": "cpu"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", token)
    try:
        # find the server process: its environment and command line
        out = subprocess.run(["pgrep", "-f", "singleuser"], capture_output=True, text=True)
        found = []
        server_token = None
        for pid in out.stdout.split():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "JUPYTERHUB_USER=alice" not in env:
                continue
            for item in env.split("\0"):
                if item.startswith("JUPYTERHUB_API_TOKEN="):
                    server_token = item.split("=", 1)[1]
            for secret in secrets:
                if secret and (secret in env or secret in cmd):
                    found.append(secret[:12])
            names = sorted(i.split("=", 1)[0] for i in env.split("\0") if "=" in i)
            print("server env names:", names)
        assert not found, found
        assert server_token
        # what the server's own token may do
        for method, path, body in [("GET", "users/alice", None),
                                   ("POST", "users/alice/tokens", {"expires_in": 60}),
                                   ("GET", "users/alice/tokens", None),
                                   ("POST", "users/alice/servers/x", None),
                                   ("GET", "users", None)]:
            r = hub.api(method, path, server_token, body)
            print("server token", method, path, r.status_code, r.text[:150])
            assert r.status_code in (403, 404) or (method == "GET" and path == "users/alice"
                                                   and "auth_state" not in r.json()), path
    finally:
        hub.api("DELETE", "users/alice/servers/", token)
        hub.wait_server_stopped("alice", token)


def test_restricted_profile_is_lost_through_put_patch_and_named_servers(site):
    hub, provider = site
    s = signed_in_session(hub.url, "alice", "pw")
    hub.grant(hub.admin_token, "user:alice")
    token = s.post(f"{hub.url}/hub/api/users/alice/tokens", headers=xsrf_headers(s),
                   json={"expires_in": 3600}, timeout=30).json()["token"]
    # saved options while still in vision
    r = hub.api("PUT", "users/alice/servers/keep", token, {"profile": "h200-full"})
    print("PUT while allowed:", r.status_code, r.text[:200])
    provider.set_account("s-alice", groups=["researchers"])
    try:
        time.sleep(2.5)
        tries = {}
        tries["start saved"] = hub.api("POST", "users/alice/servers/keep", token)
        tries["PUT then start"] = (hub.api("PUT", "users/alice/servers/k2", token,
                                           {"profile": "h200-full"}),
                                   hub.api("POST", "users/alice/servers/k2", token))
        tries["PATCH then start"] = (hub.api("PATCH", "users/alice/servers/keep", token,
                                             {"profile": "h200-full"}),
                                     hub.api("POST", "users/alice/servers/keep", token))
        tries["svc api/servers"] = hub.service("POST", "api/servers", token,
                                               {"name": "k3", "profile": "h200-full"})
        tries["spawn form"] = s.post(f"{hub.url}/hub/spawn/alice/k4",
                                     data={"profile": "h200-full", "_xsrf":
                                           s.cookies.get("_xsrf", "")}, timeout=60,
                                     allow_redirects=False)
        for what, r in tries.items():
            rs = r if isinstance(r, tuple) else (r,)
            print(what, [(x.status_code, x.text[:160]) for x in rs])
        started = hub.api("GET", "users/alice", token).json()["servers"]
        print("servers:", {k: (v.get("ready"), v.get("pending"),
                               (v.get("user_options") or {}).get("profile"))
                           for k, v in started.items()})
        assert not [k for k, v in started.items()
                    if (v.get("user_options") or {}).get("profile") == "h200-full"
                    and (v.get("ready") or v.get("pending"))]
    finally:
        for name in list(hub.api("GET", "users/alice", hub.admin_token).json()["servers"]):
            hub.api("DELETE", f"users/alice/servers/{name}", hub.admin_token)
        provider.set_account("s-alice", groups=["researchers", "vision"])


# --- last: restarts ----------------------------------------------------------------

def test_admin_users_by_provider_name_and_a_lookalike_hub_name(site):
    """docs/auth.md: admin_users lists people as the provider names them. Someone whose
    preferred name maps to the admin's provider name got that hub name first."""
    hub, provider = site
    fake = signed_in_session(hub.url, "fakeboss", "pw")
    fake_name = _name(fake, hub)
    print("fakeboss ('boss.') got", fake_name)
    _write_config(hub.base, provider, hub.url,
                           **{"GPULeaseOIDCAuthenticator.admin_users": {"boss"},
                              "GPULeaseOIDCAuthenticator.allowed_users": {"zed"}})
    hub.interrupt()
    hub.start()
    fake = signed_in_session(hub.url, "fakeboss", "pw")
    fake_me = fake.get(f"{hub.url}/hub/api/user", timeout=10).json()
    real = signed_in_session(hub.url, "boss", "pw")
    real_me = real.get(f"{hub.url}/hub/api/user", timeout=10).json()
    users = {u["name"]: u["admin"] for u in hub.api("GET", "users", hub.admin_token).json()}
    print("fake:", fake_me["name"], fake_me["admin"], "real:", real_me["name"],
          real_me["admin"], "hub users:", users)
    assert not fake_me["admin"], "a look-alike of the admin's provider name is a hub admin"
    assert real_me["admin"]
    assert "zed" not in users, "allowed_users made a hub user named by a provider name"


# --- provider tokens that expire (no refresh token without offline_access) ----------

@pytest.fixture(scope="module")
def short_lived(tmp_path_factory):
    base = tmp_path_factory.mktemp("attack-ttl")
    port = free_port()
    hub_url = f"http://localhost:{port}"  # its public URL (the subdomain host)
    os.environ["OIDC_ACCESS_TOKEN_TTL"] = "8"
    try:
        provider = OIDCProvider(base / "provider", [f"{hub_url}/hub/oauth_callback"],
                                [f"{hub_url}/hub/login"]).start()
    finally:
        del os.environ["OIDC_ACCESS_TOKEN_TTL"]
    provider.set_account("s-alice", **ACCOUNTS["s-alice"])
    config = _write_config(base, provider, hub_url)
    hub = HubProcess(state=base / "state", extra_args=[f"--config={config}"])
    hub.port, hub.hub_port, hub.api_port = port, free_port(), free_port()
    hub.start()
    yield hub, provider
    hub.close()
    provider.stop()


def test_an_api_token_after_the_providers_access_token_expired(short_lived):
    """The person is still allowed at the provider; only its access token expired."""
    hub, _ = short_lived
    s = signed_in_session(hub.url, "alice", "pw")
    token = s.post(f"{hub.url}/hub/api/users/alice/tokens", headers=xsrf_headers(s),
                   json={"expires_in": 3600}, timeout=30).json()["token"]
    assert hub.api("GET", "user", token).status_code == 200
    admin = (hub.state / "private" / "cli_token").read_text().strip()
    st = hub.api("GET", "users/alice", admin).json()["auth_state"]
    print("token_response:", {k: (v if k in ("expires_in", "scope") else "...")
                              for k, v in st["token_response"].items()})
    time.sleep(11)
    direct = requests.get(f"{_.issuer}/me", headers={"Authorization": "Bearer "
                          + st["access_token"]}, timeout=10)
    print("userinfo with the stored access token now:", direct.status_code, direct.text[:200])
    api = hub.api("GET", "user", token)
    page = s.get(f"{hub.url}/hub/api/user", timeout=10)
    print("after access-token expiry: API token", api.status_code, "cookie", page.status_code)
    print("\n".join(line for line in hub.log().splitlines() if "efresh" in line
                    or "userinfo" in line or "/me" in line)[-3000:])
    assert api.status_code == 200


# --- docs/auth.md's Entra recipe: userdata_from_id_token = True ---------------------

@pytest.fixture(scope="module")
def id_token_site(tmp_path_factory):
    base = tmp_path_factory.mktemp("attack-idtoken")
    port = free_port()
    hub_url = f"http://localhost:{port}"  # its public URL (the subdomain host)
    os.environ["OIDC_ID_TOKEN_TTL"] = "8"
    try:
        provider = OIDCProvider(base / "provider", [f"{hub_url}/hub/oauth_callback"],
                                   [f"{hub_url}/hub/login"]).start()
    finally:
        del os.environ["OIDC_ID_TOKEN_TTL"]
    provider.set_account("s-alice", **ACCOUNTS["s-alice"])
    config = _write_config(base, provider, hub_url,
                           **{"GPULeaseOIDCAuthenticator.userdata_from_id_token": True,
                              # oidc-provider issues offline_access only after consent asked
                              "GPULeaseOIDCAuthenticator.extra_authorize_params":
                                  {"prompt": "consent"}})
    hub = HubProcess(state=base / "state", extra_args=[f"--config={config}"])
    hub.port, hub.hub_port, hub.api_port = port, free_port(), free_port()
    hub.start()
    yield hub, provider
    hub.close()
    provider.stop()


def test_id_token_userdata_groups_refresh_and_expiry(id_token_site):
    hub, provider = id_token_site
    s = signed_in_session(hub.url, "alice", "pw")
    me = s.get(f"{hub.url}/hub/api/user", timeout=10).json()
    print("signed in:", me["name"], me["groups"])
    token = s.post(f"{hub.url}/hub/api/users/alice/tokens", headers=xsrf_headers(s),
                   json={"expires_in": 3600}, timeout=30).json()["token"]
    provider.set_account("s-alice", groups=["researchers"])  # removed from vision
    time.sleep(3)  # > auth_refresh_age (2)
    r = hub.api("GET", "user", token)
    print("3 s after removal from vision:", r.status_code, r.json().get("groups"))
    time.sleep(7)  # the stored ID token expired (8 s)
    results = {}
    results["api token"] = hub.api("GET", "user", token)
    results["cookie api"] = s.get(f"{hub.url}/hub/api/user", timeout=10)
    results["home page"] = s.get(f"{hub.url}/hub/home", timeout=10)
    results["login page"] = s.get(f"{hub.url}/hub/login", timeout=10)
    results["logout"] = s.get(f"{hub.url}/hub/logout", timeout=10, allow_redirects=False)
    for k, v in results.items():
        print(k, v.status_code, v.text[:200].replace("\n", " "))
    assert "eyJ" not in results["api token"].text, "the ID token is in the answer"
    assert r.json().get("groups") == ["researchers"], "groups were not re-read"
    assert all(v.status_code < 500 for v in results.values())


def test_races_for_one_name_repeated(site):
    hub, provider = site
    bad = []
    for i in range(6):
        logins = [f"race{i}a", f"race{i}b", f"race{i}c"]
        for login in logins:
            provider.set_account(f"s-{login}", login=login, password="pw",
                                 preferred_username=f"race{i}", groups=["researchers"])
        sessions, callbacks = [], []
        for login in logins:
            s = requests.Session()
            callbacks.append(sign_in_up_to_the_callback(hub.url, login, "pw", s))
            sessions.append(s)
        results = [None] * len(logins)

        def go(k, sessions=sessions, callbacks=callbacks, results=results):
            r = sessions[k].get(callbacks[k], timeout=60)
            results[k] = (r.status_code, r.text[:200] if r.status_code != 200 else "")

        threads = [threading.Thread(target=go, args=(k,)) for k in range(len(logins))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        names = [s.get(f"{hub.url}/hub/api/user", timeout=10).json().get("name")
                 for s in sessions]
        print("race", i, results, names)
        if any(r[0] != 200 for r in results) or len(set(names)) != len(names):
            bad.append((i, results, names))
    assert not bad, bad


def test_concurrent_first_logins_with_different_names(site):
    hub, provider = site
    bad = []
    for i in range(4):
        logins = [f"cc{i}x{k}" for k in range(4)]
        for login in logins:
            provider.set_account(f"s-{login}", login=login, password="pw",
                                 preferred_username=login, groups=["researchers"])
        sessions, callbacks = [], []
        for login in logins:
            s = requests.Session()
            callbacks.append(sign_in_up_to_the_callback(hub.url, login, "pw", s))
            sessions.append(s)
        results = [None] * len(logins)

        def go(k, sessions=sessions, callbacks=callbacks, results=results):
            results[k] = sessions[k].get(callbacks[k], timeout=60).status_code

        threads = [threading.Thread(target=go, args=(k,)) for k in range(len(logins))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("concurrent", i, results)
        if any(r != 200 for r in results):
            bad.append((i, results))
    assert not bad, bad
