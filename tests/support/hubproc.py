"""Run a real `gpulease up` (JupyterHub + configurable-http-proxy) for end-to-end tests.

The hub runs as a child process on free loopback ports with a state folder of
the test's own; tests drive it over HTTP and websockets as a browser, the CLI
or VS Code would.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests
import yaml

from gpulease.site_urls import SiteURLs, loopback_session
from tests.support.isolation_env import (
    hub_python,
    mock_server_catalog,
    relocate_state,
    seed_hub_id,
)

ROOT = Path(__file__).resolve().parents[2]
CHP = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


_HANDED_OUT: set[int] = set()  # by free_port, in this process

# Every hub log this process wrote: a failed test's report shows the tracebacks
# its hubs logged (tests/conftest.py), so a bare 500 in CI can be traced. Servers
# write logs of their own (<state>/logs/servers/): their folders are looked in too.
HUB_LOGS: list[Path] = []
SERVER_LOG_FOLDERS: list[Path] = []


def _logs() -> list[Path]:
    servers = [p for folder in SERVER_LOG_FOLDERS for p in sorted(folder.glob("*/*.log"))]
    return [*HUB_LOGS, *servers]


def hub_tracebacks(since: float, limit: int = 3, lines_each: int = 60) -> str:
    """The last `limit` tracebacks, or 5xx answers with the lines before them, in hub logs
    written since `since` (epoch seconds)."""
    found: list[str] = []
    for path in _logs():
        try:
            if path.stat().st_mtime < since:
                continue
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            if line.lstrip().startswith("Traceback (most recent call last)"):
                start = max(0, i - 2)
                found.append(f"--- {path.name}\n" + "\n".join(lines[start:i + lines_each]))
            elif SERVER_ERROR_LINE.search(line):
                # a 5xx without a traceback (an HTTPError raised on purpose, such as
                # HubAuth's "Failed to check authorization"): the lines that led to it
                found.append(f"--- {path.name}\n" + "\n".join(lines[max(0, i - 12):i + 1]))
    return "\n".join(found[-limit:])


# A server's or the hub's log line of a 5xx answer ("] 500 GET /user/cy/api/kernels")
SERVER_ERROR_LINE = re.compile(r"\] 5\d\d (GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) /")


def free_port() -> int:
    """A free loopback port, below the kernel's ephemeral range where there is room.

    A port is free here until its user binds it: the hub's proxy port stays
    unbound while the hub starts, and JupyterHub picks its services' ports
    with port 0, from the ephemeral range; once the gpulease service got the
    proxy's port (Address already in use, the hub never ready). Ports below
    that range are never handed out for port 0. Nor is a port handed out
    twice in one test run: a hub's three ports are chosen before any is
    bound, and two of them once came out the same (the proxy's API on the
    hub's port: Address already in use).
    """
    low = _ephemeral_low()
    for _ in range(50 if low > 20_000 else 0):
        port = random.randrange(15_000, low)
        if port in _HANDED_OUT:
            continue
        _HANDED_OUT.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _SourceAddressAdapter(requests.adapters.HTTPAdapter):
    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def session_from(source: str) -> requests.Session:
    """A requests session whose connections leave from `source`.

    On Linux all of 127.0.0.0/8 is this machine, so tests can be clients at
    127.0.0.2, 127.0.0.3, ... and the hub sees distinct addresses.
    """
    s = requests.Session()
    adapter = _SourceAddressAdapter(source)
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s


def require_chp() -> None:
    if not CHP.exists():
        import pytest

        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHP} missing: `make test` installs it with npm")
        pytest.skip("configurable-http-proxy not installed (run `npm install` or `make test`)")


def require_localhost_names() -> None:
    """The tests' own HTTP clients (requests) reach users' servers and the service at
    `*.localhost` names through the system's resolver (gpulease's clients need not)."""
    try:
        socket.getaddrinfo("gpulease--service.localhost", 80, type=socket.SOCK_STREAM)
    except OSError:
        import pytest

        pytest.fail("*.localhost does not resolve here (`hosts: files dns`): the end-to-end "
                    "tests need glibc's myhostname module: `apt install libnss-myhostname` "
                    "(.ci/run does), which adds it to /etc/nsswitch.conf")


ADMIN_PW = "admin-secret-pw"  # the hub admin's password in every test hub


def password_of(name: str) -> str:
    """A test user's password (add_user's rule, and tests/e2e/conftest.py's)."""
    return f"{name}-pw-12345"


