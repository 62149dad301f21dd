"""The hub's API while wrong-password logins flood its login form.

A real `gpulease up` (tests/support/hubproc.py's HubProcess). One prober sends
`GET /hub/api/user` with a token through the proxy, one request every 50 ms,
and times each; 50 flooders, each from its own loopback address (127.0.0.10
to .59: all of 127.0.0.0/8 is this machine on Linux), post wrong passwords
for existing users to `/hub/login` back to back, 50 at once, for 30 s. The
prober runs quiet (no flood) before and after the flood, on the same hub, so
the ratio is measured side by side.

Three hubs, one after the other:

- `shipped`: the shipped throttle. Each flooder's address is locked out after
  5 failures (250 argon2 checks in all), then the flood is refusals, each
  held a second before it is answered;
- `hashing`: `max_failures` so high that nothing locks: every try is an
  argon2 check, as from a botnet of ever new addresses. What keeps the API
  answering then is the login pool: few threads of its own, at a lower CPU
  priority than the hub's;
- `refusing`: `max_failures` = 1: after one check per address, every try is
  a refusal.

    .venv/bin/python bench/login_flood.py [--only shipped|hashing|refusing]
                                          [--flood-s 30] [--quiet-s 30] [--logs DIR]
                                          [--hub-arg=--LocalAccountsAuthenticator.X=Y ...]

The last lines are `name: value`, one per figure.
"""

from __future__ import annotations

import argparse
import http.client
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from bench.procs import Children, interrupts_clean_up, save_logs  # noqa: E402
from tests.support.hubproc import HubProcess  # noqa: E402

FLOODERS = 50
TARGETS = [f"target{i}" for i in range(10)]  # existing users whose passwords are sprayed
PROBE_USER, PROBE_PASSWORD = "probe", "probe-password-1"
PROBE_INTERVAL_S = 0.05


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, int(0.95 * len(ordered)) - 1)]


