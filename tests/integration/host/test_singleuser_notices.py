"""gpulease.singleuser: the notices endpoint of a real Jupyter server, and the labextension.

A real `jupyter server` (the same ServerApp `jupyterhub-singleuser` runs, with
the environment's config, so the extension is enabled the way installs enable
it) is started with the environment the hub gives a named server. A tiny HTTP
server on loopback stands in for the gpulease hub service's
`GET /services/gpulease/api/notices` and `PUT .../api/server-activity`, where
the server pushes its kernel and terminal state.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from gpulease.singleuser import LABEXTENSION_NAME
from gpulease.singleuser.notices import for_server, notices_url
from tests.support.processes import stop_process

SERVER_TOKEN = "server-api-token"  # JUPYTERHUB_API_TOKEN: the server's own token
BROWSER_TOKEN = "user-token"  # what authenticates the user's browser/client to the server
PREFIX = "/user/alice/gpu2/"

HUB_NOTICES = {
    "notices": [
        {"server": "gpu2", "kind": "idle_warning", "message": "Idle: suspending in 5 min",
         "deadline": "2030-01-01T00:05:00Z", "created": "2030-01-01T00:00:00Z"},
        {"server": "", "kind": "idle_warning", "message": "the default server's notice",
         "deadline": "2030-01-01T00:05:00Z", "created": "2030-01-01T00:00:00Z"},
        {"server": "other", "kind": "credit_low", "message": "another server's notice",
         "deadline": None, "created": "2030-01-01T00:00:00Z"},
        "not a notice",
    ]
}


class FakeGpuleaseService:
    """Stands in for the gpulease hub service: notices, and the pushes of kernel state."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.pushes: list[tuple[float, str | None, dict]] = []  # (time, Authorization, body)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                service.pushes.append((time.monotonic(), self.headers.get("Authorization"),
                                       body))
                if self.path != "/services/gpulease/api/server-activity":
                    return self._send(404, {"message": "not found"})
                self.send_response(204)
                self.end_headers()

            def do_GET(self):  # noqa: N802
                service.requests.append((self.path, self.headers.get("Authorization")))
                if self.path != "/services/gpulease/api/notices":
                    return self._send(404, {"message": "not found"})
                if self.headers.get("Authorization") != f"token {SERVER_TOKEN}":
                    return self._send(403, {"message": "forbidden"})
                return self._send(200, HUB_NOTICES)

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hub_env(tmp_path: Path, hub_api_url: str) -> dict[str, str]:
    """What the hub puts in a named server's environment, plus an isolated Jupyter home."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "GPULEASE_"))}
    env.update({
        "HOME": str(tmp_path),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTERHUB_API_URL": hub_api_url,
        # as hub_config sets it: the service's own address (this stand-in serves both)
        "GPULEASE_SERVICE_URL": hub_api_url.rsplit("/hub/api", 1)[0] + "/services/gpulease/",
        "JUPYTERHUB_API_TOKEN": SERVER_TOKEN,
        "JUPYTERHUB_BASE_URL": "/",
        "JUPYTERHUB_SERVICE_PREFIX": PREFIX,
        "JUPYTERHUB_USER": "alice",
        "JUPYTERHUB_SERVER_NAME": "gpu2",
    })
    return env


class Server:
    def __init__(self, tmp_path: Path, hub_api_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{PREFIX}"
        self.log = open(tmp_path / "server.log", "w+b")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
             "--ServerApp.port_retries=0", f"--ServerApp.base_url={PREFIX}",
             f"--IdentityProvider.token={BROWSER_TOKEN}",
             f"--ServerApp.root_dir={tmp_path}",
             "--LabApp.extension_manager=readonly",  # no PyPI lookups
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            env=hub_env(tmp_path, hub_api_url), stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if self.get("api/status").status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        output = self.output()
        self.stop()
        pytest.fail(f"jupyter server did not start:\n{output}")

    def get(self, path: str, token: str | None = BROWSER_TOKEN) -> requests.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.get(self.url + path, headers=headers, timeout=20,
                            allow_redirects=False)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-5000:]

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@pytest.fixture(scope="module")
def service() -> Iterator[FakeGpuleaseService]:
    with FakeGpuleaseService() as s:
        yield s


@pytest.fixture(scope="module")
def server(service, tmp_path_factory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("up"), f"http://127.0.0.1:{service.port}/hub/api")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def server_hub_down(tmp_path_factory) -> Iterator[Server]:
    # A hub whose port answers nothing: bound then closed.
    s = Server(tmp_path_factory.mktemp("down"), f"http://127.0.0.1:{free_port()}/hub/api")
    yield s
    s.stop()


def test_notices_of_this_server_only(server, service):
    r = server.get("gpulease/notices")
    assert r.status_code == 200, server.output()
    body = r.json()
    assert body["server"] == "gpu2"
    assert "error" not in body, body
    assert body["notices"] == [HUB_NOTICES["notices"][0]]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", body["now"])
    # Asked with the server's own token, at the service's URL the spawner gave.
    assert ("/services/gpulease/api/notices", f"token {SERVER_TOKEN}") in service.requests


def test_notices_are_cached(server, service):
    server.get("gpulease/notices")
    before = len(service.requests)
    for _ in range(3):
        assert server.get("gpulease/notices").status_code == 200
    assert len(service.requests) == before  # within the ~10 s cache: no new request


def test_polling_notices_is_not_activity(server):
    before = server.get("api/status").json()["last_activity"]
    time.sleep(0.05)
    for _ in range(3):
        assert server.get("gpulease/notices").status_code == 200
    assert server.get("api/status").json()["last_activity"] == before


def test_notices_need_authentication(server):
    assert server.get("gpulease/notices", token=None).status_code in (302, 403)
    assert server.get("gpulease/notices", token="wrong").status_code in (302, 403)


def test_service_down_is_an_empty_list_with_error(server_hub_down):
    r = server_hub_down.get("gpulease/notices")
    assert r.status_code == 200, server_hub_down.output()
    body = r.json()
    assert body["notices"] == []
    assert "cannot reach the gpulease service" in body["error"]


def test_labextension_is_installed_and_enabled():
    out = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"],
                         capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    assert re.search(rf"{LABEXTENSION_NAME} v\S+ enabled\s+OK", text), (
        "the gpulease-notices labextension is not installed in this environment; an editable "
        f"install needs `python -m gpulease.singleuser.install` (make install runs it):\n{text}")


def test_lab_page_loads_the_labextension(server):
    r = server.get("lab")
    assert r.status_code == 200
    match = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                      r.text, re.S)
    assert match, r.text[:2000]
    config = json.loads(match.group(1))
    exts = {e["name"]: e for e in config["federated_extensions"]}
    assert LABEXTENSION_NAME in exts, sorted(exts)
    assert not any(d.startswith(LABEXTENSION_NAME) for d in config.get("disabledExtensions", []))
    bundle = server.get(f"lab/extensions/{LABEXTENSION_NAME}/{exts[LABEXTENSION_NAME]['load']}")
    assert bundle.status_code == 200 and b"gpulease-notices" in bundle.content


# --- pure parts ----------------------------------------------------------------


def test_notices_url_prefers_the_explicit_service_url():
    assert notices_url({"GPULEASE_NOTICES_URL": "http://x/n", "GPULEASE_SERVICE_URL": "http://y/"}) == "http://x/n"
    assert notices_url({"GPULEASE_SERVICE_URL": "http://127.0.0.1:10101/services/gpulease/",
                        "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api"}) == \
        "http://127.0.0.1:10101/services/gpulease/api/notices"


def test_no_service_url_no_guess_at_the_hubs_origin():
    # Under a subdomain host the service is not under the hub's origin: a server the
    # spawner gave no GPULEASE_SERVICE_URL asks nobody rather than a wrong address.
    env = {"JUPYTERHUB_API_URL": "http://hub:8081/lab/hub/api", "JUPYTERHUB_BASE_URL": "/lab/",
           "JUPYTERHUB_PUBLIC_HUB_URL": "https://gpus.example.org/lab/hub/"}
    assert notices_url(env) is None
    assert notices_url({}) is None


def test_for_server_filters_and_rejects_malformed_answers():
    assert [n["message"] for n in for_server(HUB_NOTICES, "")] == ["the default server's notice"]
    assert for_server({"notices": []}, "gpu2") == []
    with pytest.raises(ValueError):
        for_server({"error": "x"}, "gpu2")


def test_an_open_tabs_polling_is_not_activity_but_use_is(server):
    from gpulease.singleuser.activity import counts_as_use

    assert not counts_as_use("GET") and counts_as_use("POST") and counts_as_use("put")
    headers = {"Authorization": f"token {BROWSER_TOKEN}"}
    # something counted as activity first, so that a change is visible below
    requests.post(server.url + "api/contents", json={"type": "notebook"}, headers=headers,
                  timeout=20).raise_for_status()
    before = server.get("api/status").json()["last_activity"]
    time.sleep(1.1)
    for path in ("api/kernels", "api/sessions", "api/terminals", "api/contents",
                 "api/kernelspecs"):
        assert server.get(path).status_code == 200, path  # what an idle JupyterLab tab polls
    assert server.get("api/status").json()["last_activity"] == before
    # saving a file is use
    r = requests.put(server.url + "api/contents/note.txt", headers=headers, timeout=20,
                     json={"type": "file", "format": "text", "content": "x"})
    assert r.status_code in (200, 201), r.text
    assert server.get("api/status").json()["last_activity"] > before


def test_the_server_pushes_its_kernels_with_its_own_token_promptly(server, service):
    """What the culler knows of a server's kernels is what the server pushed: with
    its own token, at start, and within seconds of a kernel starting or ending. The
    body is what the gpulease service accepts (validated by the service's own parser)."""
    from gpulease.hub.service.activity_store import parse_push

    deadline = time.monotonic() + 20
    while not service.pushes:  # the first push goes out when the server starts
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.2)
    headers = {"Authorization": f"token {BROWSER_TOKEN}"}
    t0 = time.monotonic()
    kernel = requests.post(server.url + "api/kernels", json={"name": "python3"},
                           headers=headers, timeout=60)
    kernel.raise_for_status()
    kernel_id = kernel.json()["id"]
    try:
        deadline = time.monotonic() + 15
        while not [b for t, _, b in service.pushes if t > t0
                   and kernel_id in {k["id"] for k in b["kernels"]}]:
            assert time.monotonic() < deadline, f"no push of the new kernel:\n{server.output()}"
            time.sleep(0.2)
    finally:
        requests.delete(server.url + f"api/kernels/{kernel_id}", headers=headers, timeout=20)
    # The first push with the kernel came within seconds of its start, not a heartbeat later.
    first = min(t for t, _, b in service.pushes
                if kernel_id in {k["id"] for k in b["kernels"]})
    assert first - t0 < 10
    assert {auth for _, auth, _ in service.pushes} == {f"token {SERVER_TOKEN}"}
    for _, _, body in service.pushes:
        parse_push(body, "alice", "gpu2", datetime.now(UTC))  # raises on anything refused
    # The server serves no state of its own to anyone: nothing to read there any more.
    assert server.get("gpulease/activity").status_code == 404


