"""Billing: metering accuracy through the real hub, ledger throughput, usage reports.

Four measurements in one run, each on loopback only and in temp folders or
databases of its own:

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
  heartbeat  1,000 open sessions (SessionLedger.open) of 1,000 accounts with a
             grant each, in a fresh SQLite file and a fresh PostgreSQL database;
             the heartbeat's database work as the hub does it -- confirm every
             session, renew the lease (Meter._write_heartbeat) and read the
             balances of all accounts (Ledger.balances) -- repeated and timed.
  report     1,000,000 closed sessions over two calendar months in a fresh
             PostgreSQL database (generated server-side with generate_series,
             then VACUUM ANALYZE); billing_reports.report for one month grouped
             by user, account and profile, and billing_reports.usage of one user.

    .venv/bin/python bench/billing.py [--servers 20] [--sessions 1000] [--rows 1000000]

The last lines are `name: value`, one per figure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml
from sqlalchemy import Engine, create_engine, event, insert, make_url, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make `tests.hubproc` importable

from gpulease.hub import billing_reports  # noqa: E402
from gpulease.hub.db import ledger_entries, open_database, sqlite_url, utcnow  # noqa: E402
from gpulease.hub.metering import LiveSession, Meter  # noqa: E402
from gpulease.hub.sessions import SessionLedger  # noqa: E402
from tests.hubproc import CHP, HubProcess  # noqa: E402

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
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"

MAX_ERROR_TARGET_S = 1.0
REPORT_TARGET_MS = 500.0


class Aborted(Exception):
    """Ctrl-C (or a failed sibling) asked the worker threads to stop."""


# --- process hygiene -----------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): its identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (Linux /proc; empty elsewhere)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


class Children:
    """Processes a hub started (servers, proxy, service): noted while the hub lives,
    so that what a SIGKILLed hub left behind is still ended at the close. A pid is
    signalled only while its start time is the one noted (never a reused pid)."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}

    def note(self, root: int) -> None:
        for pid in descendants(root):
            started = _start_time(pid)
            if started is not None:
                self.seen[pid] = started

    def _ours(self) -> list[int]:
        return [pid for pid, started in self.seen.items() if _start_time(pid) == started]

    def reap(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = self._ours()
            for pid in alive:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while alive and time.monotonic() < deadline:
                time.sleep(0.1)
                alive = self._ours()
            if not alive:
                return


@contextmanager
def interrupts_clean_up() -> Iterator[None]:
    """Ctrl-C (SIGINT) and `kill PID` (SIGTERM) both raise KeyboardInterrupt, which cleans up.

    Once one arrives, further ones are ignored so that the clean-up is not cut short.
    """

    def handler(signum: int, frame: Any) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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


# --- PostgreSQL scratch databases ----------------------------------------------------------


@contextmanager
def scratch_postgres(server_url: str, label: str) -> Iterator[str]:
    """A fresh database on the server, dropped (even with connections left) at the end."""
    server = make_url(server_url)
    name = f"gpulease_bench_{label}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# --- 3. heartbeat throughput ---------------------------------------------------------------


def open_sessions(engine: Engine, users: list[str], server: str, label: str) -> Meter:
    """One open session per user (SessionLedger.open), carried by a Meter holding the lease."""
    t0 = time.perf_counter()
    now = utcnow()
    ledger = SessionLedger(engine)
    opened = [ledger.open(u, server, "cpu", f"user:{u}", 3_600_000, now) for u in users]
    print(f"  {label}: {len(opened)} sessions opened in {time.perf_counter() - t0:.1f} s",
          flush=True)
    meter = Meter(engine, heartbeat_s=15)
    meter.acquire_lease()
    for s in opened:  # as Meter.recover builds them
        meter.live[(s.user, s.server)] = LiveSession(
            s.id, s.profile, s.account, s.rate_per_hour_ucr, s.last_confirmed)
    return meter


def time_heartbeats(meter: Meter, label: str, min_reps: int = 20, min_s: float = 3.0) -> float:
    """Heartbeats per second: Meter._write_heartbeat + Ledger.balances, as Meter.heartbeat."""
    accounts = {live.account for live in meter.live.values()}
    count = len(meter.live)
    writes: list[float] = []
    reads: list[float] = []
    started = time.perf_counter()
    now = utcnow()
    while len(writes) < min_reps or time.perf_counter() - started < min_s:
        now = utcnow()
        for live in meter.live.values():  # what heartbeat() does before writing
            live.last_alive = now
        t1 = time.perf_counter()
        meter._write_heartbeat(now)
        t2 = time.perf_counter()
        balances = meter.ledger.balances(accounts)
        t3 = time.perf_counter()
        writes.append(t2 - t1)
        reads.append(t3 - t2)
        if len(balances) != len(accounts) or len(meter.live) != count:
            raise RuntimeError(f"{label}: heartbeat lost sessions or accounts")
    total = sum(writes) + sum(reads)
    rate = len(writes) / total
    print(f"  {label}: {len(writes)} heartbeats of {count} sessions in {total:.2f} s: "
          f"write (lease + confirm) median {statistics.median(writes) * 1000:.1f} ms, "
          f"balances median {statistics.median(reads) * 1000:.1f} ms "
          f"-> {rate:.1f} heartbeats/s", flush=True)
    confirmed = meter.sessions.open_sessions()
    if len(confirmed) != count or any(s.last_confirmed != now for s in confirmed):
        raise RuntimeError(f"{label}: the last heartbeat did not confirm every session")
    meter.release_lease()
    return rate


def bench_heartbeat(url: str, label: str, sessions_n: int) -> float:
    engine = open_database(url)
    try:
        users = [f"hb{i:05d}" for i in range(sessions_n)]
        with engine.begin() as conn:
            conn.execute(insert(ledger_entries), [
                {"account": f"user:{u}", "kind": "grant", "amount_ucr": 1_000_000_000,
                 "note": "bench", "actor": "bench", "created_at": utcnow()} for u in users])
        return time_heartbeats(open_sessions(engine, users, "", label), label)
    finally:
        engine.dispose()


# --- 4. usage report over a million sessions ---------------------------------------------

PROFILE_RATES = {  # µcr per hour
    "cpu": 100_000, "h200-1g": 1_200_000, "h200-2g": 2_400_000, "h200-3g": 3_600_000,
    "h200-7g": 8_400_000, "h200": 9_600_000,
}
GENERATE = """
INSERT INTO sessions (user_name, server_name, profile_slug, account, rate_per_hour_ucr,
                      started_at, last_confirmed_at, ended_at, end_reason)
SELECT 'u' || lpad(u::text, 4, '0'),
       CASE WHEN g % 3 = 0 THEN '' ELSE 'nb' || (g % 4)::text END,
       p.slug,
       CASE WHEN random() < 0.2 THEN 'group:lab' || lpad((u % 50)::text, 2, '0')
            ELSE 'user:u' || lpad(u::text, 4, '0') END,
       p.rate, st, st + len - (random() * 15) * interval '1 second', st + len,
       CASE WHEN g % 7 = 0 THEN 'idle' ELSE 'user' END
FROM (SELECT g, (g * 7919) % :users AS u, g % :profiles AS pi,
             :t0 + random() * :span * interval '1 second' AS st,
             (60 + power(random(), 2) * 28800) * interval '1 second' AS len
      FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g) AS x
JOIN (SELECT (ordinality - 1)::int AS pi, slug, rate
      FROM unnest(CAST(:slugs AS text[]), CAST(:rates AS bigint[])) WITH ORDINALITY
           AS t(slug, rate)) AS p USING (pi)
"""
# Each closed session's charge, as SessionLedger.close writes it, and a grant per account.
CHARGES = """
INSERT INTO ledger_entries (account, kind, amount_ucr, note, actor, user_name, session_id,
                            created_at)
SELECT account, 'charge',
       -((CAST(CEIL(date_part('epoch', ended_at - started_at)) AS BIGINT)
          * rate_per_hour_ucr + 3599) / 3600),
       profile_slug || ' session', 'metering', user_name, id, ended_at
FROM sessions
"""
GRANTS = """
INSERT INTO ledger_entries (account, kind, amount_ucr, note, actor, created_at)
SELECT DISTINCT account, 'grant', 1000000000000, 'bench', 'bench', CAST(:at AS timestamp)
FROM sessions
"""


def month_bounds() -> tuple[dt.datetime, dt.datetime, dt.datetime]:
    """Starts of the month before last, last month and this month (naive UTC)."""
    this = utcnow().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (this - dt.timedelta(days=1)).replace(day=1)
    before = (last - dt.timedelta(days=1)).replace(day=1)
    return before, last, this


def timed(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    times: list[float] = []
    result: Any = None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times, result


def explain(engine: Engine, fn: Callable[[], Any]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the one statement `fn` runs, captured as it runs."""
    captured: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
             executemany: bool) -> None:
        captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    statement, parameters = captured[-1]
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
        lines = [row[0] for row in cursor.fetchall()]
        raw.rollback()
        return lines
    finally:
        raw.close()


def bench_report(url: str, rows: int, reps: int, sessions_n: int) -> float:
    engine = open_database(url)
    try:
        before, last, this = month_bounds()
        users = max(1, rows // 500)
        span = (this - before).total_seconds()
        t0 = time.perf_counter()
        batch = 100_000
        with engine.begin() as conn:
            conn.execute(text("SELECT setseed(0.42)"))
            for lo in range(1, rows + 1, batch):
                conn.execute(text(GENERATE), {
                    "users": users, "profiles": len(PROFILE_RATES), "t0": before,
                    "span": span, "lo": lo, "hi": min(rows, lo + batch - 1),
                    "slugs": list(PROFILE_RATES), "rates": list(PROFILE_RATES.values())})
            conn.execute(text(CHARGES))
            conn.execute(text(GRANTS), {"at": before})
        loaded = time.perf_counter() - t0
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
            in_month = conn.execute(text(
                "SELECT count(*) FROM sessions WHERE started_at >= :a AND started_at < :b"),
                {"a": last, "b": this}).scalar()
        vacuum = time.perf_counter() - t0 - loaded
        print(f"  {rows:,} sessions of {users:,} users over {before:%Y-%m} and {last:%Y-%m} "
              f"and their charge rows loaded in {loaded:.1f} s (+ VACUUM ANALYZE {vacuum:.1f} s);"
              f" {in_month:,} started in {last:%Y-%m}", flush=True)

        medians: dict[str, float] = {}
        for group_by in billing_reports.GROUP_BY:
            def run_report(group_by: str = group_by) -> list[dict[str, Any]]:
                return billing_reports.report(engine, since=last, until=this, group_by=group_by)

            run_report()  # untimed: the first run reads the table into the cache
            times, result = timed(run_report, reps)
            medians[group_by] = statistics.median(times)
            total = sum(r["sessions"] for r in result)
            print(f"  report by {group_by:<8} {len(result):>5} rows, {total:,} sessions: "
                  f"median {medians[group_by]:.0f} ms (min {min(times):.0f}, "
                  f"max {max(times):.0f}) over {reps}", flush=True)
            if total != in_month:
                raise RuntimeError(f"report by {group_by} counts {total}, not {in_month}")

        whole, _ = timed(lambda: billing_reports.report(engine, since=before, until=this,
                                                         group_by="profile"), reps)
        print(f"  report by profile over both months ({rows:,} sessions): median "
              f"{statistics.median(whole):.0f} ms", flush=True)
        who = "u0042"
        times, usage = timed(lambda: billing_reports.usage(engine, user=who, since=last,
                                                           until=this), reps)
        print(f"  usage of {who} for {last:%Y-%m}: {len(usage.sessions)} sessions, median "
              f"{statistics.median(times):.1f} ms", flush=True)

        slowest = max(medians, key=lambda k: medians[k])
        plan = explain(engine, lambda: billing_reports.report(
            engine, since=last, until=this, group_by=slowest))
        print(f"  where the time goes (report by {slowest}, EXPLAIN ANALYZE):")
        for line in plan:
            print(f"    {line}")

        # Not a figure: the heartbeat on this database, where every account has a history.
        live = [f"u{i:04d}" for i in range(min(sessions_n, users))]
        print(f"  the heartbeat with this history ({rows:,} sessions and charges):", flush=True)
        time_heartbeats(open_sessions(engine, live, "live", "postgres"), "postgres")
        return medians[slowest]
    finally:
        engine.dispose()


# --- main ------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    abort = threading.Event()
    tmp = Path(tempfile.mkdtemp(prefix="gpulease-bench-billing-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        if args.logs is not None:  # runs before the folder goes (callbacks unwind in reverse)
            stack.callback(save_logs, tmp, args.logs)
        parts = set(args.only or PARTS)
        if parts & {"servers", "kill"}:
            print(f"starting gpulease (heartbeat {args.heartbeat:g} s) ...", flush=True)
            with running_hub(tmp, args.heartbeat, abort) as bench:
                if "servers" in parts:
                    figures["billing_max_error_s"] = bench_servers(
                        bench, args.servers, args.concurrency, (args.min_s, args.max_s),
                        random.Random(args.seed))
                if "kill" in parts:
                    figures["billing_error_after_kill_s"] = bench_kill(
                        bench, args.kill_servers, args.heartbeat, args.downtime)
        if "heartbeat" in parts:
            print(f"\n[heartbeat] {args.sessions} open sessions, one account each", flush=True)
            figures["billing_heartbeats_per_s_sqlite"] = bench_heartbeat(
                sqlite_url(tmp / "heartbeat.sqlite"), "sqlite", args.sessions)
            with scratch_postgres(args.postgres, "hb") as url:
                figures["billing_heartbeats_per_s_postgres"] = bench_heartbeat(
                    url, "postgres", args.sessions)
        if "report" in parts:
            print(f"\n[report] {args.rows:,} sessions on PostgreSQL", flush=True)
            with scratch_postgres(args.postgres, "report") as url:
                figures["usage_report_ms"] = bench_report(url, args.rows, args.reps,
                                                          args.sessions)
    return figures


def save_logs(tmp: Path, logs: Path) -> None:
    logs.mkdir(parents=True, exist_ok=True)
    for log in tmp.glob("hub/*.log"):
        shutil.copy(log, logs / log.name)
    print(f"hub logs copied to {logs}", flush=True)


PARTS = ("servers", "kill", "heartbeat", "report")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=20, help="servers of random length (20)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="servers running at once (4: JupyterLab is heavy on 2 cores)")
    parser.add_argument("--min-s", type=float, default=3.0, help="shortest server run (3 s)")
    parser.add_argument("--max-s", type=float, default=20.0, help="longest server run (20 s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random lengths (1)")
    parser.add_argument("--heartbeat", type=float, default=5.0,
                        help="the hub's heartbeat_interval in seconds (5)")
    parser.add_argument("--kill-servers", type=int, default=3,
                        help="servers that run across the hub SIGKILL (3), plus one that dies")
    parser.add_argument("--downtime", type=float, default=5.0,
                        help="seconds the hub stays down after its SIGKILL (5)")
    parser.add_argument("--sessions", type=int, default=1000,
                        help="open sessions for the heartbeat throughput (1000)")
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="sessions in the usage report database (1000000)")
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each report (5)")
    parser.add_argument("--postgres", default=os.environ.get(
        "GPULEASE_TEST_POSTGRES_URL", DEFAULT_POSTGRES),
        help="PostgreSQL server for scratch databases (GPULEASE_TEST_POSTGRES_URL or "
             f"{DEFAULT_POSTGRES}); a database is created and dropped there")
    parser.add_argument("--only", action="append", choices=PARTS,
                        help="run only this part (repeatable); all four by default")
    parser.add_argument("--logs", type=Path, help="copy the hub's logs to this folder at the end")
    args = parser.parse_args(argv)
    if args.servers < 1 or args.concurrency < 1 or args.kill_servers < 1:
        parser.error("--servers, --concurrency and --kill-servers must be at least 1")
    if not 0 < args.min_s <= args.max_s:
        parser.error("need 0 < --min-s <= --max-s")
    if args.sessions < 1 or args.rows < 1 or args.reps < 1:
        parser.error("--sessions, --rows and --reps must be at least 1")
    if set(args.only or PARTS) & {"servers", "kill"} and not CHP.exists():
        print(f"bench: {CHP} missing; run `npm install` (or `make install`)", file=sys.stderr)
        return 2
    started = time.monotonic()
    with interrupts_clean_up():
        try:
            figures = run(args)
        except (KeyboardInterrupt, Aborted):
            print("bench: interrupted; hub stopped, databases dropped, temp folders removed",
                  file=sys.stderr)
            return 130
    print(f"\n(whole run {time.monotonic() - started:.0f} s)")
    for name, value in figures.items():
        print(f"{name}: {value:.3f}" if name.endswith("_s") else f"{name}: {value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
