"""Click to kernel: from the REST start until a kernel on the server returned `1+1`.

What a researcher waits for between pressing Start and the result of their first cell,
through the proxy as a browser or VS Code goes, with the moments between (`Phases`):

  posted     the start's POST answered (201: the hub found the server up; 202: pending)
  answered   the first 200 of `/user/U/api/status` through the proxy (spawn-to-ready)
  kernel     `POST /user/U/api/kernels` answered 201 (the kernel process is up)
  channels   the kernel's websocket open through the proxy
  result     the `execute_result` of `1+1` ("2") on that websocket

Each is seconds from the POST being sent (time.perf_counter), polled every `poll_s`.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests

from gpulease.site_urls import is_loopback_name

PHASES = ("posted", "answered", "kernel", "channels", "result")


@dataclass
class Phases:
    at: dict[str, float] = field(default_factory=dict)  # phase -> seconds after the POST

    def step(self, before: str | None, phase: str) -> float:
        """Seconds from `before` (None: the POST) to `phase`."""
        return self.at[phase] - (self.at[before] if before else 0.0)


def click_to_kernel(session: requests.Session, url: str, user: str, token: str,
                    start_body: dict, poll_s: float, timeout_s: float,
                    server_url: str = "") -> Phases:
    """Start user's default server, then run `1+1` on a new kernel (module doc).
    `server_url`: where the server is (its own origin under a subdomain host); "": the
    hub's `{url}/user/{user}/`. `session` must reach it (gpulease.site_urls)."""
    from websockets.sync.client import connect

    headers = {"Authorization": f"token {token}"}
    phases = Phases()
    t0 = time.perf_counter()
    r = session.post(f"{url}/hub/api/users/{user}/server", json=start_body, headers=headers,
                     timeout=timeout_s)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"start answered {r.status_code} {r.text}")
    phases.at["posted"] = time.perf_counter() - t0
    base = server_url or f"{url}/user/{user}/"
    deadline = t0 + timeout_s
    while True:
        try:
            ready = session.get(f"{base}api/status", headers=headers, allow_redirects=False,
                                timeout=10)
            if ready.status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.perf_counter() > deadline:
            raise TimeoutError(f"server not ready after {timeout_s}s")
        time.sleep(poll_s)
    phases.at["answered"] = time.perf_counter() - t0
    r = session.post(f"{base}api/kernels", json={"name": "python3"}, headers=headers,
                     timeout=timeout_s)
    if r.status_code != 201:
        raise RuntimeError(f"kernel start answered {r.status_code} {r.text}")
    phases.at["kernel"] = time.perf_counter() - t0
    ws_url = (base.replace("http://", "ws://", 1)
              + f"api/kernels/{r.json()['id']}/channels?session_id={uuid.uuid4().hex}")
    msg_id = uuid.uuid4().hex
    request = {
        "header": {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex,
                   "msg_type": "execute_request", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": "1+1", "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }
    with connect(ws_url, additional_headers=headers, open_timeout=timeout_s,
                 sock=loopback_socket(ws_url, timeout_s)) as ws:
        phases.at["channels"] = time.perf_counter() - t0
        ws.send(json.dumps(request))
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError("no execute_result for 1+1")
            reply = json.loads(ws.recv(timeout=left))
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = reply["header"]["msg_type"]
            if kind == "error":
                raise RuntimeError("\n".join(reply["content"]["traceback"]))
            if kind == "execute_result":
                text = reply["content"]["data"].get("text/plain")
                if text != "2":
                    raise RuntimeError(f"1+1 gave {text!r}")
                phases.at["result"] = time.perf_counter() - t0
                return phases


def loopback_socket(url: str, timeout_s: float) -> socket.socket | None:
    """A connection to 127.0.0.1 for a `*.localhost` URL (the resolver may not know the
    name; the URL's Host header keeps it for the proxy); None: connect as usual."""
    parts = urlsplit(url)
    if not is_loopback_name(parts.hostname):
        return None
    return socket.create_connection(("127.0.0.1", parts.port or 80), timeout=timeout_s)
