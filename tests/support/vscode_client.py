"""VS Code's JupyterHub extension, replayed request by request against a running hub.

The extension (microsoft/vscode-jupyter-hub, see shared/reference) detects the
hub, mints a token from a password, lists the user's servers, starts one with
NO body, then drives kernels through @jupyterlab/services: REST calls with an
`Authorization: token` header, and the kernel websocket with the token only in
its query string, no cookie and no `Sec-Fetch-Mode` (Node's websocket client is
not a browser). Used by tests/e2e/test_vscode.py (the embedded box) and
tests/cluster/test_vscode_cluster.py (the cluster shape): the same traffic on
both.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urljoin

import requests

from tests.support.hubproc import HubProcess, execute_over_websocket

VSCODE_NOTE = "Requested by JupyterHub extension in VSCode"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}


def ws_url(server_url: str, kernel_id: str, token: str) -> str:
    """@jupyterlab/services' kernel websocket URL with `appendToken`: the token in the query."""
    return (server_url.replace("http://", "ws://", 1) + f"api/kernels/{kernel_id}/channels"
            f"?session_id={uuid.uuid4()}&token={quote(token)}")


def execute(server_url: str, kernel_id: str, token: str, code: str, timeout: float = 60) -> str:
    """Run `code` on a kernel over its websocket, as VS Code does: no header, no cookie."""
    return execute_over_websocket(ws_url(server_url, kernel_id, token), code, None, timeout)


@dataclass(frozen=True)
class ExtensionRun:
    token: str  # the token the extension minted from the password
    token_id: str
    url: str  # the server's URL through the proxy, ending in /
    kernel: str  # the kernel it started
    output: str  # what `code` printed on that kernel


def extension_sequence(hub: HubProcess, user: str, password: str, server: str,
                       saved: dict | None, code: str, ready_timeout: float = 90) -> ExtensionRun:
    """Steps 1-6 of the extension, asserting what it relies on; `server` ('' the default
    one) must be listed, not running, with user_options `saved` (None: never started);
    `code` runs on a new kernel over the websocket."""
    base = hub.url
    # 1. detect the hub: no auth, no redirect followed
    r = requests.get(f"{base}/hub/api", allow_redirects=False, timeout=10)
    assert r.status_code == 200 and r.json()["version"].startswith(("5.", "6."))
    # 2. mint a token from the password
    r = requests.post(f"{base}/hub/api/users/{user}/tokens", timeout=30, json={
        "auth": {"username": user, "password": password}, "note": VSCODE_NOTE})
    assert r.status_code == 201, r.text
    token, token_id = r.json()["token"], r.json()["id"]
    # 3. the user and its servers, stopped ones included
    r = requests.get(f"{base}/hub/api/users/{user}?include_stopped_servers", headers=auth(token),
                     timeout=10)
    assert r.status_code == 200, r.text
    listed = r.json()["servers"][server]
    assert listed["user_options"] == saved and not listed["ready"], listed
    # 4. start it with NO body
    path = f"servers/{quote(server)}" if server else "server"
    r = requests.post(f"{base}/hub/api/users/{user}/{path}", headers=auth(token), timeout=60)
    assert r.status_code in (201, 202), r.text
    assert not r.request.body
    srv = hub.wait_server_ready(user, token, server, timeout=ready_timeout)
    # the extension's appendUrlPath is `new URL(path, base + "/")`: the server's URL as the
    # hub gives it, absolute under a subdomain host (its own origin), else a path
    url = urljoin(f"{base}/", srv["url"])
    # 5. kernelspecs, a kernel, sessions
    r = requests.get(f"{url}api/kernelspecs", headers=auth(token), timeout=30)
    assert r.status_code == 200 and "python3" in r.json()["kernelspecs"], r.text
    r = requests.post(f"{url}api/kernels", json={"name": "python3"}, headers=auth(token),
                      timeout=60)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    r = requests.get(f"{url}api/sessions", headers=auth(token), timeout=30)
    assert r.status_code == 200, r.text
    # 6. the kernel websocket, token only in the query string
    output = execute(url, kernel, token, code)
    return ExtensionRun(token, token_id, url, kernel, output)


def revoke(hub: HubProcess, user: str, run: ExtensionRun) -> None:
    """7. revoke the token: the hub refuses it from the next request on."""
    r = requests.delete(f"{hub.url}/hub/api/users/{user}/tokens/{run.token_id}",
                        headers=auth(run.token), timeout=10)
    assert r.status_code == 204, r.text
    r = requests.get(f"{hub.url}/hub/api/users/{user}", headers=auth(run.token), timeout=10)
    assert r.status_code == 403, r.text


def wait_kernel_activity(hub: HubProcess, admin: str, user: str, token: str, server: str,
                         url: str, kernel: str) -> None:
    """An execution over the websocket (no browser) moves both signals the culler reads:
    the kernel's activity, as the server pushed it to the gpulease service (GET
    api/server-activity), and the hub's last_activity of the server."""
    time.sleep(2.5)  # let any start-up activity be reported first
    before = datetime.now(UTC)
    assert execute(url, kernel, token, "print(6 * 7)").strip() == "42"

    deadline = time.monotonic() + 15
    while True:  # pushed within seconds (at most min_gap for activity alone)
        r = hub.service("GET", f"api/server-activity?user={user}", admin)
        assert r.status_code == 200, r.text
        pushed = [k for s in r.json()["servers"] if s["server"] == server
                  for k in s["kernels"] if k["id"] == kernel]
        seen = pushed and datetime.fromisoformat(
            pushed[0]["last_activity"].replace("Z", "+00:00"))
        if seen and seen >= before:
            break
        assert time.monotonic() < deadline, f"pushed kernel state {pushed} not after {before}"
        time.sleep(0.5)

    deadline = time.monotonic() + 15
    while True:
        srv = hub.api("GET", f"users/{user}", token).json()["servers"][server]
        hub_seen = datetime.fromisoformat(srv["last_activity"].replace("Z", "+00:00"))
        if hub_seen >= before:
            break
        assert time.monotonic() < deadline, f"hub last_activity stayed {hub_seen} < {before}"
        time.sleep(0.5)
