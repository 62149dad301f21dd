"""End to end: VS Code's JupyterHub extension, replayed request by request, on a real hub.

The extension (microsoft/vscode-jupyter-hub, see shared/reference) detects the
hub, mints a token from a password, lists the user's servers, starts one with
NO body, then drives kernels through @jupyterlab/services: REST calls with an
`Authorization: token` header, and the kernel websocket with the token only in
its query string, no cookie and no `Sec-Fetch-Mode` (Node's websocket client is
not a browser). Since JupyterHub 5 that websocket was refused with 403
(vscode-jupyter-hub#75); gpulease.singleuser.ws_token accepts it.

One hub for the module on the demo inventory (seven H200 1g.18gb slices and a
full H200), with real JupyterLab servers. Its profiles are the samples, except
that `cpu` is only for group `lab`: `gus`, outside it, may use GPU profiles
only. No queue (`queue_max_wait=0`): a start without capacity is refused at once.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urljoin

import pytest
import requests
import yaml
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gpulease.core.model.profiles import SAMPLE_PROFILES
from gpulease.singleuser.ws_token import accepts_url_token, is_websocket_handshake
from tests.support.hubproc import HubOptions
from tests.support.vscode_client import (
    auth,
    execute,
    extension_sequence,
    revoke,
    wait_kernel_activity,
    ws_url,
)

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {"vera": "vera-pw-12345", "bo": "bo-pw-123456", "gus": "gus-pw-123456"}
# Activity reaches the hub every 2 s instead of every minute: the hub's record of
# the user's activity can be watched advancing within the test.
USER_CONFIG = """
c.LocalGPUSpawner.environment.update({"JUPYTERHUB_ACTIVITY_INTERVAL": "2"})
"""
HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade",
             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"}


# --- the rule itself (pure) ---------------------------------------------------------------------

def test_only_a_genuine_handshake_from_a_non_browser_client_may_carry_the_token():
    assert is_websocket_handshake("GET", HANDSHAKE)
    assert is_websocket_handshake("GET", {**HANDSHAKE, "Connection": "keep-alive, Upgrade"})
    assert accepts_url_token("GET", HANDSHAKE, websocket_handler=True)
    for broken in ({"Upgrade": "h2c"}, {"Connection": "keep-alive"},
                   {"Sec-WebSocket-Version": "8"}, {"Sec-WebSocket-Key": "short"},
                   {"Sec-WebSocket-Key": "not base64 at all!!"}):
        assert not accepts_url_token("GET", {**HANDSHAKE, **broken}, websocket_handler=True)
    assert not accepts_url_token("POST", HANDSHAKE, websocket_handler=True)
    # an ordinary page or API handler: never, handshake headers or not
    assert not accepts_url_token("GET", HANDSHAKE, websocket_handler=False)
    # a browser (it sends Fetch Metadata): JupyterHub's own rule decides alone
    assert not accepts_url_token("GET", {**HANDSHAKE, "Sec-Fetch-Mode": "navigate"}, True)


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    profiles = yaml.safe_load((SAMPLE_PROFILES).read_text())
    for p in profiles["profiles"]:
        if p["slug"] == "cpu":
            p["groups"] = ["lab"]
    return HubOptions(profiles=profiles, config=USER_CONFIG,
                      args=["--GPULeaseHub.queue_max_wait=0"])


@pytest.fixture(scope="module")
def hub(hub):
    """The module's hub (tests/e2e/conftest.py) with vera, bo and gus (their own
    passwords), vera and bo in `lab` with credit."""
    token = hub.admin_token
    for name, pw in PASSWORDS.items():
        r = hub.service("POST", "api/users", token, {"name": name, "password": pw})
        assert r.status_code == 201, r.text
    assert hub.api("POST", "groups/lab", token).status_code == 201
    r = hub.api("POST", "groups/lab/users", token, {"users": ["vera", "bo"]})
    assert r.status_code == 200, r.text
    hub.grant(token, "user:vera")
    hub.grant(token, "user:bo")
    return hub


@pytest.fixture(scope="module")
def tokens(hub, admin):
    """Tokens for the checks around the VS Code sequence (which mints its own)."""
    return {name: hub.token_for(name, pw) for name, pw in PASSWORDS.items()}


@pytest.fixture(scope="module")
def bo_server(hub, admin, tokens):
    """bo runs the full H200 (so nobody else can) with a kernel on it."""
    r = hub.api("POST", "users/bo/server", tokens["bo"], {"user_options": {"profile": "h200-full"}})
    assert r.status_code in (201, 202), r.text
    srv = hub.wait_server_ready("bo", tokens["bo"])
    base = urljoin(f"{hub.url}/", srv["url"])  # its own origin
    r = requests.post(f"{base}api/kernels", json={"name": "python3"},
                      headers={"Authorization": f"token {tokens['bo']}"}, timeout=60)
    assert r.status_code == 201, r.text
    return {"url": base, "kernel": r.json()["id"]}


# --- what VS Code does (tests/support/vscode_client.py) ---------------------------------------------------

def ws_refusal(server_url: str, kernel_id: str, token: str, **kwargs) -> int:
    """The HTTP status a websocket handshake is refused with (0 when accepted)."""
    try:
        with connect(ws_url(server_url, kernel_id, token), open_timeout=30, **kwargs):
            return 0
    except InvalidStatus as e:
        return e.response.status_code


def holders(hub, admin) -> dict[str, tuple[str, str | None]]:
    """'user/server' -> (device uuid, MIG profile or None for a whole card)."""
    inv = hub.service("GET", "api/inventory", admin).json()
    return {f"{d['holder']['user']}/{d['holder']['server']}": (d["uuid"], d["profile"])
            for n in inv["nodes"] for g in n["gpus"] for d in g["devices"] if d["holder"]}


def saved_options(hub, admin, user: str, server: str) -> dict:
    model = hub.api("GET", f"users/{user}?include_stopped_servers=1", admin).json()
    return model["servers"][server]["user_options"]


def test_vscode_extension_sequence(hub, admin, tokens):
    # Beforehand, on the hub side: a named server that remembers a MIG slice profile.
    r = hub.service("POST", "api/servers", tokens["vera"],
                    {"name": "vscode", "user_options": {"profile": "h200-1g"}})
    assert r.status_code == 201, r.text

    # 1-6: detect, mint a token from the password, list, start with NO body, kernels,
    # and the kernel websocket with the token only in the query string
    run = extension_sequence(hub, "vera", PASSWORDS["vera"], "vscode", {"profile": "h200-1g"},
                             "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    token, cuda = run.token, run.output.strip()

    # The right slice was placed, and is being billed at that profile.
    device, mig = holders(hub, admin)["vera/vscode"]
    assert mig == "1g.18gb" and cuda == device and cuda.startswith("MIG-")
    sessions = hub.service("GET", "api/usage", token).json()["sessions"]
    running = [s for s in sessions if s["server"] == "vscode" and s["ended"] is None]
    assert [(s["profile"], s["account"]) for s in running] == [("h200-1g", "user:vera")]
    assert saved_options(hub, admin, "vera", "vscode") == {"profile": "h200-1g"}

    # 7. revoke the token: the hub refuses it from the next request on
    revoke(hub, "vera", run)


@pytest.fixture(scope="module")
def vera_server(hub, tokens):
    """vera's `vscode` server running (the sequence above started it) and a kernel on it."""
    token = tokens["vera"]
    model = hub.api("GET", "users/vera", token).json()
    if "vscode" not in model["servers"]:
        hub.service("POST", "api/servers", token,
                    {"name": "vscode", "user_options": {"profile": "h200-1g"}})
        hub.api("POST", "users/vera/servers/vscode", token)
    srv = hub.wait_server_ready("vera", token, "vscode")
    url = urljoin(f"{hub.url}/", srv["url"])  # its own origin
    r = requests.post(f"{url}api/kernels", json={"name": "python3"}, headers=auth(token),
                      timeout=60)
    assert r.status_code == 201, r.text
    return {"url": url, "kernel": r.json()["id"]}


