"""Billing through the real hub: the `servers` and `kill` parts of bench/billing.py.

  servers    `gpulease up` (tests/hubproc.HubProcess) with a `cpu` profile at
             3.6 credits/h; N named servers (real JupyterLab) of random lengths,
             at most C at once. Each server's running interval is measured on the
             client: from the first 200 of `GET /user/NAME/SERVER/api/status`
             through the proxy until the stop completed (the DELETE answered and
             the hub no longer lists the server). Billing runs from the server's
             first HTTP answer (just before the proxy route exists) to the release
             of its devices (just before the stop completes), so the client's
             interval brackets it; the error is |billed_seconds - measured|, with
             billed_seconds read back from `GET /services/gpulease/api/usage`.
  kill       on the same hub, K servers run; the hub is SIGKILLed between two
             heartbeats, one more server's process is SIGKILLed while the hub is
             down, the hub restarts, the survivors run on and are stopped. The
             survivors must be billed their whole interval; the dead one must end
             as hub_lost at its last confirmation (never after its death).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from bench.procs import Children
from tests.hubproc import HubProcess

ADMIN_PASSWORD = "bench-admin-pw-123"
USER = "payer"
USER_PASSWORD = "payer-pw-12345"
PRICE = "3.6"  # credits per hour: one milli-credit a second
PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": PRICE, "min_run": "10m"},
]}
START_BODY = {"user_options": {"profile": "cpu"}}
POLL_S = 0.02  # client-side polling for the first answer and for the stop
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0

MAX_ERROR_TARGET_S = 1.0


class Aborted(Exception):
    """Ctrl-C (or a failed sibling) asked the worker threads to stop."""


# --- the hub -------------------------------------------------------------------------


def parse_z(text_: str) -> float:
    """An API time ("...Z") as a Unix timestamp, comparable with time.time()."""
    return dt.datetime.fromisoformat(text_.replace("Z", "+00:00")).timestamp()


@dataclass
class Bench:
    """A started hub and the user whose servers are measured."""

    hub: HubProcess
    children: Children
    abort: threading.Event
    token: str = ""

    def session(self) -> requests.Session:
        s = requests.Session()
        s.headers["Authorization"] = f"token {self.token}"
        return s

    def log_tail(self, chars: int = 3000) -> str:
        return self.hub.log()[-chars:]

    def sleep(self, seconds: float) -> None:
        if self.abort.wait(seconds):
            raise Aborted

    def usage(self) -> dict[str, dict[str, Any]]:
        r = self.hub.service("GET", "api/usage", self.token)
        if r.status_code != 200:
            raise RuntimeError(f"api/usage answered {r.status_code} {r.text}")
        return {s["server"]: s for s in r.json()["sessions"]}


@contextmanager
def running_hub(tmp: Path, heartbeat_s: float, abort: threading.Event) -> Iterator[Bench]:
    (tmp / "hub").mkdir()
    profiles = tmp / "hub" / "profiles.yaml"
    profiles.write_text(yaml.safe_dump(PROFILES))
    hub = HubProcess(state=tmp / "hub" / "state", admin_password=ADMIN_PASSWORD, extra_args=[
        f"--profiles={profiles}", f"--GPULeaseHub.heartbeat_interval={heartbeat_s}",
    ])
    bench = Bench(hub, Children(), abort)
    try:
        hub.start()
        admin = hub.token_for("admin", ADMIN_PASSWORD)
        r = hub.service("POST", "api/users", admin, {"name": USER, "password": USER_PASSWORD})
        if r.status_code != 201:
            raise RuntimeError(f"create user: {r.status_code} {r.text}")
        hub.grant(admin, f"user:{USER}", "1000")
        bench.token = hub.token_for(USER, USER_PASSWORD)
        yield bench
    finally:
        if hub.proc is not None and hub.proc.poll() is None:
            bench.children.note(hub.proc.pid)
        hub.close()
        bench.children.reap()


@dataclass
class Run:
    """One server's life as the client saw it (wall-clock Unix times)."""

    server: str
    length_s: float
    first_answer: float = 0.0
    stop_done: float = 0.0

    @property
    def measured_s(self) -> float:
        return self.stop_done - self.first_answer


