"""Billing through the real hub: the `servers` and `kill` parts of bench/billing.py.

  servers    `gpulease up` (tests/support/hubproc.py's HubProcess) with a `cpu` profile at
             3.6 credits/h; N named servers (real JupyterLab) of random lengths
             (most short, some of a minute or more), at most C at once, each
             removed once stopped. Each server's interval is measured by the
             client (bench/billing_client): from its first HTTP answer on its
             own port until the stop's DELETE is answered 204. Billing runs from
             the server's first HTTP answer (the hub polls that same address) to
             the release of its devices (the end of the spawner's stop, just
             before JupyterHub answers the DELETE), so both see the same two
             events; the error is |billed_ms - client interval|, with billed_ms
             read back from `GET /services/gpulease/api/usage`.
  kill       on the same hub, K servers run; the hub is SIGKILLed between two
             heartbeats, one more server's process is SIGKILLed while the hub is
             down, the hub restarts, the survivors run on and are stopped. The
             survivors must be billed their whole interval; the dead one must end
             as hub_lost at its last confirmation (never after its death).
"""

from __future__ import annotations

import datetime as dt
import math
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

import yaml

from bench.billing_client import Aborted, Client, Run
from bench.procs import Children
from gpulease.singleuser import SERVER_SCRIPT
from tests.support.hubproc import HubProcess

__all__ = ["Aborted", "bench_kill", "bench_servers", "running_hub"]

ADMIN_PASSWORD = "bench-admin-pw-123"
USER = "payer"
USER_PASSWORD = "payer-pw-12345"
PRICE = "3.6"  # credits per hour: one milli-credit a second
PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": 1, "memory": "2Gi", "images": ["pytorch"],
     "price_per_hour": PRICE, "min_run": "10m"},
]}

MAX_ERROR_TARGET_MS = 50.0
MAX_ERROR_TARGET_PCT = 0.1  # for sessions of LONG_S or more
LONG_S = 60.0


# --- the hub -------------------------------------------------------------------------


def parse_z(text_: str) -> float:
    """An API time ("...:05.120Z") as a Unix timestamp, comparable with time.time()."""
    return dt.datetime.fromisoformat(text_.replace("Z", "+00:00")).timestamp()


@dataclass
class Bench:
    """A started hub and the user whose servers are measured."""

    hub: HubProcess
    children: Children
    abort: threading.Event
    token: str = ""

    def client(self) -> Client:
        """A client of the hub as it runs now (its pid and the user's token change
        across the kill part's restart)."""
        assert self.hub.proc is not None
        return Client(self.hub.url, self.hub.proc.pid, USER, self.token, self.abort,
                      self.hub.urls)

    def log_tail(self, chars: int = 3000) -> str:
        return self.hub.log()[-chars:]

    def sleep(self, seconds: float) -> None:
        if self.abort.wait(seconds):
            raise Aborted

    def usage(self) -> dict[str, dict[str, Any]]:
        r = self.hub.service("GET", "api/usage", self.token)
        if r.status_code != 200:
            raise RuntimeError(f"api/usage answered {r.status_code} {r.text}")
        sessions = {s["server"]: s for s in r.json()["sessions"]}
        if any("billed_ms" not in s for s in sessions.values()):
            raise RuntimeError("api/usage has no billed_ms (metering to the millisecond, "
                               "issue 13, has not landed in this tree)")
        return sessions


