"""Billing: metering accuracy through the real hub, ledger throughput, usage reports.

Four measurements in one run, each on loopback only and in temp folders or
databases of its own (each part is described in full in its module):

  servers    billing_servers: N named servers (real JupyterLab) of random lengths on
             `gpulease up` (some of a minute or more); the client's interval of
             each (its launch, /proc starttime -> its process seen ended)
             against its billed_ms in `GET /services/gpulease/api/usage`.
  kill       billing_servers: on the same hub, K servers survive a hub SIGKILL and
             restart, one more is SIGKILLed while the hub is down (hub_lost).
  heartbeat  billing_ledger: the heartbeat's database work over 1,000 open sessions,
             in a fresh SQLite file and a fresh PostgreSQL database.
  report     billing_ledger: billing_reports.report and .usage over 1,000,000
             closed sessions in a fresh PostgreSQL database.
  cluster    billing_cluster (only with --only cluster or --all; needs `make
             cluster-tools`): servers on `gpulease up` in the cluster shape, each
             session's start against its container's exec in the kubelet emulator
             (billing_max_error_cluster_ms; --cluster-quick for CI).

    .venv/bin/python bench/billing.py [--servers 20] [--long-servers 5] [--sessions 1000]
                                      [--rows 1000000] [--only PART | --all] [--quick]
                                      [--postgres URL] [--logs DIR]

Without --postgres (or GPULEASE_TEST_POSTGRES_URL) the heartbeat and report parts
start a private PostgreSQL of their own (bench/postgres.py). --quick: small counts
and short servers, to check that every part runs to its end (CI).

The last lines are `name: value`, one per figure; a figure's target is on a line of
its own (`target billing_max_error_ms <= 50`).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: `bench.*`, `tests.support.hubproc` importable

from bench.billing_cluster import TARGETS as CLUSTER_TARGETS  # noqa: E402
from bench.billing_cluster import add_cluster_arguments, cluster_figures  # noqa: E402
from bench.billing_ledger import bench_heartbeat, bench_report, scratch_postgres  # noqa: E402
from bench.billing_servers import (  # noqa: E402
    Aborted,
    bench_kill,
    bench_servers,
    plan,
    running_hub,
)
from bench.figures import figure, target  # noqa: E402
from bench.postgres import NoPostgres, postgres_server  # noqa: E402
from bench.procs import interrupts_clean_up, save_logs  # noqa: E402
from gpulease.store.db import sqlite_url  # noqa: E402
from tests.cluster.controlplane import missing_tools  # noqa: E402
from tests.support.hubproc import CHP  # noqa: E402

PARTS = ("servers", "kill", "heartbeat", "report", "cluster")
DEFAULT_PARTS = PARTS[:4]  # the cluster part only when asked for (--only cluster)
# Every figure the whole run (--all) prints.
FIGURES = ("billing_max_error_ms", "billing_max_error_pct", "billing_max_error_s",
           "billing_error_after_kill_s", "billing_heartbeats_per_s_sqlite",
           "billing_heartbeats_per_s_postgres", "usage_report_ms",
           "billing_max_error_cluster_ms", "billing_end_error_cluster_ms")
# --quick's counts: every part runs to its end in a minute or two.
QUICK = {"servers": 3, "long_servers": 1, "min_s": 2.0, "max_s": 4.0, "long_min_s": 8.0,
         "long_max_s": 10.0, "kill_servers": 1, "downtime": 2.0, "sessions": 50,
         "rows": 5000, "reps": 1, "cluster_quick": True}
TARGETS = {"billing_max_error_ms": "<= 50", "billing_max_error_pct": "< 0.1",
           "billing_max_error_s": "<= 1", "usage_report_ms": "< 500", **CLUSTER_TARGETS}


def run(args: argparse.Namespace) -> dict[str, float]:
    figures: dict[str, float] = {}
    abort = threading.Event()
    tmp = Path(tempfile.mkdtemp(prefix="gpulease-bench-billing-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        if args.logs is not None:  # runs before the folder goes (callbacks unwind in reverse)
            stack.callback(save_logs, tmp, args.logs, "hub")
        parts = set(args.only or DEFAULT_PARTS)
        # One PostgreSQL for both parts, found (or started) before anything is measured.
        postgres = (stack.enter_context(postgres_server(args.postgres))
                    if parts & {"heartbeat", "report"} else "")
        if parts & {"servers", "kill"}:
            print(f"starting gpulease (heartbeat {args.heartbeat:g} s) ...", flush=True)
            with running_hub(tmp, args.heartbeat, abort, args.hub_arg) as bench:
                if "servers" in parts:
                    runs = plan(args.servers, args.long_servers, (args.min_s, args.max_s),
                                (args.long_min_s, args.long_max_s), random.Random(args.seed))
                    figures.update(bench_servers(bench, runs, args.concurrency))
                if "kill" in parts:
                    figures["billing_error_after_kill_s"] = bench_kill(
                        bench, args.kill_servers, args.heartbeat, args.downtime)
        if "heartbeat" in parts:
            print(f"\n[heartbeat] {args.sessions} open sessions, one account each", flush=True)
            figures["billing_heartbeats_per_s_sqlite"] = bench_heartbeat(
                sqlite_url(tmp / "heartbeat.sqlite"), "sqlite", args.sessions)
            with scratch_postgres(postgres, "hb") as url:
                figures["billing_heartbeats_per_s_postgres"] = bench_heartbeat(
                    url, "postgres", args.sessions)
        if "report" in parts:
            print(f"\n[report] {args.rows:,} sessions on PostgreSQL", flush=True)
            with scratch_postgres(postgres, "report") as url:
                figures["usage_report_ms"] = bench_report(url, args.rows, args.reps,
                                                          args.sessions)
        if "cluster" in parts:
            figures.update(cluster_figures(args))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=20, help="servers of random length (20)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="servers running at once (4: JupyterLab is heavy on 2 cores)")
    parser.add_argument("--long-servers", type=int, default=5,
                        help="of --servers, how many are long (5); started first")
    parser.add_argument("--min-s", type=float, default=3.0, help="shortest short run (3 s)")
    parser.add_argument("--max-s", type=float, default=20.0, help="longest short run (20 s)")
    parser.add_argument("--long-min-s", type=float, default=60.0,
                        help="shortest long run (60 s)")
    parser.add_argument("--long-max-s", type=float, default=75.0,
                        help="longest long run (75 s)")
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
    parser.add_argument("--postgres", default=None,
        help="PostgreSQL server for scratch databases (default: GPULEASE_TEST_POSTGRES_URL, "
             "else a private cluster of this run); a database is created and dropped there")
    parser.add_argument("--only", action="append", choices=PARTS,
                        help="run only this part (repeatable); all but cluster by default")
    parser.add_argument("--all", action="store_true", help="all five parts, cluster included")
    parser.add_argument("--quick", action="store_true",
                        help="small counts and short servers (CI): " + ", ".join(
                            f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    parser.add_argument("--logs", type=Path, help="copy the hub's logs to this folder at the end")
    add_cluster_arguments(parser)
    parser.add_argument("--hub-arg", action="append", default=[],
                        help="one more argument for `gpulease up` (repeatable), e.g. "
                             "--hub-arg=--debug to see where a stop's time goes in --logs")
    args = parser.parse_args(argv)
    if args.all:
        args.only = list(PARTS)
    if args.quick:
        vars(args).update(QUICK)
    if args.servers < 1 or args.concurrency < 1 or args.kill_servers < 1:
        parser.error("--servers, --concurrency and --kill-servers must be at least 1")
    if not 0 < args.min_s <= args.max_s or not 0 < args.long_min_s <= args.long_max_s:
        parser.error("need 0 < --min-s <= --max-s and 0 < --long-min-s <= --long-max-s")
    if not 0 <= args.long_servers <= args.servers:
        parser.error(f"--long-servers ({args.long_servers}) must be 0 to --servers "
                     f"({args.servers})")
    if args.sessions < 1 or args.rows < 1 or args.reps < 1:
        parser.error("--sessions, --rows and --reps must be at least 1")
    if set(args.only or DEFAULT_PARTS) & {"servers", "kill"} and not CHP.exists():
        print(f"bench: {CHP} missing; run `npm install` (or `make install`)", file=sys.stderr)
        return 2
    if "cluster" in (args.only or DEFAULT_PARTS) and missing_tools():
        print(f"bench: the cluster part needs {', '.join(missing_tools())}: run `make "
              "cluster-tools` (Go 1.26)", file=sys.stderr)
        return 2
    started = time.monotonic()
    with interrupts_clean_up():
        try:
            figures = run(args)
        except (KeyboardInterrupt, Aborted):
            print("bench: interrupted; hub stopped, databases dropped, temp folders removed",
                  file=sys.stderr)
            return 130
        except NoPostgres as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
    print(f"\n(whole run {time.monotonic() - started:.0f} s)")
    for name, value in figures.items():
        digits = 3 if name.endswith("_s") else 4 if name.endswith("_pct") else 1
        figure(name, value, digits)
        rule = TARGETS.get(name) or (f"<= {args.heartbeat:g}"
                                     if name == "billing_error_after_kill_s" else "")
        if rule:
            target(name, rule)
    return 0


if __name__ == "__main__":
    sys.exit(main())