def test_push_timing_rule():
    from gpulease.singleuser.activity_push import Sent, push_due

    rule = {"interval": 60.0, "min_gap": 5.0}
    assert push_due(None, (), (), 0.0, **rule)
    last = Sent(100.0, ("idle",), ("t1",))
    assert not push_due(last, ("idle",), ("t1",), 159.0, **rule)
    assert push_due(last, ("idle",), ("t1",), 160.0, **rule)  # heartbeat
    assert push_due(last, ("busy",), ("t1",), 100.5, **rule)  # a state change: at once
    assert not push_due(last, ("idle",), ("t2",), 104.0, **rule)  # activity alone: min_gap
    assert push_due(last, ("idle",), ("t2",), 105.0, **rule)
    failed = Sent(100.0, None, None, failures=1)
    assert not push_due(failed, ("busy",), (), 104.0, **rule)
    assert push_due(failed, ("busy",), (), 105.0, **rule)
    # failing on: 5, 10, 20, 40 s, then the heartbeat's 60 s
    assert [next(t for t in range(200) if push_due(Sent(0.0, None, None, n), (), (), float(t),
                                                   **rule)) for n in (1, 2, 3, 4, 5, 9)] == [
        5, 10, 20, 40, 60, 60]


def test_a_kernel_run_and_shut_down_leaves_its_activity_in_the_next_push(server, service):
    """A kernel started, run and shut down between two of the server's looks is in no
    push's list; the push after it still carries its activity (`last_kernel_activity`,
    the kernel manager's own record), which the culler counts (idle-culler/policy.py)."""
    from gpulease.hub.service.activity_store import parse_push
    from tests.support.hubproc import run_in_kernel

    before = datetime.now(UTC)
    assert run_in_kernel(f"http://127.0.0.1:{server.port}", PREFIX, BROWSER_TOKEN,
                         "print('ran')").strip() == "ran"
    after = time.monotonic()
    deadline = after + 15
    while True:
        gone = [b for t, _, b in service.pushes if t > after and not b["kernels"]]
        if gone:
            break
        assert time.monotonic() < deadline, f"no push after the kernel ended:\n{server.output()}"
        time.sleep(0.2)
    carried = parse_push(gone[-1], "alice", "gpu2", datetime.now(UTC)).kernels_last_activity
    assert carried is not None and carried >= before, (gone[-1], before)