@contextmanager
def running_hub(tmp: Path, heartbeat_s: float, abort: threading.Event,
                hub_args: list[str] | None = None) -> Iterator[Bench]:
    (tmp / "hub").mkdir()
    profiles = tmp / "hub" / "profiles.yaml"
    profiles.write_text(yaml.safe_dump(PROFILES))
    hub = HubProcess(state=tmp / "hub" / "state", admin_password=ADMIN_PASSWORD, extra_args=[
        f"--profiles={profiles}", f"--GPULeaseHub.heartbeat_interval={heartbeat_s}",
        *(hub_args or []),
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
    """The server process of user/server among the hub's descendants (gpulease's
    servers run gpulease-singleuser, spawners/local/process_spec.py)."""
    for pid in candidates:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (SERVER_SCRIPT.encode() in cmd and f"JUPYTERHUB_USER={user}\0".encode() in env
                and f"JUPYTERHUB_SERVER_NAME={server}\0".encode() in env):
            return pid
    raise LookupError(f"no process for {user}/{server}")


# --- 1. servers of random lengths ------------------------------------------------------


@dataclass
class Measured:
    """One server: the client's run beside its billing session."""

    run: Run
    session: dict[str, Any]

    @property
    def billed_ms(self) -> int:
        return int(self.session["billed_ms"])

    @property
    def error_ms(self) -> float:
        return abs(self.billed_ms - self.run.client_ms)

    @property
    def start_lead_ms(self) -> float:  # > 0: the client's launch after the session's start
        return (self.run.launched - parse_z(self.session["started"])) * 1000

    @property
    def end_lead_ms(self) -> float:  # > 0: the client saw the end after the hub
        end = self.run.exited or self.run.stop_done
        return (end - parse_z(self.session["ended"])) * 1000


def plan(count: int, long_count: int, short: tuple[float, float], long: tuple[float, float],
         rng: random.Random) -> list[Run]:
    """`count` runs, the first `long_count` of them long (started first, so that the
    long ones overlap the short ones rather than trail at the end)."""
    lengths = [rng.uniform(*long) for _ in range(long_count)]
    lengths += [rng.uniform(*short) for _ in range(count - long_count)]
    return [Run(f"s{i:02d}", length) for i, length in enumerate(lengths, 1)]


def bench_servers(bench: Bench, runs: list[Run], concurrency: int) -> dict[str, float]:
    print(f"\n[servers] {len(runs)} servers ({sum(r.length_s >= LONG_S for r in runs)} of "
          f"{LONG_S:g} s or more), at most {concurrency} at once, each removed once stopped",
          flush=True)

    def life(run: Run) -> None:
        client = bench.client()
        client.start(run)
        bench.sleep(run.length_s)
        client.stop(run)
        client.remove(run.server)
        print(f"  {run.server} ran {run.client_ms / 1000:7.3f} s"
              f"{' (slow stop: 202)' if run.slow_stop else ''}", flush=True)

    in_parallel(bench, life, runs, concurrency)
    sessions = bench.usage()
    measured = []
    for run in runs:
        s = sessions[run.server]
        if s["ended"] is None:
            raise RuntimeError(f"{run.server}: session still open after the stop: {s}")
        measured.append(Measured(run, s))
    print_servers(measured)
    errors = [m.error_ms for m in measured]
    long_pct = [m.error_ms / m.run.client_ms * 100 for m in measured
                if m.run.client_ms >= LONG_S * 1000]
    whole_s = [abs(m.session["billed_seconds"] - m.run.client_ms / 1000) for m in measured]
    print(f"  max error {max(errors):.1f} ms, mean {statistics.fmean(errors):.1f} ms "
          f"(target <= {MAX_ERROR_TARGET_MS:g} ms); servers of {LONG_S:g} s or more: max "
          + (f"{max(long_pct):.4f} %" if long_pct else "n/a (none)")
          + f" (target < {MAX_ERROR_TARGET_PCT:g} %)")
    for side in ("start_lead_ms", "end_lead_ms", "bookkeeping_ms"):
        values = [getattr(m, side) if side != "bookkeeping_ms" else m.run.bookkeeping_ms
                  for m in measured]
        print(f"  {side[:-3].replace('_', ' ')}: min {min(values):.1f}, median "
              f"{statistics.median(values):.1f}, max {max(values):.1f} ms")
    print(f"  whole seconds (billed_seconds, rounded up): max error {max(whole_s):.3f} s",
          flush=True)
    return {"billing_max_error_ms": max(errors),
            "billing_max_error_pct": max(long_pct) if long_pct else math.nan,
            "billing_max_error_s": max(whole_s)}


def print_servers(measured: list[Measured]) -> None:
    print("  client = the server's launch (its process made: /proc starttime, 10 ms ticks)")
    print("           -> its process seen ended (its pidfd, watched from the DELETE)")
    print("  billed = billed_ms in api/usage (hub: the launch, Popen's return or the warm")
    print("           child's report from its cgroup -> the last of the server ended)")
    print("  start lead = client's launch - session start; end lead = process seen")
    print("  ended - session end; error = |billed - client| = |start lead - end lead|;")
    print("  answer lag = first answer on its own port - launch (billed: its code ran);")
    print("  proxy lag = first 200 through the proxy - first answer; bookkeeping = DELETE")
    print("  answered (204; 202*: a slow stop) - process ended (all three information)")
    print(f"  {'server':<7}{'length s':>9}{'client ms':>11}{'billed_ms':>10}{'error ms':>9}"
          f"{'start lead':>11}{'end lead':>9}{'answer lag':>11}{'proxy lag':>10}"
          f"{'bookkeep':>9}  end")
    for m in measured:
        run = m.run
        print(f"  {run.server:<7}{run.length_s:9.2f}{run.client_ms:11.1f}{m.billed_ms:10d}"
              f"{m.error_ms:9.1f}{m.start_lead_ms:11.1f}{m.end_lead_ms:9.1f}"
              f"{run.answer_lag_ms:11.1f}{run.proxy_lag_ms:10.1f}{run.bookkeeping_ms:9.1f}  "
              f"{'202*' if run.slow_stop else '204'} {m.session['end_reason']}")


# --- 2. hub SIGKILL mid-session ----------------------------------------------------------


def bench_kill(bench: Bench, keep: int, heartbeat_s: float, downtime_s: float) -> float:
    hub = bench.hub
    runs = [Run(f"k{i}", 0.0) for i in range(1, keep + 1)]
    dies = Run("d1", 0.0)
    print(f"\n[kill] {keep} servers survive a hub SIGKILL, {dies.server} is killed while "
          f"the hub is down (heartbeat {heartbeat_s:g} s, hub down {downtime_s:g} s)",
          flush=True)
    in_parallel(bench, lambda run: bench.client().start(run), [*runs, dies], len(runs) + 1)
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
    in_parallel(bench, lambda run: bench.client().stop(run), runs, len(runs))
    sessions = bench.usage()

    print(f"  {'server':<7}{'client s':>10}{'billed s':>10}{'error s':>9}  reason / note")
    errors = []
    for run in runs:
        s = sessions[run.server]
        same = s["started"] == before[run.server]["started"] == after_restart[run.server]["started"]
        billed_s = s["billed_ms"] / 1000
        error = abs(billed_s - run.client_ms / 1000)
        errors.append(error)
        print(f"  {run.server:<7}{run.client_ms / 1000:10.3f}{billed_s:10.3f}{error:9.3f}  "
              f"{s['end_reason']}, {'one session across the restart' if same else 'SPLIT'}"
              f"{', slow stop (202)' if run.slow_stop else ''}")
        if not same or s["end_reason"] != "user":
            raise RuntimeError(f"{run.server}: not carried across the restart: "
                               f"{before[run.server]} / {s}")
    d = sessions[dies.server]
    billed_s = d["billed_ms"] / 1000
    error = abs(billed_s - dies.client_ms / 1000)
    errors.append(error)
    ended_before_death = parse_z(d["ended"]) <= dies.stop_done
    print(f"  {dies.server:<7}{dies.client_ms / 1000:10.3f}{billed_s:10.3f}{error:9.3f}  "
          f"{d['end_reason']}, ended {dies.stop_done - parse_z(d['ended']):.3f} s before its "
          f"death (last confirmation), billed before the kill: "
          f"{before[dies.server]['billed_ms'] / 1000:.3f} s")
    print(f"  client for {dies.server} = its launch -> its SIGKILL; no invented time: "
          f"billed {billed_s:.3f} s <= death - session start "
          f"{dies.stop_done - parse_z(d['started']):.3f} s: "
          f"{'yes' if ended_before_death else 'NO'}")
    if d["end_reason"] != "hub_lost" or not ended_before_death:
        raise RuntimeError(f"{dies.server}: expected hub_lost ending before its death: {d}")
    print(f"  max error {max(errors):.3f} s (target <= the heartbeat, {heartbeat_s:g} s)",
          flush=True)
    return max(errors)