# The scopes docs/vscode.md tells to give a token made on the hub's Token page for VS Code.
VSCODE_SCOPES = ["read:users:name!user", "read:servers!user", "servers!user",
                 "access:servers!user"]


def test_a_pasted_token_with_the_documented_scopes_is_enough(hub, tokens, vera_server,
                                                            bo_server):
    r = hub.api("POST", "users/vera/tokens", tokens["vera"],
                {"note": "VS Code", "scopes": VSCODE_SCOPES})
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    r = requests.get(f"{hub.url}/hub/api/users/vera?include_stopped_servers",
                     headers=auth(token), timeout=10)
    assert r.status_code == 200 and r.json()["servers"]["vscode"]["ready"], r.text
    r = requests.post(f"{hub.url}/hub/api/users/vera/servers/vscode", headers=auth(token),
                      timeout=30)
    assert r.status_code == 400 and "already running" in r.text  # allowed to start, just running
    r = requests.get(f"{vera_server['url']}api/kernelspecs", headers=auth(token), timeout=30)
    assert r.status_code == 200, r.text
    url, kernel = vera_server["url"], vera_server["kernel"]
    assert execute(url, kernel, token, "print('pasted')").strip() == "pasted"
    # ...and reaches nothing of anyone else's
    assert ws_refusal(bo_server["url"], bo_server["kernel"], token) == 403


