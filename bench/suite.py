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

from bench.figures import declared, malformed, read  # noqa: E402

QUICK_LIMIT_S = 900  # a quick run that takes longer is stuck: stopped and reported


@dataclass(frozen=True)
class Benchmark:
    name: str  # bench/NAME.py
    full: tuple[str, ...] = ()  # make bench's arguments
    quick: tuple[str, ...] = ("--quick",)  # CI's

    @property
    def script(self) -> Path:
        return BENCH / f"{self.name}.py"


BENCHMARKS = (
    Benchmark("spawn", ("--spawns", "20"), ("--spawns", "2", "--warmup", "0")),
    Benchmark("billing", ("--all",), ("--all", "--quick")),
    Benchmark("culler"),
    Benchmark("pages"),
    Benchmark("login_flood"),
    Benchmark("cluster_placement"),
    Benchmark("kube_spawn"),
    Benchmark("placement"),
    Benchmark("placement_real"),
    Benchmark("tiers"),
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
    figure lines with something after the value."""
    names = declared(benchmark.script)
    problems = [f"exit status {returncode}"] if returncode else []
    printed = read(output)
    missing = [n for n in names if n not in printed]
    if missing:
        problems.append("figures not printed: " + ", ".join(missing))
    bad = malformed(output, names)
    if bad:
        problems.append("not `name: value` lines: " + " | ".join(bad))
    return problems


def stop_group(proc: subprocess.Popen) -> None:
    """Ctrl-C for the run's whole session (the benchmarks clean up on it), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_one(benchmark: Benchmark, quick: bool) -> Outcome:
    args = benchmark.quick if quick else benchmark.full
    print(f"\n=== bench/{benchmark.name}.py {' '.join(args)}".rstrip(), flush=True)
    began = time.monotonic()
    # A session of its own: a stuck run is ended with everything it started.
    proc = subprocess.Popen([sys.executable, str(benchmark.script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=BENCH.parent,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    watchdog = threading.Timer(QUICK_LIMIT_S, stop_group, (proc,))
    if quick:
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
    seconds = time.monotonic() - began
    problems = judge(benchmark, proc.returncode, "".join(lines))
    if quick and seconds >= QUICK_LIMIT_S:
        problems.insert(0, f"still running after {QUICK_LIMIT_S} s: stopped")
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
    began = time.monotonic()
    outcomes = [run_one(b, args.quick) for b in chosen]
    print(f"\n=== {'quick ' if args.quick else ''}benchmarks: {len(outcomes)} in "
          f"{time.monotonic() - began:.0f} s")
    for outcome in outcomes:
        print(outcome.line())
    return 1 if any(o.problems for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
