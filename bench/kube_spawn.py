"""kube_spawn_ratio: spawn-to-ready of `gpulease up` in the cluster shape over stock KubeSpawner.

    .venv/bin/python bench/kube_spawn.py [--spawns 5] [--quick] [--logs DIR]

One real control plane (tests/cluster/controlplane.py: etcd, kube-apiserver,
controller-manager, scheduler, kwok; the kubelet emulated), one pool of one
emulated H200 node split into 1g.18gb slices, and two hubs, each with the
real proxy and a namespace and ServiceAccount of its own:

  stock     a plain `jupyterhub` with kubespawner's KubeSpawner asking for one
            nvidia.com/mig-1g.18gb (z2jh's hub Role)
  gpulease  `gpulease up --GPULeaseHub.shape=cluster` as an operator runs it
            (tests/cluster/test_gpulease_up_cluster.py cluster_hub_at: z2jh's
            hub Role and the inventory's ClusterRole): GPUKubeSpawner starting
            the `slice` profile through gpulease's options, rights and credit
            checks, the cluster admission (ClusterWatch over nodes and pods),
            metering, the gpulease service, and the idle culler on, as by
            default; heartbeat and poll intervals as shipped

Both pods select the same pool and run the same server script
(gpulease-singleuser) from the same image stand-in (the catalog's pytorch
image, mapped to this environment). Each spawn is timed from the REST start
until the hub reports the server ready; spawns alternate (stock, gpulease,
...) so that drift on a shared machine hits both alike, and each server is
stopped (its pod gone) before the next. One untimed warm-up spawn each
first (gpulease's is its first admission: the watches' first lists); its
time is printed apart. The target is a ratio of medians of at most 1.05.
Needs `make cluster-tools` (Go).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import figure, target  # noqa: E402
from gpulease.images import shipped_catalog  # noqa: E402
from gpulease.singleuser import SERVER_SCRIPT  # noqa: E402
from tests.cluster.conftest import POD_UID, POOL_LABEL, ControlPlane  # noqa: E402
from tests.cluster.controlplane import attach, detach, missing_tools  # noqa: E402
from tests.cluster.kube import Kube, KubeError, pods_path  # noqa: E402
from tests.cluster.nodes import GpuNode, node_object  # noqa: E402
from tests.cluster.test_gpulease_up_cluster import PW, cluster_hub_at, start  # noqa: E402
from tests.cluster.test_kubespawner import (  # noqa: E402
    HUB_CONFIG,
    StockHub,
    home_volume,
    hub_kubeconfig,
)
from tests.support.isolation_env import hub_python  # noqa: E402

PROFILE = "slice"  # tests/cluster/test_gpulease_up_cluster.py PROFILES: one 1g.18gb slice
IMAGE = "pytorch"  # the profile's image, whose stand-in the stock pods run too
_SELECTOR = "c.KubeSpawner.node_selector = {{{pool!r}: {namespace!r}}}"
assert _SELECTOR in HUB_CONFIG, "tests/cluster/test_kubespawner.py HUB_CONFIG changed"
# The stock hub: the same server script as gpulease's pods, on the shared pool's nodes.
STOCK_CONFIG = HUB_CONFIG.replace('["jupyterhub-singleuser"]', f'["{SERVER_SCRIPT}"]').replace(
    _SELECTOR, "c.KubeSpawner.node_selector = {{{pool!r}: {pool_name!r}}}")

Api = Callable[[str, str], requests.Response]  # (method, path under /hub/api/) -> answer


def namespace_of(kube: Kube, name: str) -> None:
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    kube.wait_for(f"the default ServiceAccount of {name}",
                  lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"))


def pool_node(kube: Kube, pool: str) -> None:
    node = node_object(GpuNode(f"{pool}-h200", mig={"1g.18gb": 7}))
    node["metadata"]["labels"][POOL_LABEL] = pool
    kube.create("/api/v1/nodes", node)
    kube.wait_for(f"node {pool}-h200 Ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in kube.get(f"/api/v1/nodes/{pool}-h200")["status"].get("conditions", [])))


def spawn_to_ready(begin: Callable[[], requests.Response], api: Api, kube: Kube,
                   namespace: str, tail: Callable[[], str]) -> float:
    """Seconds from the REST start until the hub says ready; then stopped, pod gone."""
    t0 = time.perf_counter()
    answer = begin()
    if answer.status_code not in (201, 202):
        raise RuntimeError(f"start refused: {answer.status_code} {answer.text}\n{tail()}")
    deadline = time.monotonic() + 120
    while not api("GET", "users/alice").json()["servers"].get("", {}).get("ready"):
        if time.monotonic() > deadline:
            raise TimeoutError(tail())
        time.sleep(0.05)
    took = time.perf_counter() - t0
    api("DELETE", "users/alice/server")
    deadline = time.monotonic() + 60
    while True:
        try:
            kube.get(pods_path(namespace, "jupyter-alice"))
        except KubeError as e:
            if e.status == 404 and not api("GET", "users/alice").json()["servers"]:
                return took
        if time.monotonic() > deadline:
            raise TimeoutError(tail())
        time.sleep(0.1)


FIGURES = ("kube_spawn_n", "stock_kube_spawn_s", "gpulease_kube_spawn_s", "kube_spawn_ratio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=5, help="timed spawns per hub")
    parser.add_argument("--quick", action="store_true", help="3 timed spawns per hub")
    parser.add_argument("--logs", type=Path, help="keep both hubs' logs in this folder")
    args = parser.parse_args()
    spawns = 3 if args.quick else args.spawns
    if missing_tools():
        sys.exit(f"needs {', '.join(missing_tools())}: run `make cluster-tools` (Go 1.26)")
    work = Path(tempfile.mkdtemp(prefix="gpulease-kube-bench-"))
    root = Path(tempfile.gettempdir()) / f"gpulease-cluster-bench-{uuid.uuid4().hex[:6]}"
    logs: dict[str, Path] = {}
    try:
        with ExitStack() as hubs:
            plane = ControlPlane(attach(root))
            ours = str(Path(hub_python()[0]).parent.parent)
            image = {e.name: e for e in shipped_catalog().images}[IMAGE]
            for entry in shipped_catalog().images:
                plane.map_image(entry.image, entry.local_env or ours)
            kube = plane.admin()
            tag = uuid.uuid4().hex[:4]
            pool = f"bench-pool-{tag}"
            pool_node(kube, pool)
            runs: dict[str, tuple] = {}

            namespace = f"bench-stock-{tag}"
            namespace_of(kube, namespace)
            folder = work / "stock"
            folder.mkdir()
            storage_class, _home = home_volume(kube, plane, namespace)
            stock = StockHub(folder, hub_kubeconfig(kube, plane, namespace, folder),
                             template=STOCK_CONFIG, namespace=namespace, image=image.image,
                             uid=POD_UID, pool=POOL_LABEL, pool_name=pool,
                             storage_class=storage_class)
            hubs.callback(stock.stop)
            logs["stock"] = folder / "hub.log"
            stock.api("POST", "/users/alice")

            def stock_api(method: str, path: str) -> requests.Response:
                return stock.api(method, f"/{path}")
            runs["stock"] = (lambda: stock_api("POST", "users/alice/server"), stock_api,
                             namespace, stock.tail, [])

            namespace = f"bench-gpulease-{tag}"
            namespace_of(kube, namespace)
            folder = work / "gpulease"
            folder.mkdir()
            ours_hub = hubs.enter_context(cluster_hub_at(plane, kube, namespace, folder,
                                                         pool=pool))
            logs["gpulease"] = ours_hub.log_path
            alice = ours_hub.add_user(ours_hub.token_for("admin", PW), "alice", "1000")

            def ours_api(method: str, path: str) -> requests.Response:
                return ours_hub.api(method, path, alice)
            runs["gpulease"] = (lambda: start(ours_hub, "alice", alice, PROFILE), ours_api,
                                namespace, lambda: ours_hub.log()[-4000:], [])

            first = {shape: spawn_to_ready(begin, api, kube, namespace, tail)  # warm-up
                     for shape, (begin, api, namespace, tail, _) in runs.items()}
            for _ in range(spawns):
                for begin, api, namespace, tail, times in runs.values():
                    times.append(spawn_to_ready(begin, api, kube, namespace, tail))
            medians = {shape: statistics.median(run[4]) for shape, run in runs.items()}
            for shape, run in runs.items():
                times = run[4]
                print(f"{shape}: median {medians[shape]:.2f} s over {len(times)} "
                      f"({', '.join(f'{t:.2f}' for t in times)}); warm-up {first[shape]:.2f} s")
            figure("kube_spawn_n", spawns, 0)
            figure("stock_kube_spawn_s", medians["stock"], 2)
            figure("gpulease_kube_spawn_s", medians["gpulease"], 2)
            figure("kube_spawn_ratio", medians["gpulease"] / medians["stock"])
            target("kube_spawn_ratio", "<= 1.05")
    finally:
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for shape, path in logs.items():
                if path.exists():
                    shutil.copy(path, args.logs / f"{shape}-hub.log")
        detach(root)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
