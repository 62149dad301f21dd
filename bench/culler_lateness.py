"""Suspend lateness on a real hub: the `lateness` part of bench/culler.py.

One `gpulease up` (tests/support/hubproc.py's HubProcess) with the culler at its shipped
interval (GPULeaseOptions.culler_interval, not overridden), a `cpu` profile
with `idle_timeout: 60s`, one user with credit, and N named servers (real
JupyterLab) started at most B at a time. Nobody touches a server once it is
ready: readiness is read from the hub API (`GET /hub/api/users/NAME`, admin
token), never from the server, whose own API requests would count as use.

Idle start of a server = the latest of: the moment the client first saw it
ready in the hub API, the hub's `started`, and the hub's `last_activity` for
it (read right after it is ready and again every few seconds until it stops,
in case the server reports activity later). Lateness = the session's `ended`
in `GET /services/gpulease/api/usage` (end_reason `idle`) - (idle start + 60 s).

The culler counts idleness from the later of the hub's activity and its own
first sight of the server, and passes every interval: a server is suspended at
the first pass at least `idle_timeout` after that. The table splits lateness
into the wait for first sight (culler's `idle since` from its log - idle start)
and the rest (pass grid and the stop itself).
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.billing_servers import parse_z
from bench.procs import Children, interrupts_clean_up
from gpulease.hub.config.app_options import GPULeaseOptions
from tests.support.hubproc import HubProcess

TIMEOUT_S = 60
ADMIN_PASSWORD = "bench-admin-pw-123"
USER, USER_PASSWORD = "idler", "idler-pw-12345"
CPU, MEMORY_GI = 1, 2  # each server's, and what the per-user limits are raised by
PROFILES = {"profiles": [
    {"slug": "cpu", "display_name": "CPU", "cpu": CPU, "memory": f"{MEMORY_GI}Gi",
     "images": ["pytorch"],
     "price_per_hour": "0.1", "min_run": "1s", "idle_timeout": f"{TIMEOUT_S}s"},
]}
READY_TIMEOUT_S = 180.0
WAIT_LIMIT_S = 300.0  # for all suspensions, after the last server is ready
TARGET_P95_S = 60.0
# "[INFO 2025-01-01 12:00:00,123 gpulease-culler] suspend idler/s01: idle for 61s (timeout
# 60s); idle since 2025-01-01 11:59:00.1+00:00; signals {...}"
DECISION = re.compile(r"\[INFO (?P<at>[\d-]+ [\d:,]+) gpulease-culler\] (?P<action>warn|suspend) "
                      rf"{USER}/(?P<server>\S+): (?P<reason>.*?); idle since (?P<since>[^;]+); "
                      r"signals (?P<signals>.*)$")
PASS = re.compile(r"\[INFO (?P<at>[\d-]+ [\d:,]+) gpulease-culler\] culler pass: ")


def shipped_interval() -> float:
    return float(GPULeaseOptions.class_traits()["culler_interval"].default_value)


def _log_time(text: str) -> float:
    """A culler log line's asctime (local time, no zone) as a Unix timestamp."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@contextmanager
def idle_hub(tmp: Path, servers: int) -> Iterator[tuple[HubProcess, str, str]]:
    """The hub with the culler at its default interval; yields (hub, admin token, user token).

    Its one user runs `servers` CPU-only servers at once, beyond the shipped per-user
    limits (5 named servers, 16 cores of CPU-only servers): the admin raises them as
    any admin would (docs/admin.md, "Per-user limits")."""
    profiles = tmp / "profiles.yaml"
    profiles.write_text(yaml.safe_dump(PROFILES))
    hub = HubProcess(state=tmp / "state", admin_password=ADMIN_PASSWORD,
                     extra_args=[f"--profiles={profiles}",
                                 f"--JupyterHub.named_server_limit_per_user={servers}",
                                 f"--GPULeaseHub.cpu_only_cpu_per_user={servers * CPU}",
                                 f"--GPULeaseHub.cpu_only_memory_per_user="
                                 f"{servers * MEMORY_GI}Gi"])
    children = Children()
    try:
        hub.start()
        admin = hub.token_for("admin", ADMIN_PASSWORD)
        r = hub.service("POST", "api/users", admin, {"name": USER, "password": USER_PASSWORD})
        if r.status_code != 201:
            raise RuntimeError(f"create user: {r.status_code} {r.text}")
        hub.grant(admin, f"user:{USER}", "100")
        yield hub, admin, hub.token_for(USER, USER_PASSWORD)
    finally:
        if hub.proc is not None and hub.proc.poll() is None:
            children.note(hub.proc.pid)
        hub.close()
        children.reap()


