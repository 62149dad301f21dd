"""End to end: gpulease's idle culler on a real hub, with timeouts of seconds.

(a) an idle server is suspended, billing closed with `idle`, home kept, GPU
freed, and an empty-body start resumes it; (b) a kernel kept busy with no
client attached is not suspended; (c) a process burning CPU with no kernel
activity is not suspended; (d) a busy GPU signal, served by a stand-in
Prometheus through the same DCGM source the cluster uses, keeps a server
alive; (e) the warning reaches a local SMTP server and webhook, and activity
cancels it; (f) max_runtime stops a busy server; (h) a researcher whose
~/.jupyter/jupyter_server_config.py logs every request's headers is suspended
without any credential but her own reaching her server, and her server's own
token cannot set another server's state.

The culler reads kernels and terminals only from what servers pushed to the
gpulease service (gpulease.singleuser, with each server's own token).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urljoin, urlsplit

import pytest
import requests

from tests.support.hubproc import HubOptions, free_port, run_in_kernel
from tests.support.sinks import SmtpSink, WebhookSink

pytestmark = pytest.mark.e2e

IDLE = 8  # seconds
PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "0.1", "min_run": "1s", "idle_timeout": f"{IDLE}s"},
    {"slug": "h200-full", "display_name": "H200", "gpu": {"model": "H200", "count": 1},
     "cpu": 2, "memory": "8Gi", "images": ["pytorch"], "price_per_hour": "1",
     "min_run": "1s", "idle_timeout": f"{IDLE}s"},
    {"slug": "slow", "display_name": "Slow", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "0.1", "min_run": "1s", "idle_timeout": "20s"},
    {"slug": "short", "display_name": "Short", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": "0.1", "min_run": "1s", "idle_timeout": "0", "max_runtime": "15s"},
]}


class FakePrometheus(BaseHTTPRequestHandler):
    """Stands in for Prometheus with dcgm-exporter: the full H200, busy when `busy` is set."""

    busy_uuid = "GPU-declared-local-1"
    busy = False

    def do_GET(self):  # noqa: N802
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "UUID": self.busy_uuid},
             "value": [time.time(), "0.9" if FakePrometheus.busy else "0.0"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), FakePrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def sinks():
    with SmtpSink() as smtp, WebhookSink() as hook:
        yield smtp, hook


@pytest.fixture(scope="module")
def hub_options(prometheus, sinks) -> HubOptions:
    smtp, hook = sinks
    return HubOptions(profiles=PROFILES, args=[
        "--GPULeaseHub.smtp_host=127.0.0.1", f"--GPULeaseHub.smtp_port={smtp.port}",
        f"--GPULeaseHub.notify_webhook_url={hook.url}", "--GPULeaseHub.culler_interval=1",
        "--GPULeaseHub.culler_warn_before=15s",
        f"--GPULeaseHub.culler_gpu_source=prometheus:{prometheus}",
        "--GPULeaseHub.heartbeat_interval=1", "--Spawner.poll_interval=1"])


def user(hub, admin) -> tuple[str, str]:
    name = f"u{uuid.uuid4().hex[:6]}"
    r = hub.service("POST", "api/users", admin, {"name": name, "password": f"{name}-pw-1234"})
    assert r.status_code == 201, r.text
    hub.grant(admin, f"user:{name}")
    return name, hub.token_for(name, f"{name}-pw-1234")


def start(hub, name, token, profile, server=""):
    path = f"users/{name}/servers/{server}" if server else f"users/{name}/server"
    r = hub.api("POST", path, token, {"user_options": {"profile": profile}})
    assert r.status_code in (201, 202), r.text
    return hub.wait_server_ready(name, token, server)


def start_cpu_burner(hub, srv, token) -> int:
    """A background job started from a notebook (its pid); the kernel then sits idle."""
    return int(run_in_kernel(hub.url, srv["url"], token, (
        "import subprocess, sys\n"
        "print(subprocess.Popen([sys.executable, '-c', 'while True: pass']).pid)"),
        keep_kernel=True))


def last_session(hub, token) -> dict:
    return hub.service("GET", "api/usage", token).json()["sessions"][-1]


def is_running(hub, name, token, server="") -> bool:
    srv = hub.api("GET", f"users/{name}", token).json()["servers"].get(server)
    return bool(srv and srv.get("ready"))


def test_a_idle_server_is_suspended_and_resumes(hub, admin):
    name, token = user(hub, admin)
    start(hub, name, token, "h200-full")
    (hub.state / "homes" / name / "keep.txt").write_text("kept")
    hub.wait_server_stopped(name, token, timeout=IDLE + 30)
    session = last_session(hub, token)
    assert session["end_reason"] == "idle"
    assert (hub.state / "homes" / name / "keep.txt").read_text() == "kept"
    inv = hub.service("GET", "api/inventory", admin).json()
    assert not [d for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]
                if d["holder"] and d["holder"]["user"] == name]
    # resume: an empty-body start brings the same profile back
    r = hub.api("POST", f"users/{name}/server", token)
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready(name, token)
    assert last_session(hub, token)["profile"] == "h200-full"
    hub.api("DELETE", f"users/{name}/server", token)
    hub.wait_server_stopped(name, token)


def start_busy_kernel_and_leave(hub, srv, token) -> None:
    """A long cell is run, then the client leaves: no client stays attached."""
    headers = {"Authorization": f"token {token}"}
    api = urljoin(f"{hub.url}/", srv["url"]) + "api"
    kernel = requests.post(f"{api}/kernels", json={"name": "python3"}, headers=headers,
                           timeout=60).json()["id"]
    from websockets.sync.client import connect

    msg = {"header": {"msg_id": uuid.uuid4().hex, "username": "t", "session": uuid.uuid4().hex,
                      "msg_type": "execute_request", "version": "5.3", "date": ""},
           "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
           "content": {"code": "import time; time.sleep(120)", "silent": False,
                       "store_history": False, "user_expressions": {}, "allow_stdin": False}}
    ws_url = api.replace("http://", "ws://") + f"/kernels/{kernel}/channels"
    with connect(ws_url, additional_headers=headers) as ws:
        ws.send(json.dumps(msg))
        time.sleep(1)


@dataclass
class Kept:
    """A server that must still run IDLE + 6 s after `since` (its last sign of use)."""

    name: str
    token: str
    since: float = 0.0
    pid: int = 0  # the CPU burner's, for test_c

    def wait_past_the_idle_timeout(self) -> None:
        time.sleep(max(0.0, self.since + IDLE + 6 - time.monotonic()))


@pytest.fixture(scope="module")
def kept(hub, admin):
    """The servers of the three tests that must not be suspended (b, c, d), set up at
    once: their waits past the idle timeout then pass together, not one after another.
    Each has its own user; each test checks and stops its own."""
    def busy_kernel(k: Kept) -> None:
        srv = start(hub, k.name, k.token, "cpu")
        start_busy_kernel_and_leave(hub, srv, k.token)
        k.since = time.monotonic()

    def cpu_burner(k: Kept) -> None:
        srv = start(hub, k.name, k.token, "cpu")
        # a background job started from the notebook; the kernel then sits idle
        k.pid = start_cpu_burner(hub, srv, k.token)
        k.since = time.monotonic()

    def busy_gpu(k: Kept) -> None:
        start(hub, k.name, k.token, "h200-full")
        k.since = time.monotonic()

    scenarios = {"b": busy_kernel, "c": cpu_burner, "d": busy_gpu}
    servers = {key: Kept(*user(hub, admin)) for key in scenarios}
    FakePrometheus.busy = True  # only the full H200 (test_d's) is reported busy
    try:
        with ThreadPoolExecutor(len(scenarios)) as pool:
            for done in [pool.submit(setup, servers[key]) for key, setup in scenarios.items()]:
                done.result()
        yield servers
    finally:
        FakePrometheus.busy = False


def test_b_busy_kernel_without_client_is_kept(hub, kept):
    k = kept["b"]
    k.wait_past_the_idle_timeout()
    assert is_running(hub, k.name, k.token), hub.log()[-3000:]
    hub.api("DELETE", f"users/{k.name}/server", k.token)
    hub.wait_server_stopped(k.name, k.token)


def test_c_cpu_burning_process_without_kernel_activity_is_kept(hub, kept):
    k = kept["c"]
    k.wait_past_the_idle_timeout()
    assert is_running(hub, k.name, k.token), hub.log()[-3000:]
    hub.api("DELETE", f"users/{k.name}/server", k.token)
    hub.wait_server_stopped(k.name, k.token)
    # stopping the server ends what it started: nothing keeps running unbilled
    assert not _alive(k.pid)


def test_d_busy_gpu_signal_keeps_a_server_alive(hub, kept):
    k = kept["d"]
    k.wait_past_the_idle_timeout()
    assert is_running(hub, k.name, k.token), hub.log()[-3000:]
    FakePrometheus.busy = False
    hub.api("DELETE", f"users/{k.name}/server", k.token)
    hub.wait_server_stopped(k.name, k.token)


def test_f_max_runtime_stops_a_busy_server(hub, admin):
    name, token = user(hub, admin)
    srv = start(hub, name, token, "short")
    pid = start_cpu_burner(hub, srv, token)
    hub.wait_server_stopped(name, token, timeout=60)
    assert last_session(hub, token)["end_reason"] == "max_runtime"
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return False
        except OSError:
            return False
        time.sleep(0.2)
    return True


def test_e_warning_by_mail_and_webhook_and_activity_cancels_it(hub, admin, sinks):
    smtp, hook = sinks
    ewa, ewa_token = user(hub, admin)
    eli, eli_token = user(hub, admin)
    r = hub.service("PUT", "api/me/notifications", ewa_token,
                    {"channel": "email", "address": f"{ewa}@lab.example"})
    assert r.status_code == 200, r.text
    r = hub.service("PUT", "api/me/notifications", eli_token, {"channel": "webhook"})
    assert r.status_code == 200, r.text
    srv = start(hub, ewa, ewa_token, "slow")
    start(hub, eli, eli_token, "slow")
    started = time.monotonic()
    mails = [m for m in smtp.wait(1, timeout=30) if m["To"] == f"{ewa}@lab.example"]
    assert mails and "suspended" in mails[0].get_content(), mails
    assert any(eli in b["text"] and "idle" in b["text"] for b in hook.wait(1, timeout=30))
    notices = hub.service("GET", "api/notices", ewa_token).json()["notices"]
    assert [n["kind"] for n in notices] == ["idle_warning"]
    # the hub's pages show it too
    page = hub.login_form(ewa, f"{ewa}-pw-1234").get(f"{hub.url}/hub/home", timeout=10).text
    assert "gpulease-banner" in page
    # activity: the user runs a cell; the warning is withdrawn and no suspend follows
    run_in_kernel(hub.url, srv["url"], ewa_token, "print(1 + 1)")
    deadline = time.monotonic() + 10
    while hub.service("GET", "api/notices", ewa_token).json()["notices"]:
        assert time.monotonic() < deadline, "the warning was not withdrawn after activity"
        time.sleep(0.5)
    time.sleep(max(0, started + 22 - time.monotonic()))  # past the first deadline
    assert is_running(hub, ewa, ewa_token)
    for name, token in ((ewa, ewa_token), (eli, eli_token)):
        hub.api("DELETE", f"users/{name}/server", token)
        hub.wait_server_stopped(name, token)


def test_g_an_open_but_idle_tab_does_not_keep_a_server(hub, admin):
    """JupyterLab left open polls the server; that is not use, and the server is suspended."""
    name, token = user(hub, admin)
    srv = start(hub, name, token, "cpu")
    headers = {"Authorization": f"token {token}"}
    t0 = time.monotonic()
    deadline = t0 + IDLE + 30
    polls = 0
    while is_running(hub, name, token):
        assert time.monotonic() < deadline, "an open tab's polling kept the server alive"
        for path in ("api/kernels", "api/sessions", "api/terminals", "api/contents"):
            requests.get(urljoin(f"{hub.url}/", srv["url"]) + path, headers=headers, timeout=10)
        polls += 1
        time.sleep(1)
    # it polled all along, every second, until the server was suspended
    assert polls >= 3 and time.monotonic() - t0 >= IDLE - 4
    hub.wait_server_stopped(name, token)
    assert last_session(hub, token)["end_reason"] == "idle"


# A researcher's own Jupyter config, as anyone may put in their home: it records
# every request the server receives, headers included, and the server's token.
HEADER_LOGGER = """
import json, os

