"""Every benchmark, one after another: `make bench` (full) and `make bench-quick` (CI).

    .venv/bin/python bench/suite.py [--quick] [--only NAME ...] [--list]

Each benchmark runs as its own program (bench/NAME.py) with the arguments below,
its output shown as it comes. A run is good when the program exits 0 and printed
every figure its FIGURES names as a `name: value` line (bench/figures.py); values
are not judged. The quick mode (small counts, short windows) only checks that each
benchmark still runs to its end and prints what it names, so that none rots
unseen; CI runs it after the tests. The billing benchmark brings its own
PostgreSQL (bench/postgres.py) unless GPULEASE_TEST_POSTGRES_URL names one; the
cluster ones need `make cluster-tools`, which `make bench` builds first.

At the end: one line per benchmark (good, or what was wrong), and the exit status
is 1 when any was not good.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.figures import declared, figure_lines, malformed  # noqa: E402
from bench.postgres import given_url, server_binaries  # noqa: E402
from tests.cluster.controlplane import missing_tools  # noqa: E402

# A run that takes longer is stuck: stopped (with all it started) and reported. The
# full runs take 1-15 minutes each on 2 cores, the quick ones under 2.
LIMIT_S = {False: 3600, True: 600}


@dataclass(frozen=True)
class Benchmark:
    name: str  # bench/NAME.py
    full: tuple[str, ...] = ()  # make bench's arguments
    quick: tuple[str, ...] = ("--quick",)  # CI's
    cluster: bool = False  # needs the cluster tools (make cluster-tools)
    postgres: bool = False  # needs a PostgreSQL (its own, if none is named)

    @property
    def script(self) -> Path:
        return BENCH / f"{self.name}.py"


BENCHMARKS = (
    Benchmark("spawn", ("--spawns", "20"), ("--spawns", "2", "--warmup", "0")),
    Benchmark("billing", ("--all",), ("--all", "--quick"), cluster=True, postgres=True),
    Benchmark("culler"),
    Benchmark("pages"),
    Benchmark("login_flood"),
    Benchmark("cluster_placement"),
    Benchmark("kube_spawn", cluster=True),
    Benchmark("placement"),
    Benchmark("placement_real", cluster=True),
    Benchmark("tiers"),
    Benchmark("dynamic_mig", cluster=True),
    Benchmark("misuse"),
)
# Scripts that also run alone but are parts of a benchmark above (bench/billing.py
# --only cluster runs bench/billing_cluster.py's measurement).
PARTS = {"billing_cluster": "billing"}


@dataclass
class Outcome:
    benchmark: Benchmark
    seconds: float
    problems: list[str]

    def line(self) -> str:
        said = "; ".join(self.problems) if self.problems else "good"
        return f"bench/{self.benchmark.name}.py ({self.seconds:.0f} s): {said}"


def judge(benchmark: Benchmark, returncode: int, output: str) -> list[str]:
    """What was wrong with a run: its exit status, figures it named but did not print,
    figure lines with something after the value, a figure printed twice, a figure line
    of a name it does not declare."""
    names = declared(benchmark.script)
    problems = [f"exit status {returncode}"] if returncode else []
    printed = [name for name, _ in figure_lines(output)]
    missing = [n for n in names if n not in printed]
    if missing:
        problems.append("figures not printed: " + ", ".join(missing))
    bad = malformed(output, names)
    if bad:
        problems.append("not `name: value` lines: " + " | ".join(bad))
    twice = sorted({n for n in printed if printed.count(n) > 1})
    if twice:
        problems.append("printed more than once: " + ", ".join(twice))
    undeclared = sorted(set(printed) - set(names))
    if undeclared:
        problems.append("figure lines not in its FIGURES: " + ", ".join(undeclared))
    return problems


def missing_parts(chosen: list[Benchmark]) -> list[str]:
    """What the chosen benchmarks need and this machine lacks, said before an hour of
    runs rather than after."""
    said = []
    cluster = [b.name for b in chosen if b.cluster]
    if cluster and missing_tools():
        said.append(f"{', '.join(cluster)} need {', '.join(missing_tools())}: run `make "
                    "cluster-tools` (Go 1.26)")
    if any(b.postgres for b in chosen) and not given_url(None) and not server_binaries():
        said.append("billing needs a PostgreSQL: set GPULEASE_TEST_POSTGRES_URL, or install "
                    "the server binaries (apt-get install postgresql) for a private one")
    return said


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Signal the run's whole session, if anything of it is left."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen) -> None:
    """Ctrl-C for the run's whole session (the benchmarks clean up on it), then SIGKILL."""
    signal_group(proc, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)


def run_one(benchmark: Benchmark, quick: bool) -> Outcome:
    args = benchmark.quick if quick else benchmark.full
    print(f"\n=== bench/{benchmark.name}.py {' '.join(args)}".rstrip(), flush=True)
    began = time.monotonic()
    # A session of its own: a stuck run is ended with everything it started.
    proc = subprocess.Popen([sys.executable, str(benchmark.script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=BENCH.parent,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    limit_s = LIMIT_S[quick]
    watchdog = threading.Timer(limit_s, stop_group, (proc,))
    watchdog.start()
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        proc.wait()
    except KeyboardInterrupt:
        stop_group(proc)
        raise
    finally:
        watchdog.cancel()
        # Each benchmark cleans up after itself; this is the backstop, so that one
        # benchmark's leftovers never load the next.
        signal_group(proc, signal.SIGKILL)
    seconds = time.monotonic() - began
    problems = judge(benchmark, proc.returncode, "".join(lines))
    if seconds >= limit_s:
        problems.insert(0, f"still running after {limit_s} s: stopped")
    return Outcome(benchmark, seconds, problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="each benchmark's quick mode: it runs to its end (CI)")
    parser.add_argument("--only", action="append", choices=[b.name for b in BENCHMARKS],
                        help="run this benchmark only (repeatable)")
    parser.add_argument("--list", action="store_true",
                        help="name each benchmark, its arguments and figures; run nothing")
    args = parser.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    if args.list:
        for b in chosen:
            print(f"bench/{b.name}.py  full: {' '.join(b.full) or '(defaults)'}  quick: "
                  f"{' '.join(b.quick)}\n  figures: {', '.join(declared(b.script))}")
        return 0
    lacking = missing_parts(chosen)
    if lacking:
        print("bench: nothing run; this machine lacks what they need:\n  " + "\n  ".join(lacking),
              file=sys.stderr)
        return 2
    began = time.monotonic()
    outcomes = [run_one(b, args.quick) for b in chosen]
    print(f"\n=== {'quick ' if args.quick else ''}benchmarks: {len(outcomes)} in "
          f"{time.monotonic() - began:.0f} s")
    for outcome in outcomes:
        print(outcome.line())
    return 1 if any(o.problems for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