def _servers(hub: HubProcess, admin: str) -> dict[str, dict[str, Any]]:
    r = hub.api("GET", f"users/{USER}", admin)
    r.raise_for_status()
    return r.json().get("servers") or {}


def _note_activity(model: dict[str, Any], row: dict[str, Any]) -> None:
    for key in ("started", "last_activity"):
        if model.get(key):
            row[key] = max(row.get(key, 0.0), parse_z(model[key]))


def start_batches(hub: HubProcess, admin: str, names: list[str], batch: int,
                  rows: dict[str, dict[str, Any]]) -> None:
    """Start `names` at most `batch` at a time; note each one's readiness as the hub reports it."""
    def post(name: str) -> None:
        r = hub.api("POST", f"users/{USER}/servers/{name}", admin,
                    {"user_options": {"profile": "cpu"}})
        if r.status_code not in (201, 202):
            raise RuntimeError(f"start {name}: {r.status_code} {r.text}")

    with ThreadPoolExecutor(max_workers=batch) as pool:
        for i in range(0, len(names), batch):
            group = names[i:i + batch]
            posted = time.time()
            futures = [pool.submit(post, name) for name in group]
            deadline = time.monotonic() + READY_TIMEOUT_S
            waiting = set(group)
            while waiting:
                for f in futures:
                    if f.done():
                        f.result()  # raises a failed start
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready after {READY_TIMEOUT_S}s: {sorted(waiting)}\n"
                                       f"{hub.log()[-3000:]}")
                servers = _servers(hub, admin)
                seen = time.time()
                for name in sorted(waiting):
                    model = servers.get(name) or {}
                    if model.get("ready"):
                        rows[name] = {"posted": posted, "ready": seen}
                        _note_activity(model, rows[name])
                        waiting.discard(name)
                time.sleep(0.1)
            for f in futures:
                f.result()
            took = [f"{n} {rows[n]['ready'] - rows[n]['posted']:.1f}s" for n in group]
            print(f"  ready: {', '.join(took)}", flush=True)