def start_and_wait(bench: Bench, http: requests.Session, run: Run) -> None:
    """Start the named server; return at its first 200 through the proxy."""
    url, name = bench.hub.url, run.server
    r = http.post(f"{url}/hub/api/users/{USER}/servers/{name}", json=START_BODY,
                  timeout=READY_TIMEOUT_S)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"start {name}: {r.status_code} {r.text}\n{bench.log_tail()}")
    status_url = f"{url}/user/{USER}/{name}/api/status"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if http.get(status_url, allow_redirects=False, timeout=10).status_code == 200:
                run.first_answer = time.time()
                return
        except requests.RequestException:
            pass
        bench.sleep(POLL_S)
    raise TimeoutError(f"{name}: no answer after {READY_TIMEOUT_S}s\n{bench.log_tail()}")


def stop_and_wait(bench: Bench, http: requests.Session, run: Run) -> None:
    """Stop the named server; return once the hub no longer lists it."""
    url, name = bench.hub.url, run.server
    r = http.delete(f"{url}/hub/api/users/{USER}/servers/{name}", timeout=STOP_TIMEOUT_S)
    if r.status_code not in (202, 204):
        raise RuntimeError(f"stop {name}: {r.status_code} {r.text}")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        servers = http.get(f"{url}/hub/api/users/{USER}", timeout=30).json().get("servers", {})
        if name not in servers:
            run.stop_done = time.time()
            return
        bench.sleep(POLL_S)
    raise TimeoutError(f"{name}: still listed {STOP_TIMEOUT_S}s after its stop")


def in_parallel(bench: Bench, work: Callable[[Run], None], runs: list[Run],
                workers: int) -> None:
    """Run `work` over `runs` with at most `workers` at once; the first failure aborts all."""
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        for future in [pool.submit(work, run) for run in runs]:
            future.result()
    except BaseException:
        bench.abort.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def server_pid(user: str, server: str, candidates: list[int]) -> int:
    """The jupyterhub-singleuser process of user/server among the hub's descendants."""
    for pid in candidates:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"jupyterhub-singleuser" in cmd and f"JUPYTERHUB_USER={user}\0".encode() in env
                and f"JUPYTERHUB_SERVER_NAME={server}\0".encode() in env):
            return pid
    raise LookupError(f"no process for {user}/{server}")


# --- 1. servers of random lengths ------------------------------------------------------


def bench_servers(bench: Bench, count: int, concurrency: int, lengths: tuple[float, float],
                  rng: random.Random) -> float:
    runs = [Run(f"s{i:02d}", rng.uniform(*lengths)) for i in range(1, count + 1)]
    print(f"\n[servers] {count} servers of {lengths[0]:g}-{lengths[1]:g} s, "
          f"at most {concurrency} at once", flush=True)

    def life(run: Run) -> None:
        http = bench.session()
        start_and_wait(bench, http, run)
        bench.sleep(run.length_s)
        stop_and_wait(bench, http, run)
        print(f"  {run.server} ran {run.measured_s:6.2f} s", flush=True)

    in_parallel(bench, life, runs, concurrency)
    sessions = bench.usage()
    print("  measured = client: first 200 of /user/payer/SERVER/api/status through the proxy")
    print("             -> stop completed (DELETE answered, server no longer listed by the hub)")
    print("  billed   = billed_seconds of the session in api/usage (hub: first HTTP answer")
    print("             -> devices released, rounded up to the second)")
    print("  start lead = first answer seen by the client - session start (hub)")
    print("  end lead   = stop completed seen by the client - session end (hub)")
    print("  hub interval = session end - session start (hub timestamps, before rounding)")
    print(f"  {'server':<7}{'length':>8}{'measured':>10}{'hub':>9}{'billed':>8}{'error':>8}"
          f"{'start lead':>12}{'end lead':>10}  reason")
    errors, raw_errors = [], []
    for run in runs:
        s = sessions[run.server]
        if s["ended"] is None:
            raise RuntimeError(f"{run.server}: session still open after the stop: {s}")
        interval = parse_z(s["ended"]) - parse_z(s["started"])
        error = abs(s["billed_seconds"] - run.measured_s)
        errors.append(error)
        raw_errors.append(abs(interval - run.measured_s))
        print(f"  {run.server:<7}{run.length_s:8.2f}{run.measured_s:10.3f}{interval:9.3f}"
              f"{s['billed_seconds']:8d}{error:8.3f}"
              f"{run.first_answer - parse_z(s['started']):12.3f}"
              f"{run.stop_done - parse_z(s['ended']):10.3f}  {s['end_reason']}")
    print(f"  max error {max(errors):.3f} s, mean {statistics.fmean(errors):.3f} s "
          f"(target <= {MAX_ERROR_TARGET_S:g} s); before rounding up to the second: "
          f"max {max(raw_errors):.3f} s, mean {statistics.fmean(raw_errors):.3f} s", flush=True)
    return max(errors)