def test_token_in_url_stays_refused_on_pages_and_wrong_tokens_on_websockets(hub, tokens,
                                                                            vera_server):
    url, kernel, token = vera_server["url"], vera_server["kernel"], tokens["vera"]
    # ordinary pages and APIs: ?token= without a header is no authentication
    r = requests.get(f"{url}api/contents?token={token}", timeout=30, allow_redirects=False)
    assert r.status_code == 403, r.text
    r = requests.get(f"{url}lab?token={token}", timeout=30, allow_redirects=False)
    assert r.status_code == 302 and "/hub/api/oauth2/authorize" in r.headers["Location"]
    # only the login's state cookie: the URL token was not persisted as a session
    assert [c.name for c in r.cookies] == ["jupyterhub-user-vera-vscode-oauth-state"]
    # ...even with websocket handshake headers: api/contents is not a websocket
    r = requests.get(f"{url}api/contents?token={token}", headers=HANDSHAKE, timeout=30,
                     allow_redirects=False)
    assert r.status_code == 403, r.text
    # the same token in a header is fine
    assert requests.get(f"{url}api/contents", headers=auth(token), timeout=30).status_code == 200
    # websockets: a wrong token, or none, is refused
    assert ws_refusal(url, kernel, "not-a-token") == 403
    assert ws_refusal(url, kernel, "") == 403
    # a browser's websocket (Sec-Fetch-Mode: websocket) is JupyterHub's own rule, unchanged
    assert ws_refusal(url, kernel, token,
                      additional_headers={"Sec-Fetch-Mode": "websocket"}) == 0


def test_a_users_token_reaches_only_its_users_servers(hub, tokens, vera_server, bo_server):
    vera = tokens["vera"]
    # the hub API: starting, stopping or reading bo's servers. JupyterHub answers 404,
    # not 403, for a user the token may not see (it does not tell who exists).
    for method, path in [("POST", "users/bo/servers/other"), ("POST", "users/bo/server"),
                         ("DELETE", "users/bo/server"), ("GET", "users/bo"),
                         ("POST", "users/bo/tokens")]:
        r = hub.api(method, path, vera)
        assert r.status_code in (403, 404), (method, path, r.status_code, r.text)
    assert hub.api("GET", "users/bo", tokens["bo"]).json()["servers"][""]["ready"]
    # bo's server itself, through the proxy: REST and the kernel websocket
    r = requests.get(f"{bo_server['url']}api/kernels", headers=auth(vera), timeout=30)
    assert r.status_code == 403, r.text
    assert ws_refusal(bo_server["url"], bo_server["kernel"], vera) == 403
    # ...which bo's own token opens
    assert ws_refusal(bo_server["url"], bo_server["kernel"], tokens["bo"]) == 0