def wait_suspended(hub: HubProcess, admin: str, token: str,
                   rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Sessions of `rows` once all have ended (or the bounded wait is over)."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    last_print = 0.0
    while True:
        r = hub.service("GET", "api/usage", token)
        r.raise_for_status()
        sessions = {s["server"]: s for s in r.json()["sessions"] if s["server"] in rows}
        ended = [n for n, s in sessions.items() if s["ended"]]
        if len(ended) == len(rows) or time.monotonic() > deadline:
            return sessions
        for name, model in _servers(hub, admin).items():  # a later activity moves idle start
            if name in rows:
                _note_activity(model, rows[name])
        if time.monotonic() - last_print > 15:
            print(f"  {len(ended)}/{len(rows)} suspended", flush=True)
            last_print = time.monotonic()
        time.sleep(1.0)


def culler_log(text: str) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Per server: the culler's warn and suspend decisions, in order; and its passes' ends."""
    decisions: dict[str, list[dict[str, Any]]] = {}
    passes = []
    for line in text.splitlines():
        if m := PASS.search(line):
            passes.append(_log_time(m["at"]))
        elif m := DECISION.search(line):
            decisions.setdefault(m["server"], []).append({
                "at": _log_time(m["at"]), "action": m["action"], "reason": m["reason"],
                "since": datetime.fromisoformat(m["since"]).timestamp(),
                "signals": m["signals"]})
    return decisions, passes


def _suspend(decisions: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((d for d in decisions if d["action"] == "suspend"), None)


def run(servers: int = 20, batch: int = 4) -> dict[str, float]:
    """The figures; Ctrl-C or SIGTERM stops the hub and its servers, removes the temp folder
    and exits with 130."""
    with interrupts_clean_up():
        try:
            return _run(servers, batch)
        except KeyboardInterrupt:
            print("bench: interrupted; hub and servers stopped, temp folder removed",
                  file=sys.stderr)
            raise SystemExit(130) from None


def _run(servers: int, batch: int) -> dict[str, float]:
    interval = shipped_interval()
    print(f"\n[lateness] {servers} real servers, idle_timeout {TIMEOUT_S}s, culler interval "
          f"{interval:g}s (the shipped default), started at most {batch} at a time", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="gpulease-bench-lateness-"))
    try:
        with idle_hub(tmp, servers) as (hub, admin, token):
            names = [f"s{i:02d}" for i in range(1, servers + 1)]
            rows: dict[str, dict[str, Any]] = {}
            start_batches(hub, admin, names, batch, rows)
            sessions = wait_suspended(hub, admin, token, rows)
            log = hub.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    decisions, passes = culler_log(log)
    t0 = min(r["posted"] for r in rows.values())
    print("  culler passes ended at (s from the first start): "
          + " ".join(f"{p - t0:+.1f}" for p in passes))
    print("  idle start = max(ready seen in the hub API, hub started, hub last_activity)")
    print("  sight = culler's `idle since` (its log) - idle start; late = session ended - "
          f"(idle start + {TIMEOUT_S}s)")
    print("  decided = the culler's suspend decision (its log); stop = session ended - decided")
    print(f"  {'server':<7}{'ready':>8}{'start->ready':>13}{'act-ready':>10}{'sight':>7}"
          f"{'decided':>9}{'stop':>6}{'ended':>8}{'late':>7}  reason")
    late, missing = {}, []
    for name in sorted(rows):
        row, s, sus = rows[name], sessions.get(name, {}), _suspend(decisions.get(name, []))
        idle_start = row["idle_start"] = max(row["ready"], row.get("started", 0.0),
                                             row.get("last_activity", 0.0))
        sight = f"{sus['since'] - idle_start:7.1f}" if sus else f"{'-':>7}"
        decided = f"{sus['at'] - t0:9.1f}" if sus else f"{'-':>9}"
        if s.get("ended") and s.get("end_reason") == "idle":
            late[name] = parse_z(s["ended"]) - (idle_start + TIMEOUT_S)
            stop = f"{parse_z(s['ended']) - sus['at']:6.1f}" if sus else f"{'-':>6}"
            tail = f"{stop}{parse_z(s['ended']) - t0:8.1f}{late[name]:7.1f}  idle"
        else:
            missing.append(name)
            tail = f"{'-':>6}{'-':>8}{'-':>7}  NOT SUSPENDED ({s.get('end_reason') or 'open'})"
        print(f"  {name:<7}{row['ready'] - t0:8.1f}{row['ready'] - row['posted']:13.1f}"
              f"{row.get('last_activity', 0.0) - row['ready']:10.2f}{sight}{decided}{tail}")
    if missing:
        raise RuntimeError(f"not suspended within {WAIT_LIMIT_S:g}s: {missing}")
    values = list(late.values())
    worst = max(late, key=late.__getitem__)
    print(f"  lateness p50 {percentile(values, 50):.1f}s, p95 {percentile(values, 95):.1f}s, "
          f"max {max(values):.1f}s, min {min(values):.1f}s (target p95 <= {TARGET_P95_S:g}s)")
    print(f"  the latest, {worst} (ready {rows[worst]['ready'] - t0:+.1f}s, idle start "
          f"{rows[worst]['idle_start'] - t0:+.1f}s), as its culler decisions were logged:")
    for d in decisions.get(worst, []):
        print(f"    {d['at'] - t0:+7.2f}s {d['action']}: idle since {d['since'] - t0:+.2f}s, "
              f"{d['at'] - d['since']:.2f}s before the log line; {d['reason']}; "
              f"signals {d['signals']}")
    return {"suspend_lateness_p50_s": percentile(values, 50),
            "suspend_lateness_p95_s": percentile(values, 95),
            "suspend_lateness_max_s": max(values)}
