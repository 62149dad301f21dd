"""Spawn-to-ready: stock JupyterHub against gpulease, in one run on one machine.

Starts two hubs side by side, each on its own free loopback ports and temp state:

  stock     `python -m jupyterhub` with SimpleLocalProcessSpawner and NullAuthenticator;
            a service token with an admin role creates the user and its token
  gpulease  `gpulease up` (tests/support/hubproc.py's HubProcess) with LocalGPUSpawner on the
            declared demo inventory, spawning the `h200-1g` MIG profile, so that
            options resolution, placement and the assignment record are all on the path

Both run real JupyterLab through the same script, `gpulease-singleuser` of this
venv (JupyterHub's single-user server, started without a grammar build that
costs ~1.5 s: giving only gpulease that saving would hide the hub's own cost
in the ratio). Each spawn is
timed from the REST start (`POST /hub/api/users/{name}/server`) until
`GET /user/{name}/api/status` answers 200 through the proxy (spawn-to-ready; gpulease
serves it on the user's own origin, `{name}.localhost`, as it does by default), and
on until a new kernel on it returned `1+1` over its websocket through the proxy
(click-to-kernel, bench/kernel_client.py). Spawns alternate
(stock, gpulease, stock, ...) so that drift on a shared machine hits both alike;
after each the server is stopped and, on gpulease, its slice seen free again.
Each hub gets one untimed warm-up spawn first (cold imports, first home folder).

As root, gpulease's hub runs each server in its sandbox (network, IPC, /dev/shm,
/tmp, /proc: docs/security.md); a third hub, the same without it
(`server_sandbox = off`), is timed in the same rounds, and `sandbox_cost_median_ms`
is the median of the paired differences (nan where there is no sandbox).

    .venv/bin/python bench/spawn.py [--spawns N] [--logs DIR]

The last lines are `name: value`, one per figure.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: `bench.procs`, `tests.support` importable

from bench.figures import figure, target  # noqa: E402
from bench.kernel_client import PHASES, Phases, click_to_kernel  # noqa: E402
from bench.procs import Children, interrupts_clean_up, save_logs  # noqa: E402
from gpulease.core.model.inventory import DEMO_INVENTORY  # noqa: E402
from gpulease.singleuser import SERVER_SCRIPT  # noqa: E402
from gpulease.site_urls import loopback_session  # noqa: E402
from tests.support.hubproc import CHP, HubProcess, free_port  # noqa: E402

VENV_BIN = Path(sys.executable).parent
USER = "bench"
USER_PASSWORD = "bench-user-pw-123"
ADMIN_PASSWORD = "bench-admin-pw-123"
GPULEASE_PROFILE = "h200-1g"
POLL_S = 0.05  # readiness poll interval, the same for both hubs
SPAWN_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


STOCK_KERNEL_MANAGER = ("--ServerApp.kernel_manager_class="
                        "jupyter_server.services.kernels.kernelmanager.AsyncMappingKernelManager")

# --- the two hubs ----------------------------------------------------------------------


@dataclass
class Subject:
    """One hub under test, as the measuring loop sees it."""

    label: str
    url: str
    token: str  # the spawning user's own token: starts, polls and stops with it
    start_body: dict[str, Any]
    log_path: Path
    wait_released: Callable[[], None] = lambda: None
    # the user's server: on the hub's origin (stock), on its own (gpulease's subdomains)
    server_url: str = ""
    session: requests.Session = field(default_factory=loopback_session)

    def api(self, method: str, path: str, body: Any = None) -> requests.Response:
        return self.session.request(
            method, f"{self.url}/hub/api/{path}", json=body,
            headers={"Authorization": f"token {self.token}"}, timeout=SPAWN_TIMEOUT_S,
        )


STOCK_CONFIG = """\
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.JupyterHub.db_url = {db_url!r}
c.JupyterHub.cookie_secret_file = {cookie_secret_file!r}
c.JupyterHub.pid_file = ""
c.JupyterHub.cleanup_servers = True
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.auth_token = {proxy_token!r}
c.ConfigurableHTTPProxy.pid_file = {proxy_pid_file!r}
c.JupyterHub.authenticator_class = "null"
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = {home_template!r}
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = {args!r}
c.Spawner.default_url = "/lab"
c.JupyterHub.services = [{{"name": "bench", "api_token": {service_token!r}}}]
c.JupyterHub.load_roles = [{{
    "name": "bench-admin",
    "services": ["bench"],
    "scopes": ["admin:users", "admin:servers", "tokens", "list:users", "read:users"],
}}]
"""


@dataclass
class StockHub:
    """Stock `python -m jupyterhub` in a folder of its own."""

    workdir: Path
    service_token: str = field(default_factory=lambda: secrets.token_hex(32))
    proc: subprocess.Popen | None = None
    port: int = 0
    children: Children = field(default_factory=Children)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "jupyterhub.log"

    def start(self, timeout: float = 60) -> StockHub:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = self.workdir / "jupyterhub_config.py"
        config.write_text(STOCK_CONFIG.format(
            port=self.port,
            hub_port=free_port(),
            api_port=free_port(),
            db_url=f"sqlite:///{self.workdir / 'jupyterhub.sqlite'}",
            cookie_secret_file=str(self.workdir / "jupyterhub_cookie_secret"),
            proxy_pid_file=str(self.workdir / "jupyterhub-proxy.pid"),
            proxy_token=secrets.token_hex(32),
            chp=str(CHP),
            home_template=str(self.workdir / "homes" / "{username}"),
            singleuser=str(VENV_BIN / SERVER_SCRIPT),  # the same server as gpulease's
            # ... with jupyter-server's own kernel manager: stock has no kernel started
            # with the server (gpulease.singleuser.kernel_pool)
            args=[STOCK_KERNEL_MANAGER, *(["--allow-root"] if os.getuid() == 0 else [])],
            service_token=self.service_token,
        ))
        env = {**os.environ, "PATH": f"{CHP.parent}:{VENV_BIN}:{os.environ.get('PATH', '')}"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stock hub exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(f"{self.url}/hub/api", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"stock hub not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def admin_api(self, method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(
            method, f"{self.url}/hub/api/{path}", json=body,
            headers={"Authorization": f"token {self.service_token}"}, timeout=60,
        )

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.children.note(self.proc.pid)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.children.reap()


def setup_stock(stack: ExitStack, tmp: Path) -> Subject:
    hub = StockHub(tmp / "stock")
    stack.callback(hub.close)
    hub.start()
    r = hub.admin_api("POST", f"users/{USER}")
    if r.status_code != 201:
        raise RuntimeError(f"stock: create user: {r.status_code} {r.text}")
    r = hub.admin_api("POST", f"users/{USER}/tokens", {"note": "bench"})
    if r.status_code != 201:
        raise RuntimeError(f"stock: user token: {r.status_code} {r.text}")
    return Subject("stock", hub.url, r.json()["token"], {}, hub.log_path)


def setup_gpulease(stack: ExitStack, tmp: Path, label: str = "gpulease",
                   extra_args: tuple[str, ...] = ()) -> Subject:
    hub = HubProcess(
        state=tmp / label / "state",
        admin_password=ADMIN_PASSWORD,
        extra_args=[f"--inventory={DEMO_INVENTORY}", *extra_args],
    )
    hub.state.parent.mkdir(parents=True)

    def close() -> None:
        children = Children()
        if hub.proc is not None and hub.proc.poll() is None:
            children.note(hub.proc.pid)
        hub.close()
        children.reap()

    stack.callback(close)
    hub.start()
    admin = hub.token_for("admin", ADMIN_PASSWORD)
    r = hub.service("POST", "api/users", admin, {"name": USER, "password": USER_PASSWORD})
    if r.status_code != 201:
        raise RuntimeError(f"gpulease: create user: {r.status_code} {r.text}")
    hub.grant(admin, f"user:{USER}", "1000")  # spawns need credit for their minimum run
    token = hub.token_for(USER, USER_PASSWORD)

    def slice_released() -> None:
        """Until no device of the inventory is recorded for the bench user."""
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            inv = hub.service("GET", "api/inventory", admin).json()
            holders = [d["holder"] for n in inv["nodes"] for g in n["gpus"] for d in g["devices"]]
            if not any(h and h["user"] == USER for h in holders):
                return
            time.sleep(0.1)
        raise TimeoutError("gpulease: the slice was not released after the stop")

    return Subject(
        label, hub.url, token, {"user_options": {"profile": GPULEASE_PROFILE}},
        hub.log_path, wait_released=slice_released, server_url=hub.server_url(USER),
    )


# --- measuring -------------------------------------------------------------------------


def log_tail(s: Subject, chars: int = 4000) -> str:
    return s.log_path.read_text(errors="replace")[-chars:] if s.log_path.exists() else ""


def timed_start(s: Subject) -> Phases:
    """One start, to the result of a first cell (bench/kernel_client.py)."""
    try:
        return click_to_kernel(s.session, s.url, USER, s.token, s.start_body, POLL_S,
                               SPAWN_TIMEOUT_S, server_url=s.server_url)
    except (RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"{s.label}: {e}\n{log_tail(s)}") from None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (p95 of 20 runs is the 19th)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def profile_table(runs: dict[str, list[Phases]]) -> str:
    """Median seconds of each step, per hub: where the time goes."""
    steps = list(zip((None, *PHASES[:-1]), PHASES, strict=True))
    lines = [f"{'step (median s)':<22}" + "".join(f"{label:>10}" for label in runs)]
    for before, phase in steps:
        name = f"{before or 'POST sent'} -> {phase}"
        lines.append(f"{name:<22}" + "".join(
            f"{statistics.median(p.step(before, phase) for p in done):>10.3f}"
            for done in runs.values()))
    return "\n".join(lines)


def stop(s: Subject) -> None:
    """Stop the server and wait until the hub no longer lists it (and its devices are free)."""
    r = s.api("DELETE", f"users/{USER}/server")
    if r.status_code not in (202, 204):
        raise RuntimeError(f"{s.label}: stop answered {r.status_code} {r.text}")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while "" in s.api("GET", f"users/{USER}").json().get("servers", {}):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{s.label}: server did not stop\n{log_tail(s)}")
        time.sleep(0.1)
    s.wait_released()


def run(spawns: int, warmup: int, logs: Path | None) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="gpulease-bench-spawn-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        if logs is not None:  # runs before the folder goes (callbacks unwind in reverse)
            stack.callback(save_logs, tmp, logs, "stock", "gpulease")
        print("starting stock JupyterHub and gpulease ...", flush=True)
        subjects = [setup_stock(stack, tmp), setup_gpulease(stack, tmp)]
        sandboxed = "Sandbox: each server" in subjects[1].log_path.read_text(errors="replace")
        if sandboxed:  # its cost, measured beside it: the same hub without it
            subjects.append(setup_gpulease(stack, tmp, NO_SANDBOX,
                                           ("--GPULeaseHub.server_sandbox=off",)))
        for i in range(warmup):
            for s in subjects:
                done = timed_start(s)
                print(f"warm-up {i + 1}/{warmup} {s.label:<9} {done.at['result']:7.3f} s",
                      flush=True)
                stop(s)
        runs: dict[str, list[Phases]] = {s.label: [] for s in subjects}
        for i in range(spawns):
            for s in subjects:
                done = timed_start(s)
                runs[s.label].append(done)
                print(f"spawn {i + 1:>3}/{spawns} {s.label:<9} ready "
                      f"{done.at['answered']:7.3f} s, first cell {done.at['result']:7.3f} s",
                      flush=True)
                stop(s)
    print(profile_table(runs))
    spawn = {label: statistics.median(p.at["answered"] for p in done)
             for label, done in runs.items()}
    cell = {label: [p.at["result"] for p in done] for label, done in runs.items()}
    figures = {
        "spawn_median_stock_s": spawn["stock"],
        "spawn_median_gpulease_s": spawn["gpulease"],
        "spawn_ratio": spawn["gpulease"] / spawn["stock"],
    }
    for label in ("stock", "gpulease"):
        figures[f"click_to_kernel_p50_{label}_s"] = percentile(cell[label], 50)
        figures[f"click_to_kernel_p95_{label}_s"] = percentile(cell[label], 95)
    figures["click_to_kernel_p50_s"] = figures["click_to_kernel_p50_gpulease_s"]
    figures["click_to_kernel_p95_s"] = figures["click_to_kernel_p95_gpulease_s"]
    figures["click_to_kernel_ratio"] = (figures["click_to_kernel_p50_gpulease_s"]
                                        / figures["click_to_kernel_p50_stock_s"])
    # As root: each server in its own namespaces, and the same hub without (nan where
    # gpulease's hub runs no sandbox: not root, or the host cannot).
    figures["spawn_median_gpulease_no_sandbox_s"] = float("nan")
    figures["sandbox_cost_median_ms"] = float("nan")
    if NO_SANDBOX in runs:
        figures["spawn_median_gpulease_no_sandbox_s"] = spawn[NO_SANDBOX]
        # paired, spawn i of each taken one after the other: drift cancels
        figures["sandbox_cost_median_ms"] = 1000 * statistics.median(
            a.at["answered"] - b.at["answered"]
            for a, b in zip(runs["gpulease"], runs[NO_SANDBOX], strict=True))
    return figures


NO_SANDBOX = "gpulease_no_sandbox"
FIGURES = ("spawn_median_stock_s", "spawn_median_gpulease_s", "spawn_ratio",
           "click_to_kernel_p50_stock_s", "click_to_kernel_p95_stock_s",
           "click_to_kernel_p50_gpulease_s", "click_to_kernel_p95_gpulease_s",
           "click_to_kernel_p50_s", "click_to_kernel_p95_s", "click_to_kernel_ratio",
           "spawn_median_gpulease_no_sandbox_s", "sandbox_cost_median_ms")
TARGETS = {"spawn_ratio": "<= 1.0", "click_to_kernel_p50_s": "< 1",
           "sandbox_cost_median_ms": "<= 50"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=10, help="timed spawns per hub (default 10)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed spawns per hub before timing (default 1)")
    parser.add_argument("--logs", type=Path, help="copy both hubs' logs to this folder at the end")
    args = parser.parse_args(argv)
    if args.spawns < 1:
        parser.error("--spawns must be at least 1")
    if not CHP.exists():
        print(f"bench: {CHP} missing; run `npm install` (or `make install`)", file=sys.stderr)
        return 2
    with interrupts_clean_up():
        try:
            figures = run(args.spawns, args.warmup, args.logs)
        except KeyboardInterrupt:
            print("bench: interrupted; hubs stopped and temp folders removed", file=sys.stderr)
            return 130
    for name, value in figures.items():
        figure(name, value)
        if name in TARGETS:
            target(name, TARGETS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
