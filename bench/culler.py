"""Idle culler: one decision pass over 10,000 servers, and a replayed simulated week.

  pass   10,000 simulated servers behind a FAKE hub (tests/support/culler_fakehub.py's
         FakeCullerHub, in a process of its own on loopback): paginated users,
         the kernel state the servers pushed to the gpulease service (one
         `GET api/server-activity` for all of them: the culler never contacts
         a server), api/profiles, api/stop. The culler sees them once (its
         memory starts there), then the clock moves 31 minutes and the next
         pass is timed: listing, reading the pushed state, deciding and
         POSTing the stops. The mix is a steady state (most servers busy or
         recently used, some in the warning window, a few past the timeout,
         1% pushing nothing). `culler_pass_all_read_s` is the case where every
         server is quiet by hub, CPU and GPU and only its pushed busy kernel
         keeps it (formerly the worst case: every server's own API was read).
  week   a seeded week of research sessions replayed minute by minute under
         gpulease's rule (policy.decide) and under jupyterhub-idle-culler's rule
         (hub last_activity older than the timeout, reported every 5 minutes),
         both at a 30-minute timeout. See `simulate_week` for the model.
  lateness  20 real servers idle on `gpulease up` (60 s timeout, the shipped culler
         interval): suspend time - (idle start + 60 s). See bench/culler_lateness.py.

    .venv/bin/python bench/culler.py [--servers 10000] [--users 60] [--seed 7]
        [--lateness-servers 20] [--only pass|week|lateness]

The last lines are `name: value`, one per figure. --quick: 500 servers, 6 users'
week, 6 real servers (CI: every part runs to its end).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import functools
import multiprocessing
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from gpulease.idle_culler.policy import SUSPEND, decide, observe  # noqa: E402
from gpulease.idle_culler.signals import KernelState, ServerSnapshot  # noqa: E402
from tests.support.culler_fakehub import (  # noqa: E402
    DECIDE_AT,
    REF,
    TOKEN,
    Clock,
    FakeCullerHub,
    RecordingNotices,
    steady_fleet,
)


def serve_fake_hub(n: int, seed: int, all_read: bool, procs: int, ports) -> None:
    """The fake hub in processes of its own, so the culler's loop has a core to itself."""
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop
    from tornado.netutil import bind_sockets
    from tornado.process import fork_processes

    sockets = bind_sockets(0, address="127.0.0.1")
    ports.put(sockets[0].getsockname()[1])
    if procs > 1:
        fork_processes(procs, max_restarts=0)  # each child answers on the shared socket
    HTTPServer(FakeCullerHub(steady_fleet(n, seed, all_read)).app()).add_sockets(sockets)
    IOLoop.current().start()


async def one_pass(n: int, seed: int, all_read: bool, procs: int) -> tuple[float, dict]:
    from gpulease.idle_culler.cpu import StaticCpuSource
    from gpulease.idle_culler.culler import Culler, CullerConfig
    from gpulease.idle_culler.gpu import StaticGpuSource
    from gpulease.idle_culler.hubapi import HubClient

    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    child = ctx.Process(target=serve_fake_hub, args=(n, seed, all_read, procs, ports), daemon=True)
    child.start()
    try:
        port = ports.get(timeout=60)
        servers = steady_fleet(n, seed, all_read)
        cpu = StaticCpuSource({s.key: 250.0 for s in servers if s.kind == "cpu-busy"},
                              default=0.5)
        gpu = StaticGpuSource({d: 60.0 for s in servers if s.kind == "gpu-busy"
                               for d in s.devices}, default=0.0)
        base = f"http://127.0.0.1:{port}"
        client = HubClient(f"{base}/hub/api", base, TOKEN)
        clock = Clock(REF)
        culler = Culler(client, cpu, gpu, notices=RecordingNotices(), clock=clock,
                        config=CullerConfig())
        await culler.run_pass()  # first sight: the culler's memory starts here
        clock.now = DECIDE_AT
        t0, c0 = time.perf_counter(), time.process_time()
        report = await culler.run_pass()
        seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        await client.close()
    finally:
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.join()
    actions: dict[str, int] = {}
    for d in report.decisions.values():
        actions[d.action] = actions.get(d.action, 0) + 1
    return seconds, {"culler_cpu_s": round(cpu_s, 2), "kernels": report.kernel_views,
                     "stops": len(report.stops), "errors": len(report.errors), **actions}

# --- the replayed week ----------------------------------------------------------------
WEEK, TIMEOUT, REPORT_EVERY = 7 * 24 * 60, 30, 5  # minutes


@dataclass
class Session:
    kind: str  # interactive | training | abandoned
    start: int
    events: list[int]  # real use: cell executions, typing (completions), saves
    execs: list[tuple[int, int]]  # cells running [a, b): kernel, CPU and GPU busy
    tabs: list[tuple[int, int]]  # a browser tab open [a, b): it polls every minute
    train: tuple[int, int, str, int] | None = None  # start, end, silent|logging|script, log every
    stop: int = WEEK  # the user stops the server here (else it runs until killed)