def test_empty_body_first_start_gets_the_cheapest_cpu_profile_and_says_so(hub, admin, tokens):
    token = tokens["vera"]
    assert hub.service("GET", "api/me/default-profile", token).json()["profile"] is None
    messages = hub.start_with_progress("vera", token, "first")
    assert any("Starting CPU only" in m and "0.100000 credits/h" in m
               and "cheapest CPU-only profile (cpu)" in m for m in messages), messages
    hub.wait_server_ready("vera", token, "first")
    assert "vera/first" not in holders(hub, admin)
    sessions = hub.service("GET", "api/usage", token).json()["sessions"]
    assert [s["profile"] for s in sessions if s["server"] == "first"] == ["cpu"]
    # what it got is saved: the next empty-body start brings the same profile back
    assert saved_options(hub, admin, "vera", "first") == {
        "profile": "cpu", "image": "pytorch", "account": "user:vera", "tier": "on-demand"}
    hub.api("DELETE", "users/vera/servers/first", token)
    hub.wait_server_stopped("vera", token, "first")


def test_empty_body_first_start_of_a_gpu_only_user_is_400_listing_profiles(hub, admin, tokens):
    gus = tokens["gus"]
    hub.grant(admin, "user:gus")
    for path in ("users/gus/server", "users/gus/servers/fresh"):
        r = hub.api("POST", path, gus)
        assert r.status_code == 400, r.text
        message = r.json()["message"]
        assert "h200-1g (GPU), h200-full (GPU)" in message and "choose one of" in message
        assert "cpu" not in message.replace("CPU-only", "")
    assert holders(hub, admin) == {k: v for k, v in holders(hub, admin).items()
                                   if not k.startswith("gus/")}
    model = hub.api("GET", "users/gus?include_stopped_servers=1", admin).json()
    assert all(not s.get("user_options") for s in model["servers"].values()), model


def test_refused_starts_keep_a_named_servers_saved_profile(hub, admin, tokens, bo_server):
    # a fresh user with no credit yet
    r = hub.service("POST", "api/users", admin, {"name": "ivy", "password": "ivy-pw-123456"})
    assert r.status_code == 201, r.text
    ivy = hub.token_for("ivy", "ivy-pw-123456")
    r = hub.service("POST", "api/servers", ivy,
                    {"name": "big", "user_options": {"profile": "h200-full"}})
    assert r.status_code == 201, r.text
    saved = {"profile": "h200-full"}

    # 402: not enough credit, with an empty body and with another profile in the body
    r = hub.api("POST", "users/ivy/servers/big", ivy)
    assert r.status_code == 402, r.text
    assert saved_options(hub, admin, "ivy", "big") == saved
    r = hub.api("POST", "users/ivy/servers/big", ivy, {"user_options": {"profile": "h200-1g"}})
    assert r.status_code == 402, r.text
    assert saved_options(hub, admin, "ivy", "big") == saved

    # 503: bo holds the only full H200 and there is no queue
    hub.grant(admin, "user:ivy")
    assert holders(hub, admin)["bo/"][1] is None
    r = hub.api("POST", "users/ivy/servers/big", ivy)
    assert r.status_code == 503 and "1g.18gb" in r.json()["message"], r.text
    assert saved_options(hub, admin, "ivy", "big") == saved
    r = hub.api("POST", "users/ivy/servers/big", ivy,
                {"user_options": {"profile": "h200-full", "image": "cuda"}})
    assert r.status_code == 503, r.text
    assert saved_options(hub, admin, "ivy", "big") == saved
    assert not [k for k in holders(hub, admin) if k.startswith("ivy/")]


def test_vscode_kernel_activity_counts_for_the_culler(hub, admin, tokens, vera_server):
    """Executions over the websocket (no browser) move both signals the culler reads:
    the kernels' activity, as the server pushed it to the gpulease service (GET
    api/server-activity), and the hub's last_activity."""
    wait_kernel_activity(hub, admin, "vera", tokens["vera"], "vscode", vera_server["url"],
                         vera_server["kernel"])