with open(os.path.expanduser("~/server-token.txt"), "w") as f:
    f.write(os.environ.get("JUPYTERHUB_API_TOKEN", ""))


def _log_request(handler):
    r = handler.request
    with open(os.path.expanduser("~/seen-requests.jsonl"), "a") as f:
        f.write(json.dumps({"method": r.method, "uri": r.uri, "headers": dict(r.headers)}))
        f.write("\\n")


c.ServerApp.tornado_settings = {"log_function": _log_request}
"""


def _plant_config(home, text: str) -> None:
    """~/.jupyter/jupyter_server_config.py, owned like the home (her Unix account as root)."""
    st = os.stat(home)
    folder = home / ".jupyter"
    folder.mkdir(exist_ok=True)
    (folder / "jupyter_server_config.py").write_text(text)
    for path in (folder, folder / "jupyter_server_config.py"):
        os.chown(path, st.st_uid, st.st_gid)


def _credentials(request: dict) -> set[str]:
    """Every token a request carried: Authorization header, ?token=, token cookies."""
    from urllib.parse import parse_qs, urlsplit

    found = set()
    headers = {k.lower(): v for k, v in request["headers"].items()}
    if headers.get("authorization"):
        found.add(headers["authorization"].split(None, 1)[-1])
    found.update(parse_qs(urlsplit(request["uri"]).query).get("token", []))
    return found


def test_h_nothing_privileged_reaches_a_users_server(hub, admin):
    eve, eve_token = user(hub, admin)
    bob, bob_token = user(hub, admin)
    home = hub.state / "homes" / eve
    _plant_config(home, HEADER_LOGGER)
    srv = start(hub, eve, eve_token, "slow")  # 20 s idle timeout: time for what follows
    # She uses her server once with her own token (so the log shows tokens are seen).
    r = requests.get(urljoin(f"{hub.url}/", srv["url"]) + "api/status",
                     headers={"Authorization": f"token {eve_token}"}, timeout=10)
    assert r.status_code == 200, r.text
    start(hub, bob, bob_token, "slow")
    seen_path, token_path = home / "seen-requests.jsonl", home / "server-token.txt"

    # Her server pushes its state, with its own token, to the gpulease service.
    def pushed(name: str) -> list[dict]:
        r = hub.service("GET", f"api/server-activity?user={name}", admin)
        assert r.status_code == 200, r.text
        return r.json()["servers"]

    deadline = time.monotonic() + 15
    while not (pushed(eve) and pushed(bob)):
        assert time.monotonic() < deadline, hub.log()[-3000:]
        time.sleep(0.3)
    assert [(s["user"], s["server"]) for s in pushed(eve)] == [(eve, "")]
    # Researchers cannot read what servers pushed.
    assert hub.service("GET", "api/server-activity", eve_token).status_code == 403

    # With the token she finds in her server, she cannot set anyone else's state.
    server_token = token_path.read_text()
    forged = {"kernels": [{"id": "forged", "execution_state": "idle", "connections": 0,
                           "last_activity": "2000-01-01T00:00:00Z"}], "terminals": None}
    r = hub.service("PUT", "api/server-activity", server_token,
                    {**forged, "user": bob, "server": ""})
    assert r.status_code == 400 and "names no user or server" in r.text, r.text
    r = hub.service("PUT", "api/server-activity", eve_token, forged)  # her personal token
    assert r.status_code == 403 and "server's own token" in r.text, r.text
    r = hub.service("PUT", "api/server-activity", server_token, forged)
    assert r.status_code == 204, r.text  # accepted: for her own server, whatever it says
    everyone = hub.service("GET", "api/server-activity", admin).json()["servers"]
    assert [(s["user"], s["server"]) for s in everyone
            if any(k["id"] == "forged" for k in s["kernels"])] == [(eve, "")]
    # Servers push to the service directly, not through the proxy (GPULEASE_SERVICE_URL):
    # so do these, whose early refusals would otherwise race the proxy's upload.
    service_url = hub.api("GET", "services/gpulease", admin).json()["url"].rstrip("/")

    def push_direct(body: dict) -> requests.Response:
        return requests.put(f"{service_url}/services/gpulease/api/server-activity", json=body,
                            headers={"Authorization": f"token {server_token}"}, timeout=60)

    huge = {"kernels": [], "terminals": None, "pad": "x" * 300_000}
    r = push_direct(huge)
    assert r.status_code == 413 and "at most 262144 bytes" in r.json()["message"], r.text
    # Pushing as fast as she can is rationed before any body is read (hub/service/push_rate.py),
    # and the culler's read of everyone's state stays quick.
    answers = [push_direct(forged) for _ in range(30)]
    limited = [r for r in answers if r.status_code == 429]
    assert limited and all(r.headers.get("Retry-After", "").isdigit() for r in limited), [
        (r.status_code, r.text[:200]) for r in answers]
    assert "pushes its state too often" in limited[0].json()["message"]
    began = time.monotonic()
    assert pushed(bob) and time.monotonic() - began < 2

    # She leaves it: the culler's passes judge it idle and suspend it.
    hub.wait_server_stopped(eve, eve_token, timeout=60)
    assert last_session(hub, eve_token)["end_reason"] == "idle"
    decision = [line for line in hub.log().splitlines()
                if f"suspend {eve}/(default):" in line]
    assert decision and "pushed " in decision[-1] and "'kernels'" in decision[-1], decision

    seen = [json.loads(line) for line in seen_path.read_text().splitlines()]
    assert seen, "the researcher's logger recorded nothing"
    tokens = set().union(*(_credentials(req) for req in seen))
    assert eve_token in tokens  # the logger does see credentials
    for token in tokens:
        r = requests.get(f"{hub.url}/hub/api/user",
                         headers={"Authorization": f"token {token}"}, timeout=10)
        if r.status_code == 200:
            who = r.json()
            assert (who.get("kind"), who["name"]) == ("user", eve), (
                f"a credential of {who.get('kind')} {who['name']} reached {eve}'s server "
                f"(scopes {who.get('scopes')})")
        else:  # revoked when her server stopped: it must have been that server's own token
            assert token == server_token, f"an unknown credential reached her server: {r.text}"
    # Beyond her own request, only unauthenticated readiness checks of `api` came.
    others = [req for req in seen if not _credentials(req)]
    assert {(req["method"], req["uri"].split("?")[0]) for req in others} <= {
        ("GET", urlsplit(srv["url"]).path + "api")}, others
    hub.api("DELETE", f"users/{bob}/server", bob_token)
    hub.wait_server_stopped(bob, bob_token)