def _work(rng: random.Random, t: int, minutes: int, s: Session) -> int:
    """A burst of interactive use from t: events every 1-4 min, maybe a cell run."""
    end = t + minutes
    while t < end:
        s.events.append(t)
        if rng.random() < 0.15:
            s.execs.append((t, t + rng.randint(1, 8)))
        t += rng.randint(1, 4)
    return end


def make_sessions(users: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    out = []
    for _user in range(users):
        for day in range(7):
            n = rng.choice([1, 1, 2]) if day < 5 else int(rng.random() < 0.3)
            for _ in range(n):
                t = day * 1440 + rng.randint(8 * 60, 18 * 60)
                kind = rng.choices(["interactive", "training", "abandoned"], [5, 3, 2])[0]
                s = Session(kind, t, [], [], [])
                if kind == "interactive":
                    for block in range(rng.randint(2, 5)):
                        t = _work(rng, t, rng.randint(15, 90), s)
                        t += rng.randint(5, 25) if block else 0  # reading, thinking
                    leave = rng.random()
                    tab_end = t if leave < 0.75 else t + rng.randint(120, 2880)
                    s.stop = t + 1 if leave < 0.35 else WEEK
                elif kind == "training":
                    t = _work(rng, t, rng.randint(10, 40), s)
                    end = t + rng.randint(120, 1200)
                    mode = rng.choices(["silent", "logging", "script"], [35, 35, 30])[0]
                    s.train = (t, end, mode, rng.choice([5, 15, 45, 90]))
                    tab_end = t + rng.randint(0, 10) if rng.random() < 0.5 else end + 60
                    back = end + rng.randint(30, 720)  # comes back for the results
                    s.tabs.append((back, _work(rng, back, rng.randint(10, 30), s)))
                    s.stop = s.tabs[-1][1] + 1 if rng.random() < 0.6 else WEEK
                else:  # loads a model (GPU memory held, 0% compute), leaves the tab open
                    t = _work(rng, t, rng.randint(10, 40), s)
                    tab_end = t + rng.randint(120, 3000)
                s.tabs.insert(0, (s.start, tab_end))
                s.stop = min(s.stop, WEEK)
                out.append(s)
    return out


def _last(times: list[int], m: int) -> int | None:
    i = bisect.bisect_right(times, m)
    return times[i - 1] if i else None


@functools.cache
def _at(m: int) -> datetime:
    return REF + timedelta(minutes=m)


def _kernel_at(s: Session, train, started: int, t: int) -> int:
    """The kernel's last_activity at t: executions, and a notebook training's messages."""
    times = [started, *[b for a, b in s.execs if started <= b <= t]]
    times += [e for e in [_last(s.events, t)] if e is not None and e >= started]
    if train and train[2] != "script" and train[0] <= t:
        times.append(min(t, train[1]) if train[1] <= t else train[0])
        if train[2] == "logging":  # output every few minutes reaches iopub
            times.append(train[0] + (min(t, train[1]) - train[0]) // train[3] * train[3])
    return max(times)


def _stock_seen(s: Session, train, started: int, m: int) -> int:
    """The hub's last_activity as reported every 5 min: any traffic, polls of open tabs too."""
    tick = m // REPORT_EVERY * REPORT_EVERY
    seen = [started, _kernel_at(s, train, started, tick)]
    seen += [min(tick, b - 1) for a, b in s.tabs if a <= tick]
    if train and train[2] == "script" and train[0] <= tick:
        seen.append(train[0])  # the terminal it was launched from
    return max(seen)


def _snapshot(s: Session, train, started: int, m: int) -> ServerSnapshot:
    """What gpulease's culler reads at minute m (hub activity = real use only)."""
    training = train is not None and train[0] <= m < train[1]
    in_cell = any(a <= m < b for a, b in s.execs)
    notebook = training and train[2] != "script"
    last_event = _last(s.events, m)
    # Training pauses its GPU for evaluation/checkpoints a few minutes an hour.
    gpu = 80.0 if in_cell or (training and (m - train[0]) % 60 >= 4) else 0.0
    return ServerSnapshot(
        user="u", server="", profile="gpu", started=_at(started),
        hub_last_activity=_at(last_event) if last_event and last_event >= started else None,
        kernels=(KernelState("k", "busy" if in_cell or notebook else "idle",
                             _at(_kernel_at(s, train, started, m)), 0),),
        terminals_last_activity=_at(train[0]) if train and train[2] == "script"
        and train[0] <= m else None,
        cpu_percent=150.0 if in_cell or training else 0.5, gpu_percent=gpu, gpu_source="gpm",
        has_gpu=True, idle_timeout_s=TIMEOUT * 60, max_runtime_s=0, warn_before_s=300)


def replay(s: Session, rule: str) -> dict[str, int]:
    """Minute by minute under one rule; a killed server resumes at the user's next real event."""
    out = dict(billed=0, waste=0, killed_busy=0, suspends=0, resumed=0)
    started, running, memory, train, m = s.start, True, None, s.train, s.start
    while m < s.stop:
        if not running:
            i = bisect.bisect_left(s.events, m)
            if i == len(s.events) or s.events[i] >= s.stop:
                break
            m = started = s.events[i]
            running, memory = True, None
            out["resumed"] += 1
        training = train is not None and train[0] <= m < train[1]
        busy = training or any(a <= m < b for a, b in s.execs)
        last_event = _last(s.events, m)
        out["billed"] += 1
        if not busy and (last_event is None or m - last_event > TIMEOUT):
            out["waste"] += 1  # no compute, nobody there for longer than the timeout
        if rule == "stock":
            kill = m - _stock_seen(s, train, started, m) >= TIMEOUT
        else:
            snap = _snapshot(s, train, started, m)
            memory = observe(memory, snap, _at(m))
            kill = decide(snap, memory, _at(m)).action == SUSPEND
        if kill:
            running = False
            out["suspends"] += 1
            if training:
                out["killed_busy"] += train[1] - m
                train = None  # the job died with its server
        m += 1
    return out


def simulate_week(users: int, seed: int) -> dict:
    sessions = make_sessions(users, seed)
    figures: dict = {"_notes": []}
    kinds = {k: sum(1 for s in sessions if s.kind == k) for k in ("interactive", "training",
                                                                   "abandoned")}
    figures["_notes"].append(f"week: {len(sessions)} sessions {kinds}, timeout {TIMEOUT} min")
    for rule, name in (("gpulease", "gpulease"), ("stock", "stock")):
        total = dict(billed=0, waste=0, killed_busy=0, suspends=0, resumed=0)
        for s in sessions:
            for k, v in replay(s, rule).items():
                total[k] += v
        figures["_notes"].append(
            f"{name}: billed {total['billed'] / 60:.0f} GPU-h, idle {total['waste'] / 60:.0f} h, "
            f"{total['suspends']} suspends, {total['resumed']} resumed by a returning user")
        figures[f"idle_gpu_waste_ratio_{name}"] = total["waste"] / max(1, total["billed"])
        figures[f"killed_busy_hours_{name}"] = total["killed_busy"] / 60
    return figures

FIGURES = ("culler_pass_s", "culler_pass_all_read_s", "idle_gpu_waste_ratio_gpulease",
           "killed_busy_hours_gpulease", "idle_gpu_waste_ratio_stock", "killed_busy_hours_stock",
           "suspend_lateness_p50_s", "suspend_lateness_p95_s", "suspend_lateness_max_s")
# 6 real servers: one more than the shipped named_server_limit_per_user, which the
# lateness hub raises as an admin would (the quick run shows it still does).
TARGETS = {"culler_pass_s": "< 2", "suspend_lateness_p95_s": "<= 60"}
QUICK = {"servers": 500, "users": 6, "lateness_servers": 6}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--servers", type=int, default=10_000)
    p.add_argument("--users", type=int, default=60)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--only", choices=["pass", "week", "lateness"])
    p.add_argument("--lateness-servers", type=int, default=20)  # real ones, 4 starting at once
    p.add_argument("--hub-procs", type=int, default=1,
                   help="processes serving the fake hub (more where cores allow)")
    p.add_argument("--quick", action="store_true", help="small counts (CI): " + ", ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    args = p.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    figures: list[tuple[str, float, int]] = []
    if args.only in (None, "pass"):
        seconds, detail = asyncio.run(one_pass(args.servers, args.seed, False, args.hub_procs))
        print(f"pass over {args.servers} servers (steady mix): {seconds:.2f}s {detail}")
        worst, wdetail = asyncio.run(one_pass(args.servers, args.seed, True, args.hub_procs))
        print(f"pass over {args.servers} servers (all read): {worst:.2f}s {wdetail}")
        figures += [("culler_pass_s", seconds, 2), ("culler_pass_all_read_s", worst, 2)]
    if args.only in (None, "week"):
        week = simulate_week(users=args.users, seed=args.seed)
        for line in week.pop("_notes"):
            print(line)
        figures += [(k, v, 3) for k, v in week.items()]
    if args.only in (None, "lateness"):
        from bench.culler_lateness import run as lateness  # Ctrl-C there cleans up, exits 130
        figures += [(k, v, 1) for k, v in lateness(args.lateness_servers).items()]
    for name, value, digits in figures:
        figure(name, value, digits)
        if name in TARGETS:
            target(name, TARGETS[name])


if __name__ == "__main__":
    main()
