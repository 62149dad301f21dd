"""The spawn page at scale: 100 profiles and 1,000 GPUs in inventory.

A real `gpulease up` (tests/support/hubproc.py's HubProcess) with a declared inventory of
1,000 GPUs (125 nodes of 8 H200s: half cut into seven 1g.18gb MIG slices,
half whole) and 100 profiles (MIG slices, whole cards, CPU only; some limited
to a group). A researcher logged in through the real login form loads
`/hub/spawn`, the page with the profile cards, their availability and the
balance; the server time of each request is read from the hub's own request
log (`200 GET /hub/spawn (...) 12.34ms`), so the network and the client do
not count. `/hub/home` of the same hub is timed side by side as the stock
page it is compared with.

    .venv/bin/python bench/pages.py [--requests 40] [--quick]

--quick: 3 requests of each page (CI: it runs to its end).

The last lines are `name: value`, one per figure.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from tests.support.hubproc import HubProcess  # noqa: E402

NODES, GPUS_PER_NODE = 125, 8
PROFILES = 100
RESEARCHER, PASSWORD = "ada", "bench-password-1"


def inventory() -> dict:
    nodes = []
    for n in range(NODES):
        gpus = []
        for g in range(GPUS_PER_NODE):
            gpu = {"model": "H200", "memory": "141Gi"}
            if g % 2 == 0:
                gpu["mig"] = ["1g.18gb"] * 7
            gpus.append(gpu)
        nodes.append({"name": f"node{n:03d}", "gpus": gpus})
    return {"nodes": nodes}


def profiles() -> dict:
    out = []
    for i in range(PROFILES):
        kind = i % 4
        p = {
            "slug": f"p{i:03d}",
            "display_name": f"Profile {i} <b>escaped</b>",
            "description": "A profile of the benchmark",
            "cpu": 2 + kind,
            "memory": f"{8 * (kind + 1)}Gi",
            "images": ["pytorch", "cuda"],
            "price_per_hour": f"{0.1 + i / 100:.2f}",
            "min_run": "10m",
            "idle_timeout": "30m",
            "max_runtime": 0,
            "groups": ["vision"] if i % 10 == 9 else [],
            "enabled": True,
        }
        if kind == 1:
            p["gpu"] = {"model": "H200", "mig": "1g.18gb"}
        elif kind == 2:
            p["gpu"] = {"model": "H200", "count": 1}
        elif kind == 3:
            p["gpu"] = {"model": "H200", "count": 2}
        out.append(p)
    return {"profiles": out}


TIMING = re.compile(r"200 GET (/hub/spawn|/hub/home)\S* \(" + RESEARCHER + r"@[^)]*\) ([\d.]+)ms")


def server_times(log: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"/hub/spawn": [], "/hub/home": []}
    for path, ms in TIMING.findall(log):
        times[path].append(float(ms))
    return times


FIGURES = ("spawn_page_ms", "spawn_page_vs_home_ratio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="3 requests of each page (CI)")
    args = parser.parse_args()
    if args.quick:
        args.requests = 3
    with tempfile.TemporaryDirectory(prefix="gpulease-bench-pages-") as tmp:
        root = Path(tmp)
        inv, prof = root / "inventory.yaml", root / "profiles.yaml"
        inv.write_text(yaml.safe_dump(inventory()))
        prof.write_text(yaml.safe_dump(profiles()))
        hub = HubProcess(root / "state", extra_args=[
            f"--inventory={inv}", f"--profiles={prof}",
            "--JupyterHub.log_level=INFO", "--Application.log_level=INFO",
        ])
        hub.start(timeout=120)
        try:
            admin = hub.token_for("admin", hub.admin_password)
            r = hub.service("POST", "api/users", admin,
                            {"name": RESEARCHER, "password": PASSWORD, "admin": False})
            r.raise_for_status()
            hub.grant(admin, f"user:{RESEARCHER}", "250")
            browser = hub.login_form(RESEARCHER, PASSWORD)
            for _ in range(3):  # warm: templates compiled, connections open
                browser.get(f"{hub.url}/hub/spawn", timeout=60).raise_for_status()
                browser.get(f"{hub.url}/hub/home", timeout=60).raise_for_status()
            skip = server_times(hub.log())
            page = ""
            for _ in range(args.requests):  # interleaved, side by side
                resp = browser.get(f"{hub.url}/hub/spawn", timeout=60)
                resp.raise_for_status()
                page = resp.text
                browser.get(f"{hub.url}/hub/home", timeout=60).raise_for_status()
            # The hub logs a request once it has answered it: the last line may come a
            # moment after the client has its answer.
            deadline = time.monotonic() + 10
            while True:
                times = server_times(hub.log())
                if all(len(times[p]) - len(skip[p]) >= args.requests for p in times) \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            hub.close()
    spawn = times["/hub/spawn"][len(skip["/hub/spawn"]):]
    home = times["/hub/home"][len(skip["/hub/home"]):]
    if len(spawn) < args.requests or len(home) < args.requests:
        sys.exit(f"the hub log lacks request timings ({len(spawn)}, {len(home)})")
    cards = page.count('name="profile"')
    print(f"inventory: {NODES * GPUS_PER_NODE} GPUs "
          f"({NODES * GPUS_PER_NODE // 2 * 7} MIG slices + {NODES * GPUS_PER_NODE // 2} "
          f"whole), {PROFILES} profiles, {cards} cards shown to {RESEARCHER}")
    print(f"/hub/spawn server time: median {statistics.median(spawn):.1f} ms, "
          f"p95 {sorted(spawn)[int(0.95 * len(spawn)) - 1]:.1f} ms over {len(spawn)}")
    print(f"/hub/home server time: median {statistics.median(home):.1f} ms")
    figure("spawn_page_ms", statistics.median(spawn), 1)
    target("spawn_page_ms", "< 200")
    figure("spawn_page_vs_home_ratio", statistics.median(spawn) / statistics.median(home), 2)


if __name__ == "__main__":
    main()