class Flooder(threading.Thread):
    """Wrong-password logins through the real login form, one at a time, from `source`."""

    def __init__(self, port: int, source: str, users: list[str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.source, self.users, self.stop = port, source, users, stop
        self.answers: dict[int, int] = {}
        self.errors = 0

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60,
                                          source_address=(self.source, 0))

    def _form(self, conn: http.client.HTTPConnection) -> tuple[str, str]:
        conn.request("GET", "/hub/login")
        page = conn.getresponse()
        text = page.read().decode()
        cookies = "; ".join(c.split(";", 1)[0] for c in page.headers.get_all("Set-Cookie") or [])
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', text)
        return cookies, xsrf.group(1) if xsrf else ""

    def run(self) -> None:
        conn = self._connection()
        cookies, xsrf = self._form(conn)
        i = 0
        while not self.stop.is_set():
            user = self.users[i % len(self.users)]
            i += 1
            body = urllib.parse.urlencode(
                {"_xsrf": xsrf, "username": user, "password": f"wrong-guess-{i}"})
            try:
                conn.request("POST", "/hub/login", body, {
                    "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookies})
                answer = conn.getresponse()
                answer.read()
                self.answers[answer.status] = self.answers.get(answer.status, 0) + 1
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
                conn = self._connection()


class Prober(threading.Thread):
    """An authenticated API request every PROBE_INTERVAL_S, timed, tagged with the phase."""

    def __init__(self, port: int, token: str) -> None:
        super().__init__(daemon=True)
        self.port, self.token = port, token
        self.phase = "warmup"
        self.samples: dict[str, list[float]] = {}
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = {"Authorization": f"token {self.token}"}
        next_at = time.monotonic()
        while not self.stop.is_set():
            phase = self.phase
            started = time.monotonic()
            try:
                conn.request("GET", "/hub/api/user", headers=headers)
                answer = conn.getresponse()
                answer.read()
                ok = answer.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            elapsed = time.monotonic() - started
            if ok:
                self.samples.setdefault(phase, []).append(elapsed * 1000)
            else:
                self.failures += 1
            next_at += PROBE_INTERVAL_S
            time.sleep(max(0.0, next_at - time.monotonic()))


def run_mode(mode: str, root: Path, flood_s: float, quiet_s: float, hub_args: list[str]) -> dict:
    extra = ["--JupyterHub.log_level=INFO", *hub_args]
    if mode == "hashing":
        extra.append("--LocalAccountsAuthenticator.max_failures=1000000000")
    if mode == "refusing":
        extra.append("--LocalAccountsAuthenticator.max_failures=1")
    hub = HubProcess(root / mode / "state", extra_args=extra)
    (root / mode).mkdir(parents=True)
    children = Children()
    hub.start(timeout=120)
    children.note(hub.proc.pid)
    try:
        admin = hub.token_for("admin", hub.admin_password)
        for name in [*TARGETS, PROBE_USER]:
            password = PROBE_PASSWORD if name == PROBE_USER else f"{name}-password-1"
            r = hub.service("POST", "api/users", admin, {"name": name, "password": password})
            r.raise_for_status()
        token = hub.token_for(PROBE_USER, PROBE_PASSWORD)
        prober = Prober(hub.port, token)
        prober.start()
        time.sleep(2)  # connections open, handlers warm
        prober.phase = "quiet"
        time.sleep(quiet_s / 2)
        stop = threading.Event()
        flooders = [Flooder(hub.port, f"127.0.0.{10 + i}", TARGETS, stop)
                    for i in range(FLOODERS)]
        prober.phase = "flood"
        flood_started = time.monotonic()
        for f in flooders:
            f.start()
        time.sleep(flood_s)
        stop.set()
        for f in flooders:
            f.join(90)
        flood_took = time.monotonic() - flood_started
        prober.phase = "drain"
        time.sleep(1)
        prober.phase = "quiet"
        time.sleep(quiet_s / 2)
        prober.stop.set()
        prober.join(30)
        log = hub.log()
    finally:
        hub.close()
        children.reap()
    answers: dict[int, int] = {}
    for f in flooders:
        for status, n in f.answers.items():
            answers[status] = answers.get(status, 0) + n
    return {
        "quiet": prober.samples.get("quiet", []),
        "flood": prober.samples.get("flood", []),
        "probe_failures": prober.failures,
        "answers": answers,
        "errors": sum(f.errors for f in flooders),
        "flood_s": flood_took,
        "hashed": log.count("Failed login for user 'target"),
        "refused": log.count("refused: locked out"),
    }


FIGURES = ("login_flood_p95_quiet_ms", "login_flood_p95_flood_ms", "login_flood_latency_ratio",
           "login_flood_p95_quiet_ms_hashing", "login_flood_p95_flood_ms_hashing",
           "login_flood_latency_ratio_hashing", "login_flood_p95_quiet_ms_refusing",
           "login_flood_p95_flood_ms_refusing", "login_flood_latency_ratio_refusing")
QUICK = {"flood_s": 3.0, "quiet_s": 4.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["shipped", "hashing", "refusing"])
    parser.add_argument("--flood-s", type=float, default=30)
    parser.add_argument("--quiet-s", type=float, default=30,
                        help="probing without the flood, half before it, half after")
    parser.add_argument("--logs", type=Path, help="keep the hubs' logs here")
    parser.add_argument("--hub-arg", action="append", default=[],
                        help="passed to `gpulease up`, e.g. "
                             "--hub-arg=--LocalAccountsAuthenticator.login_threads=1")
    parser.add_argument("--quick", action="store_true", help="short windows (CI): " + ", ".join(
        f"--{k.replace('_', '-')} {v:g}" for k, v in QUICK.items()))
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    modes = [args.only] if args.only else ["shipped", "hashing", "refusing"]
    figures: dict[str, tuple[float, int]] = {}
    with interrupts_clean_up(), tempfile.TemporaryDirectory(prefix="gpulease-bench-flood-") as tmp:
        root = Path(tmp)
        try:
            for mode in modes:
                r = run_mode(mode, root, args.flood_s, args.quiet_s, args.hub_arg)
                quiet, flood = r["quiet"], r["flood"]
                if len(quiet) < 20 or len(flood) < 20:
                    sys.exit(f"{mode}: too few probes ({len(quiet)} quiet, {len(flood)} flood)")
                tries = sum(r["answers"].values())
                print(f"{mode}: {FLOODERS} flooders, {tries} logins in {r['flood_s']:.1f} s "
                      f"({tries / r['flood_s']:.0f}/s; answers {r['answers']}, "
                      f"{r['errors']} errors); {r['hashed']} passwords checked, "
                      f"{r['refused']} refused while locked out", flush=True)
                print(f"{mode}: GET /hub/api/user quiet p50 {statistics.median(quiet):.1f} ms "
                      f"p95 {p95(quiet):.1f} ms ({len(quiet)}); flood p50 "
                      f"{statistics.median(flood):.1f} ms p95 {p95(flood):.1f} ms "
                      f"({len(flood)}); {r['probe_failures']} failed", flush=True)
                suffix = "" if mode == "shipped" else f"_{mode}"
                figures[f"login_flood_p95_quiet_ms{suffix}"] = (p95(quiet), 1)
                figures[f"login_flood_p95_flood_ms{suffix}"] = (p95(flood), 1)
                figures[f"login_flood_latency_ratio{suffix}"] = (p95(flood) / p95(quiet), 2)
        finally:
            if args.logs:
                save_logs(root, args.logs, *modes)
    for name, (value, digits) in figures.items():
        figure(name, value, digits)
        if name == "login_flood_latency_ratio":
            target(name, "<= 2")


if __name__ == "__main__":
    main()
