"""abuse_detection_recall, abuse_false_positive_rate, abuse_time_to_stop_p95_s: misuse.

    .venv/bin/python bench/misuse.py [--seed 49] [--scale 1] [--scan-s 20] [--quick]

A seeded, simulated week of GPU servers (issue 49) replayed through gpulease's misuse
rules (gpulease/core/policy/misuse: processes, network and stratum, gpu, decision with
the shipped MisusePolicy) the way the hub's scan will feed them:

- every `--scan-s` seconds (one grid for all servers) the scan reads each server's
  processes (a process is seen if it is alive at a scan) and the connections it
  opened since the scan before (reported from a log of new connections, so a short
  one is not missed; its first bytes captured, except CAPTURE_LOSS of them); new
  ones go through the rules and the decision. A stop ends the server STOP_LATENCY_S
  after the scan that decided it;
- the GPU signal is judged at each of the culler's readings (every 60 s): the
  busiest device's utilisation and the last client request the proxy routed.

Classes (`CLASSES`), each a number of servers started uniformly over the week:

  honest:  training (a researcher at the notebook: cells keep the GPU busy, the tab
           open; sometimes away at lunch with a run going), unattended (training
           started from a cell, the researcher gone for hours), inference (a model
           served through the proxy, load by the hour, sometimes a load test run from
           inside with nobody connected), idle (opened, then left; the culler
           suspends it);
  miners:  named (a release binary under its own name, often with a pool URL on its
           command line), renamed (the same binary renamed, a config file, plain
           Stratum), changed_binary (rebuilt: an unknown hash, a neutral name, plain
           Stratum), tls_pool (rebuilt and renamed, Stratum inside TLS: only the
           address list, if its pool is on it, sees it), throttled (rebuilt, renamed,
           plain Stratum, the GPU held at half to stay below the GPU signal).

Honest servers carry confusers at fixed rates: command lines naming "miner" (metric
learning's hard-negative miners, MineRL, a data miner, a grep for "stratum"),
connections to miners' ports that are other software's (Selenium Grid 4444, Flower
5555, a dev server on 3333), ordinary JSON-RPC on plain TCP (a language server, a
JSON login API), Jupyter's messages with Stratum in a cell's code, and executables
whose hash cannot be read. Miners: POOL_LISTED_SHARE of them use a public pool whose
addresses the admin lists (the rest a private proxy or a pool too new to be listed),
RELEASE_LISTED_SHARE of release binaries are a release whose hash is on the list,
and MINER_KEEPS_CLIENT of them keep a client connected so that the GPU signal never
fires.

The classes and every parameter of the week (bench/misuse_week.py: its CAPITALS, the
processes, payloads and lists) were fixed when the benchmark was written, before its first run and
before any rule's threshold was tuned; a later change to them is a new benchmark and
says so in bench/README.md.

Figures: `abuse_detection_recall` is the share of miner servers stopped (suspended or
locked) before they ended, over the classes a process or payload signal can see
(named, renamed, changed_binary, throttled; target >= 0.95); each class's own and
`abuse_detection_recall_all` (tls_pool included) are printed too. The tls_pool class
is visible to no process or payload signal: only an address entry for its pool, or
nothing (its GPU signal only warns). `abuse_false_positive_rate`: stops of honest
servers per honest server-hour (target <= 0.001), overall and per class.
`abuse_time_to_stop_p95_s`: from a miner's start of mining to its server stopped, over
the miners stopped (target <= 60). `abuse_warnings_per_honest_server_hour`: warnings
admins would read about honest servers (the GPU's, a miner's port). The rules' cost:
microseconds per process record and per connection matched.

--quick: a twentieth of the servers (CI: it runs to its end).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from bench.misuse_week import (  # noqa: E402
    HONEST,
    HOUR,
    MINERS,
    READING_S,
    STOP_LATENCY_S,
    VISIBLE,
    Outcome,
    Server,
    network_deny_list,
    process_deny_list,
    servers,
)
from gpulease.core.policy.misuse.decision import (  # noqa: E402
    LOCK,
    WARN,
    MisusePolicy,
    decide,
)
from gpulease.core.policy.misuse.gpu import (  # noqa: E402
    GpuReading,
    GpuRule,
    GpuWatch,
    observe_gpu,
    unattended_gpu,
)
from gpulease.core.policy.misuse.network import (  # noqa: E402
    Connection,
    NetworkDenyList,
    match_connections,
)
from gpulease.core.policy.misuse.processes import (  # noqa: E402
    ProcessDenyList,
    ProcessRecord,
    match_processes,
)

FIGURES = (
    "abuse_detection_recall",
    "abuse_detection_recall_all",
    "abuse_detection_recall_named",
    "abuse_detection_recall_renamed",
    "abuse_detection_recall_changed_binary",
    "abuse_detection_recall_tls_pool",
    "abuse_detection_recall_throttled",
    "abuse_warned_share_tls_pool",
    "abuse_false_positive_rate",
    "abuse_false_positive_rate_training",
    "abuse_false_positive_rate_unattended",
    "abuse_false_positive_rate_inference",
    "abuse_false_positive_rate_idle",
    "abuse_warnings_per_honest_server_hour",
    "abuse_time_to_stop_p50_s",
    "abuse_time_to_stop_p95_s",
    "abuse_time_to_stop_max_s",
    "abuse_time_to_stop_p95_s_named",
    "abuse_time_to_stop_p95_s_renamed",
    "abuse_time_to_stop_p95_s_changed_binary",
    "abuse_time_to_stop_p95_s_tls_pool",
    "abuse_time_to_stop_p95_s_throttled",
    "abuse_mined_gpu_hours",
    "abuse_honest_server_hours",
    "abuse_miner_servers",
    "abuse_process_match_us",
    "abuse_connection_match_us",
)


# --- the replay ----------------------------------------------------------------------------
@dataclass
class Costs:
    processes: int = 0
    process_s: float = 0.0
    connections: int = 0
    connection_s: float = 0.0


def _gpu_percent(s: Server, t: float, rng: random.Random) -> float:
    for t0, t1, lo, hi in reversed(s.gpu):  # a later segment (a load test) wins
        if t0 <= t < t1:
            return rng.uniform(lo, hi)
    return rng.uniform(0.0, 3.0)


def _last_client(s: Server, t: float) -> float | None:
    last = None
    for a, b in s.clients:
        if a <= t < b:
            return t - ((t - a) % 30.0)  # an open tab polls every 30 s at most
        if b <= t:
            last = b if last is None else max(last, b)
    return last


def replay(s: Server, scan_s: float, procs: ProcessDenyList, net: NetworkDenyList,
           policy: MisusePolicy, rule: GpuRule, rng: random.Random, costs: Costs) -> Outcome:
    out = Outcome()
    # What each scan sees first: a process alive at a scan, a connection opened since.
    seen: dict[float, tuple[list[ProcessRecord], list[Connection]]] = defaultdict(
        lambda: ([], []))
    for t0, t1, record in s.procs:
        tick = math.ceil(t0 / scan_s) * scan_s
        if tick < t1 and tick <= s.end:
            seen[tick][0].append(record)
    for conn in s.conns:
        tick = math.ceil(conn.at / scan_s) * scan_s
        if tick <= s.end:
            seen[tick][1].append(conn)
    for tick in sorted(seen):
        records, conns = seen[tick]
        t0 = time.perf_counter()
        signals = match_processes(records, procs, tick)
        t1 = time.perf_counter()
        signals += match_connections(conns, net, tick)
        costs.process_s += t1 - t0
        costs.connection_s += time.perf_counter() - t1
        costs.processes += len(records)
        costs.connections += len(conns)
        if not signals:
            continue
        decision = decide(s.user, "", signals, tick, policy)
        if decision.stops:
            out.stopped_at, out.action, out.kinds = tick + STOP_LATENCY_S, decision.action, \
                decision.kinds
            break
        if decision.action == WARN:
            out.warnings += 1
            out.warn_kinds |= set(decision.kinds)
    # The GPU signal at each of the culler's readings, until the server ended or stopped.
    until = s.end if out.stopped_at is None else out.stopped_at
    watch, firing = GpuWatch(), False
    t = s.start + rng.uniform(0, READING_S)
    while t < until:
        watch = observe_gpu(watch, GpuReading(t, _gpu_percent(s, t, rng)), rule)
        signal = unattended_gpu(watch, _last_client(s, t), s.start, t, rule)
        if signal is not None and not firing:
            decision = decide(s.user, "", [signal], t, policy)
            assert not decision.stops, "the GPU signal alone stopped a server"
            if decision.action == WARN:
                out.warnings += 1
                out.warn_kinds |= set(decision.kinds)
        firing = signal is not None
        t += READING_S
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def run(seed: int, scale: float, scan_s: float) -> dict[str, float]:
    fleet, all_pools = servers(seed, scale)
    procs, net = process_deny_list(), network_deny_list(all_pools)
    policy, rule = MisusePolicy(), GpuRule()
    rng, costs = random.Random(seed + 1), Costs()
    outcomes = [(s, replay(s, scan_s, procs, net, policy, rule, rng, costs)) for s in fleet]

    by_class: dict[str, list[tuple[Server, Outcome]]] = defaultdict(list)
    for s, o in outcomes:
        by_class[s.klass].append((s, o))
    f: dict[str, float] = {}
    print(f"  {'class':<16}{'servers':>8}{'hours':>10}{'stopped':>9}{'locked':>8}"
          f"{'warned':>8}{'ttS p50':>9}{'ttS p95':>9}  signals that stopped")
    stops_all, detected_visible, n_visible, detected_all, n_all = [], 0, 0, 0, 0
    honest_hours, honest_stops, honest_warnings, mined = 0.0, 0, 0, 0.0
    for klass in (*HONEST, *MINERS):
        rows = by_class[klass]
        hours = sum(s.end - s.start for s, _ in rows) / HOUR
        stopped = [(s, o) for s, o in rows if o.stopped_at is not None]
        locked = sum(1 for _, o in rows if o.action == LOCK)
        warned = sum(1 for _, o in rows if o.warnings)
        kinds: dict[str, int] = defaultdict(int)
        for _, o in stopped:
            for k in o.kinds:
                kinds[k] += 1
        times = [o.stopped_at - s.mining_from for s, o in stopped if s.mining_from is not None]
        if klass in HONEST:
            honest_hours += hours
            honest_stops += len(stopped)
            honest_warnings += sum(o.warnings for _, o in rows)
            f[f"abuse_false_positive_rate_{klass}"] = len(stopped) / hours if hours else 0.0
        else:
            recall = len(stopped) / len(rows)
            f[f"abuse_detection_recall_{klass}"] = recall
            f[f"abuse_time_to_stop_p95_s_{klass}"] = _pct(times, 0.95)
            stops_all += times
            detected_all += len(stopped)
            n_all += len(rows)
            if klass in VISIBLE:
                detected_visible += len(stopped)
                n_visible += len(rows)
            if klass == "tls_pool":
                f["abuse_warned_share_tls_pool"] = sum(
                    1 for _, o in rows if o.warnings or o.stopped_at is not None) / len(rows)
            mined += sum(((o.stopped_at or s.end) - s.mining_from) / HOUR for s, o in rows
                         if s.mining_from is not None and (o.stopped_at or s.end) > s.mining_from)
        said = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        print(f"  {klass:<16}{len(rows):>8}{hours:>10.1f}{len(stopped):>9}{locked:>8}"
              f"{warned:>8}{_pct(times, 0.5):>9.1f}{_pct(times, 0.95):>9.1f}  {said}")
    f["abuse_detection_recall"] = detected_visible / n_visible
    f["abuse_detection_recall_all"] = detected_all / n_all
    f["abuse_false_positive_rate"] = honest_stops / honest_hours
    f["abuse_warnings_per_honest_server_hour"] = honest_warnings / honest_hours
    f["abuse_time_to_stop_p50_s"] = _pct(stops_all, 0.5)
    f["abuse_time_to_stop_p95_s"] = _pct(stops_all, 0.95)
    f["abuse_time_to_stop_max_s"] = max(stops_all) if stops_all else float("nan")
    f["abuse_mined_gpu_hours"] = mined
    f["abuse_honest_server_hours"] = honest_hours
    f["abuse_miner_servers"] = n_all
    f["abuse_process_match_us"] = 1e6 * costs.process_s / max(1, costs.processes)
    f["abuse_connection_match_us"] = 1e6 * costs.connection_s / max(1, costs.connections)
    print("  honest warnings by signal: " + ", ".join(
        f"{k} {sum(1 for s, o in outcomes if s.klass in HONEST and k in o.warn_kinds)}"
        for k in sorted({k for s, o in outcomes if s.klass in HONEST for k in o.warn_kinds})))
    print(f"  lists: {len(procs.entries)} process entries, {len(net.entries)} network entries;"
          f" {costs.processes} process records and {costs.connections} connections matched")
    return f


DIGITS = {"abuse_false_positive_rate": 5, "abuse_warnings_per_honest_server_hour": 4,
          "abuse_time_to_stop_p50_s": 1, "abuse_time_to_stop_p95_s": 1,
          "abuse_time_to_stop_max_s": 1, "abuse_mined_gpu_hours": 1,
          "abuse_honest_server_hours": 1, "abuse_miner_servers": 0,
          "abuse_process_match_us": 2, "abuse_connection_match_us": 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--scale", type=float, default=1.0, help="servers: CLASSES x this")
    parser.add_argument("--scan-s", type=float, default=20.0,
                        help="seconds between two scans of a server")
    parser.add_argument("--quick", action="store_true", help="a twentieth of the servers (CI)")
    args = parser.parse_args()
    scale = args.scale / 20 if args.quick else args.scale
    began = time.perf_counter()
    print(f"misuse: a simulated week, seed {args.seed}, scale {scale}, a scan every "
          f"{args.scan_s:g} s, stop latency {STOP_LATENCY_S:g} s")
    figures = run(args.seed, scale, args.scan_s)
    print(f"  ({time.perf_counter() - began:.1f} s)")
    for name in FIGURES:
        value = figures[name]
        digits = DIGITS.get(name, 1 if name.startswith("abuse_time_to_stop") else
                            5 if name.startswith("abuse_false_positive_rate") else 3)
        figure(name, value, digits)
    target("abuse_detection_recall", ">= 0.95")
    target("abuse_false_positive_rate", "<= 0.001")
    target("abuse_time_to_stop_p95_s", "<= 60")


if __name__ == "__main__":
    main()