@dataclass(frozen=True)
class HubOptions:
    """What a module's hub starts with; files are written into the hub's folder."""

    profiles: dict | None = None  # --profiles (a profiles.yaml's content)
    inventory: dict | None = None  # --inventory
    mock_catalog: bool = False  # --catalog: mock_server_catalog's (servers in milliseconds)
    config: str | None = None  # --config (a gpulease_config.py's text)
    args: Sequence[str] = ()  # more command-line options
    users: Sequence[str] = ()  # local accounts made, with password_of(name)
    groups: Mapping[str, Sequence[str]] = field(default_factory=dict)  # group: members

    def arguments(self, base: Path) -> list[str]:
        out = []
        for name, content in (("profiles", self.profiles), ("inventory", self.inventory)):
            if content is not None:
                (base / f"{name}.yaml").write_text(yaml.safe_dump(content))
                out.append(f"--{name}={base / f'{name}.yaml'}")
        if self.mock_catalog:
            out.append(f"--catalog={mock_server_catalog(base)}")
        if self.config is not None:
            (base / "gpulease_config.py").write_text(self.config)
            out.append(f"--config={base / 'gpulease_config.py'}")
        return out + list(self.args)


@dataclass
class HubProcess:
    state: Path
    extra_args: list[str] = field(default_factory=list)
    admin_password: str = ADMIN_PW
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    port: int = 0
    log_path: Path | None = None
    scheme: str = "http"
    admin_token: str = ""  # the admin's API token, where a fixture minted one

    @property
    def url(self) -> str:
        """The hub's address; API calls with a token work on any host name it listens on,
        a browser's pages are sent to its public URL (hub/web/canonical_host.py)."""
        return f"{self.scheme}://localhost:{self.port}"

    @property
    def urls(self) -> SiteURLs:
        """The hub's, the service's and servers' public URLs, as the hub says them
        (GET /hub/gpulease/site): servers and the service on subdomains by default."""
        return self._urls

    def server_url(self, user: str, server: str = "", path: str = "") -> str:
        return self.urls.server(user, server, path)

    def start(self, timeout: float = 60) -> HubProcess:
        require_chp()
        require_localhost_names()
        if not self.port:
            self.port = free_port()
            self.hub_port = free_port()
            self.api_port = free_port()
        if getattr(self, "_log", None):
            self._log.close()
        # logs stay beside the test's own folder, also when the state moves (below)
        self._log_dir = getattr(self, "_log_dir", None) or self.state.parent
        self.log_path = self._log_dir / f"hub-{uuid.uuid4().hex[:6]}.log"
        HUB_LOGS.append(self.log_path)
        # As root, servers run as per-user accounts: the hub's Python and the
        # state folder must be reachable by them (tests/support/isolation_env.py).
        python, no_accounts = hub_python()
        if os.geteuid() == 0 and not no_accounts:
            self.state = relocate_state(self.state)
        SERVER_LOG_FOLDERS.append(self.state / "logs" / "servers")
        seed_hub_id(self.state)
        args = [
            python, "-m", "gpulease.hub.cli", "up",
            f"--state={self.state}",
            f"--port={self.port}",
            f"--JupyterHub.hub_port={self.hub_port}",
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{self.api_port}",
            *(["--GPULeaseHub.per_user_accounts=False"] if no_accounts and os.geteuid() == 0
              else []),
            # "{port}": the hub's port, known here (e.g. --subdomain-host=http://x.test:{port})
            *(arg.replace("{port}", str(self.port)) for arg in self.extra_args),
        ]
        env = {**os.environ, "GPULEASE_ADMIN_PASSWORD": self.admin_password, **self.env}
        env["PATH"] = f"{CHP.parent}:{env.get('PATH', '')}"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.state.parent
        )
        try:
            self.wait_ready(timeout)
        except BaseException:  # a hub that never came up is not left running
            self.close()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.log()}")
            try:
                # readiness only: a test of TLS checks the certificate itself
                r = requests.get(f"{self.url}/hub/api", timeout=2, verify=False)
                site = requests.get(f"{self.url}/hub/gpulease/site", timeout=2, verify=False)
                if r.status_code != 200 or site.status_code != 200:
                    raise requests.RequestException(f"hub: {r.status_code} {site.status_code}")
                self._urls = SiteURLs(site.json()["hub"].removesuffix("hub/"),
                                      site.json()["subdomain_host"])
                svc = loopback_session().get(self.urls.service("api/profiles"), timeout=2,
                                             verify=False)
                if svc.status_code in (401, 403):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"hub not ready after {timeout}s:\n{self.log()}")

    @property
    def hub_host(self) -> str:
        """Where the hub API listens, as its log says: the sandboxes' bridge address
        when servers run in their sandboxes (the hub as root), else loopback."""
        found = re.search(r"Hub API listening on https?://\[?([^\]/]+?)\]?:\d+/", self.log())
        return found.group(1) if found else "127.0.0.1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def server_log(self, user: str, server: str = "") -> str:
        """What `user`'s server wrote in its last start: its own log (docs/admin.md,
        "Servers' logs"); the hub's log holds none of it."""
        path = self.state / "logs" / "servers" / user / f"{server or '_default'}.log"
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C: what a user does to stop `gpulease up`."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the hub dies without cleaning anything up."""
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.interrupt(30)
            except subprocess.TimeoutExpired:
                self.kill()
        if getattr(self, "_log", None):
            self._log.close()

    # --- HTTP helpers ------------------------------------------------------------

    def login_form(self, username: str, password: str, source: str | None = None,
                   headers: dict[str, str] | None = None) -> requests.Session:
        """Log in through JupyterHub's real login form, as a browser does.

        `source`: the loopback address the client connects from (see
        session_from); `headers`: sent with both requests (JupyterHub's
        anonymous xsrf token depends on the address they make it see).
        """
        s = session_from(source) if source else requests.Session()
        page = s.get(f"{self.url}/hub/login", timeout=10, headers=headers)
        page.raise_for_status()
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        data = {"username": username, "password": password}
        if xsrf:
            data["_xsrf"] = xsrf.group(1)
        r = s.post(f"{self.url}/hub/login", data=data, allow_redirects=False, timeout=30,
                   headers=headers)
        s.login_status = r.status_code  # 302 on success, 403 on a refused login
        return s

    def secrets(self) -> dict[str, str]:
        """What no server may ever hold, by name: the hub's secret files, the admin's
        password."""
        private = self.state / "private"
        return {
            "cookie secret": (private / "jupyterhub_cookie_secret").read_text().strip(),
            "proxy token": (private / "proxy_token").read_text().strip(),
            "CLI token": (private / "cli_token").read_text().strip(),
            "admin password": self.admin_password,
        }

    def signed_in(self, username: str, password: str) -> requests.Session:
        """A browser signed in through the hub's login form (its redirect followed)."""
        session = self.login_form(username, password)
        assert session.login_status == 302, (username, session.login_status)
        return session

    def token_for(self, username: str, password: str) -> str:
        """Mint a token with the password, through the token endpoint's `auth` body."""
        r = requests.post(
            f"{self.url}/hub/api/users/{username}/tokens",
            json={"auth": {"username": username, "password": password}, "note": "e2e"},
            timeout=30,
        )
        if r.status_code != 201:
            raise RuntimeError(f"token for {username}: {r.status_code} {r.text}")
        return r.json()["token"]

    def api(self, method: str, path: str, token: str, body: Any = None) -> requests.Response:
        return requests.request(
            method, f"{self.url}/hub/api/{path.lstrip('/')}", json=body,
            headers={"Authorization": f"token {token}"}, timeout=60,
        )

    def service(self, method: str, path: str, token: str, body: Any = None) -> requests.Response:
        return loopback_session().request(
            method, self.urls.service(path.lstrip("/")), json=body,
            headers={"Authorization": f"token {token}"}, timeout=60, verify=False,
        )

    def grant(self, admin_token: str, account: str, amount: str = "100") -> None:
        """Give an account credit (spawns need enough for their profile's minimum run)."""
        r = self.service("POST", "api/credits", admin_token,
                         {"account": account, "amount": amount, "note": "test credit"})
        if r.status_code != 201:
            raise RuntimeError(f"grant to {account}: {r.status_code} {r.text}")

    def add_user(self, admin_token: str, name: str, credit: str | None = "100") -> str:
        """A researcher with a local account (and `credit` granted); returns their token."""
        password = password_of(name)
        r = self.service("POST", "api/users", admin_token, {"name": name, "password": password})
        if r.status_code != 201:
            raise RuntimeError(f"user {name}: {r.status_code} {r.text}")
        if credit is not None:
            self.grant(admin_token, f"user:{name}", credit)
        return self.token_for(name, password)

    def join_group(self, admin_token: str, group: str, users: list[str]) -> None:
        """Put `users` in hub group `group`, made first if it is not there yet."""
        self.api("POST", f"groups/{group}", admin_token)  # 409 when it exists: fine
        r = self.api("POST", f"groups/{group}/users", admin_token, {"users": users})
        if r.status_code != 200:
            raise RuntimeError(f"group {group}: {r.status_code} {r.text}")

    def cli(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpulease.hub.cli", *args],
            input=stdin, capture_output=True, text=True, timeout=60,
            env={**os.environ, "GPULEASE_STATE": str(self.state)},
        )

    def wait_server_ready(self, user: str, token: str, server: str = "", timeout: float = 90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.api("GET", f"users/{user}", token).json()
            srv = model.get("servers", {}).get(server)
            if srv and srv.get("ready"):
                return srv
            if srv is None and time.monotonic() > deadline - timeout + 5:
                raise RuntimeError(f"server {user}/{server} vanished:\n{self.log()[-4000:]}")
            time.sleep(0.3)
        raise TimeoutError(f"server {user}/{server} not ready:\n{self.log()[-4000:]}")

    def start_servers(self, user: str, token: str, options: dict[str, dict],
                      timeout: float = 90) -> dict[str, dict]:
        """Start several servers of `user` at once; each one's model once it is ready.

        `options` maps server names ('' the default server) to their user_options.
        Each start request waits while its server starts, so one after another
        they add up; here they overlap. A model's `ready_at` is the monotonic
        time its server was first seen ready (as wait_server_ready would return),
        `asked_at` when its start was asked for (it is billed from its launch,
        between the two).
        """
        def post(server: str):
            path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
            return self.api("POST", path, token, {"user_options": options[server]})

        ready: dict[str, dict] = {}
        with ThreadPoolExecutor(len(options)) as pool:
            asked_at = time.monotonic()
            answers = {server: pool.submit(post, server) for server in options}
            deadline = time.monotonic() + timeout
            while len(ready) < len(options):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"servers of {user} not ready: "
                                       f"{sorted(set(options) - set(ready))}:\n{self.log()[-4000:]}")
                servers = self.api("GET", f"users/{user}", token).json().get("servers", {})
                for server in options:
                    srv = servers.get(server)
                    if server not in ready and srv and srv.get("ready"):
                        ready[server] = {**srv, "ready_at": time.monotonic(),
                                         "asked_at": asked_at}
                for server, answer in answers.items():
                    if answer.done() and answer.result().status_code not in (201, 202):
                        r = answer.result()
                        raise RuntimeError(f"start of {user}/{server}: {r.status_code} {r.text}")
                if len(ready) < len(options):
                    time.sleep(0.3)
        return ready

    def start_with_progress(self, user: str, token: str, server: str = "",
                            body: Any = None, timeout: float = 60) -> list[str]:
        """Start a server and return the messages of its start's progress stream.

        A warm start is ready within half a second: a stream opened after the POST may
        find it ready already (one "Server ready" event). So streams are opened from
        before the POST, again and again, and the first that saw the start pending is
        the one returned ([] if none did within `timeout`)."""
        path = (f"users/{user}/servers/{server}" if server else f"users/{user}/server")
        found: list[str] = []
        posted = threading.Event()

        def watch() -> None:
            deadline = time.monotonic() + timeout
            while not found and time.monotonic() < deadline:
                with requests.get(f"{self.url}/hub/api/{path}/progress", stream=True,
                                  timeout=timeout,
                                  headers={"Authorization": f"token {token}"}) as stream:
                    seen, pending = [], False
                    for line in stream.iter_lines(decode_unicode=True):
                        if line and line.startswith("data:"):
                            event = json.loads(line[5:])
                            seen.append(event.get("message", ""))
                            if event.get("ready") or event.get("failed"):
                                break
                            pending = True
                    if pending:
                        found.extend(seen)
                    elif posted.is_set() and seen and stream.status_code == 200:
                        return  # ready before any stream saw it pending
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(0.1)
        self.api("POST", path, token, body)
        posted.set()
        watcher.join()
        return found

    def assigned_devices(self, admin_token: str, user: str, server: str = "") -> list[str]:
        """The device UUIDs the hub's inventory says `user`'s `server` holds (admin API)."""
        r = self.service("GET", "api/inventory", admin_token)
        r.raise_for_status()
        return sorted(
            device["uuid"]
            for node in r.json()["nodes"] for gpu in node.get("gpus", [])
            for device in gpu.get("devices", [])
            if (device.get("holder") or {}).get("user") == user
            and device["holder"].get("server") == server)

    def wait_server_stopped(self, user: str, token: str, server: str = "", timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.api("GET", f"users/{user}", token).json()
            if server not in model.get("servers", {}):
                return
            time.sleep(0.3)
        raise TimeoutError(f"server {user}/{server} did not stop")


def start_together(*hubs: HubProcess) -> tuple[HubProcess, ...]:
    """Start several hubs at once: one start is mostly a single process importing and
    waiting for its services, so two starts overlap on two cores. If one fails,
    all are closed and the first failure is raised."""
    with ThreadPoolExecutor(len(hubs)) as pool:
        starts = [pool.submit(hub.start) for hub in hubs]
    failed = [s.exception() for s in starts if s.exception() is not None]
    if failed:
        close_together(*hubs)
        raise failed[0]
    return hubs


def close_together(*hubs: HubProcess) -> None:
    """Close several hubs at once (each waits for its servers and services to stop)."""
    with ThreadPoolExecutor(len(hubs)) as pool:
        list(pool.map(HubProcess.close, hubs))


def run_in_kernel(base_url: str, server_path: str, token: str, code: str, timeout: float = 60,
                  keep_kernel: bool = False):
    """Start a kernel on a server through the proxy and run `code` over the websocket.

    Returns the text the code printed. The kernel is shut down afterwards
    unless `keep_kernel` (then it stays, idle, with what the code started).
    """
    headers = {"Authorization": f"token {token}"}
    # `server_path`: the server's URL as the hub gives it, absolute under a subdomain host
    api = urljoin(f"{base_url}/", server_path) + "api"
    r = requests.post(f"{api}/kernels", json={"name": "python3"}, headers=headers, timeout=60)
    r.raise_for_status()
    kernel_id = r.json()["id"]
    ws_url = api.replace("http://", "ws://") + f"/kernels/{kernel_id}/channels"
    try:
        return execute_over_websocket(ws_url, code, headers, timeout)
    finally:
        if not keep_kernel:
            requests.delete(f"{api}/kernels/{kernel_id}", headers=headers, timeout=30)


def execute_over_websocket(ws_url: str, code: str, headers: dict[str, str] | None = None,
                           timeout: float = 60) -> str:
    """Send one execute_request on a kernel's websocket; the text it printed once idle."""
    from websockets.sync.client import connect

    msg_id = uuid.uuid4().hex
    message = {
        "header": {"msg_id": msg_id, "username": "e2e", "session": uuid.uuid4().hex,
                   "msg_type": "execute_request", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {},
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        "channel": "shell", "buffers": [],
    }
    out: list[str] = []
    with connect(ws_url, additional_headers=headers or {}, open_timeout=30) as ws:
        ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = json.loads(ws.recv(timeout=timeout))
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = reply["header"]["msg_type"]
            if kind == "stream":
                out.append(reply["content"]["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(reply["content"]["traceback"]))
            elif kind == "status" and reply["content"]["execution_state"] == "idle":
                return "".join(out)
    raise TimeoutError(out)