# --- 2. hub SIGKILL mid-session ----------------------------------------------------------


def bench_kill(bench: Bench, keep: int, heartbeat_s: float, downtime_s: float) -> float:
    hub = bench.hub
    runs = [Run(f"k{i}", 0.0) for i in range(1, keep + 1)]
    dies = Run("d1", 0.0)
    print(f"\n[kill] {keep} servers survive a hub SIGKILL, {dies.server} is killed while "
          f"the hub is down (heartbeat {heartbeat_s:g} s, hub down {downtime_s:g} s)",
          flush=True)
    in_parallel(bench, lambda run: start_and_wait(bench, bench.session(), run),
                [*runs, dies], len(runs) + 1)
    # Kill between two heartbeats: the last confirmation is up to one interval old.
    bench.sleep(2.5 * heartbeat_s)
    assert hub.proc is not None
    bench.children.note(hub.proc.pid)
    victim = server_pid(USER, dies.server, list(bench.children.seen))
    before = bench.usage()
    hub.kill()
    hub_killed = time.time()
    os.kill(victim, signal.SIGKILL)
    dies.stop_done = time.time()
    print(f"  hub SIGKILLed; {dies.server} (pid {victim}) SIGKILLed "
          f"{dies.stop_done - hub_killed:.3f} s later", flush=True)
    bench.sleep(downtime_s)
    hub._log.close()  # HubProcess.start opens a new log without closing the old one
    t0 = time.monotonic()
    hub.start()
    print(f"  hub restarted in {time.monotonic() - t0:.1f} s", flush=True)
    bench.token = hub.token_for(USER, USER_PASSWORD)
    after_restart = bench.usage()
    bench.sleep(2 * heartbeat_s)
    in_parallel(bench, lambda run: stop_and_wait(bench, bench.session(), run), runs, len(runs))
    sessions = bench.usage()

    print(f"  {'server':<7}{'measured':>10}{'billed':>8}{'error':>8}  reason / note")
    errors = []
    for run in runs:
        s = sessions[run.server]
        same = s["started"] == before[run.server]["started"] == after_restart[run.server]["started"]
        error = abs(s["billed_seconds"] - run.measured_s)
        errors.append(error)
        print(f"  {run.server:<7}{run.measured_s:10.3f}{s['billed_seconds']:8d}{error:8.3f}  "
              f"{s['end_reason']}, {'one session across the restart' if same else 'SPLIT'}")
        if not same or s["end_reason"] != "user":
            raise RuntimeError(f"{run.server}: not carried across the restart: "
                               f"{before[run.server]} / {s}")
    d = sessions[dies.server]
    error = abs(d["billed_seconds"] - dies.measured_s)
    errors.append(error)
    ended_before_death = parse_z(d["ended"]) <= dies.stop_done
    print(f"  {dies.server:<7}{dies.measured_s:10.3f}{d['billed_seconds']:8d}{error:8.3f}  "
          f"{d['end_reason']}, ended {dies.stop_done - parse_z(d['ended']):.3f} s before its "
          f"death (last confirmation), billed before the kill: "
          f"{before[dies.server]['billed_seconds']} s")
    print(f"  measured for {dies.server} = first answer -> its SIGKILL; no invented seconds: "
          f"billed {d['billed_seconds']} <= ceil(death - session start) "
          f"{int(-(-(dies.stop_done - parse_z(d['started'])) // 1))}: "
          f"{'yes' if ended_before_death else 'NO'}")
    if d["end_reason"] != "hub_lost" or not ended_before_death:
        raise RuntimeError(f"{dies.server}: expected hub_lost ending before its death: {d}")
    print(f"  max error {max(errors):.3f} s (target <= the heartbeat, {heartbeat_s:g} s)",
          flush=True)
    return max(errors)
