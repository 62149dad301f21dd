"""kube_spawn_ratio: spawn-to-ready of GPUKubeSpawner over stock KubeSpawner, side by side.

    .venv/bin/python bench/kube_spawn.py [--spawns 5]

One real control plane (tests/cluster/controlplane.py: etcd, kube-apiserver,
controller-manager, scheduler, kwok; the kubelet emulated) and two
`jupyterhub` processes, each with the real proxy, a ServiceAccount holding
only Zero to JupyterHub's hub Role, its own namespace and an emulated H200
node split into 1g.18gb slices:

  stock     kubespawner's KubeSpawner asking for one nvidia.com/mig-1g.18gb
  gpulease  GPUKubeSpawner starting the h200-1g profile: gpulease's options,
            rights and credit checks, then the same slice

Both run the same server script (gpulease-singleuser) from the same local
environment. Each spawn is timed from the REST start until the hub reports
the server ready; spawns alternate (stock, gpulease, ...) so that drift on a
shared machine hits both alike, and each server is stopped (its pod gone)
before the next. One untimed warm-up spawn each first. The target is a ratio
of at most 1.05. Needs `make cluster-tools` (Go).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpulease.hub.catalog import load_catalog  # noqa: E402
from gpulease.hub.context import GPULeaseContext  # noqa: E402
from gpulease.hub.profiles import SAMPLE_PROFILES, load_profiles_file  # noqa: E402
from gpulease.singleuser import SERVER_SCRIPT  # noqa: E402
from tests.cluster.conftest import POD_UID, POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane  # noqa: E402
from tests.cluster.controlplane import attach, detach, missing_tools  # noqa: E402
from tests.cluster.kube import Kube, KubeError, pods_path  # noqa: E402
from tests.cluster.nodes import GpuNode, node_object  # noqa: E402
from tests.cluster.test_gpu_kube_spawner_hub import GPU_HUB_CONFIG  # noqa: E402
from tests.cluster.test_kubespawner import (  # noqa: E402
    HUB_CONFIG,
    StockHub,
    home_volume,
    hub_kubeconfig,
)
from tests.isolation_env import hub_python  # noqa: E402

# The stock hub runs the same server script as gpulease's pods.
STOCK_CONFIG = HUB_CONFIG.replace('["jupyterhub-singleuser"]', f'["{SERVER_SCRIPT}"]')


def namespace_with_node(kube: Kube, name: str) -> None:
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    kube.wait_for(f"the default ServiceAccount of {name}",
                  lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"))
    node = node_object(GpuNode(f"{name}-h200", mig={"1g.18gb": 7}))
    node["metadata"]["labels"][POOL_LABEL] = name
    kube.create("/api/v1/nodes", node)
    kube.wait_for(f"node {name}-h200 Ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in kube.get(f"/api/v1/nodes/{name}-h200")["status"].get("conditions", [])))


def spawn_to_ready(hub: StockHub, kube: Kube, namespace: str, options: dict) -> float:
    """Seconds from the REST start until the hub says ready; then stopped, pod gone."""
    start = time.perf_counter()
    answer = hub.api("POST", "/users/alice/server", json=options)
    if answer.status_code not in (201, 202):
        raise RuntimeError(f"start refused: {answer.text}\n{hub.tail()}")
    deadline = time.monotonic() + 120
    while not hub.api("GET", "/users/alice").json()["servers"].get("", {}).get("ready"):
        if time.monotonic() > deadline:
            raise TimeoutError(hub.tail())
        time.sleep(0.05)
    took = time.perf_counter() - start
    hub.api("DELETE", "/users/alice/server")
    deadline = time.monotonic() + 60
    while True:
        try:
            kube.get(pods_path(namespace, "jupyter-alice"))
        except KubeError as e:
            if e.status == 404 and not hub.api("GET", "/users/alice").json()["servers"]:
                return took
        if time.monotonic() > deadline:
            raise TimeoutError(hub.tail())
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=5, help="timed spawns per hub")
    args = parser.parse_args()
    if missing_tools():
        sys.exit(f"needs {', '.join(missing_tools())}: run `make cluster-tools` (Go 1.26)")
    work = Path(tempfile.mkdtemp(prefix="gpulease-kube-bench-"))
    root = Path(tempfile.gettempdir()) / f"gpulease-cluster-bench-{uuid.uuid4().hex[:6]}"
    hubs: list[StockHub] = []
    try:
        plane = ControlPlane(attach(root))
        ours = str(Path(hub_python()[0]).parent.parent)
        plane.map_image(SINGLEUSER_IMAGE, ours)
        for entry in load_catalog().images:
            plane.map_image(entry.image, entry.local_env or ours)
        kube = plane.admin()
        runs = {}
        for shape in ("stock", "gpulease"):
            namespace = f"bench-{shape}-{uuid.uuid4().hex[:4]}"
            namespace_with_node(kube, namespace)
            folder = work / shape
            folder.mkdir()
            storage_class, _home = home_volume(kube, plane, namespace)
            kubeconfig = hub_kubeconfig(kube, plane, namespace, folder)
            if shape == "stock":
                hub = StockHub(folder, kubeconfig, template=STOCK_CONFIG, namespace=namespace,
                               image=SINGLEUSER_IMAGE, uid=POD_UID, pool=POOL_LABEL,
                               storage_class=storage_class)
                options: dict = {}
            else:
                db_url = f"sqlite:///{folder}/gpulease.sqlite"
                ctx = GPULeaseContext(db_url)
                ctx.profiles.apply(load_profiles_file(SAMPLE_PROFILES, ctx.catalog),
                                   actor="bench")
                ctx.ledger.grant("user:alice", 1_000_000_000, note="bench", actor="bench")
                ctx.engine.dispose()
                hub = StockHub(folder, kubeconfig, template=GPU_HUB_CONFIG,
                               namespace=namespace, pool=POOL_LABEL,
                               storage_class=storage_class, db_url=db_url)
                options = {"profile": "h200-1g"}
            hubs.append(hub)
            hub.api("POST", "/users/alice")
            runs[shape] = (hub, namespace, options, [])
            spawn_to_ready(hub, kube, namespace, options)  # warm-up, untimed
        for _ in range(args.spawns):
            for hub, namespace, options, times in runs.values():
                times.append(spawn_to_ready(hub, kube, namespace, options))
        stock, ours_t = (statistics.median(runs[s][3]) for s in ("stock", "gpulease"))
        for shape, (_, _, _, times) in runs.items():
            print(f"{shape}: median {statistics.median(times):.2f} s over {len(times)} "
                  f"({', '.join(f'{t:.2f}' for t in times)})")
        print(f"stock_kube_spawn_s: {stock:.2f}")
        print(f"gpulease_kube_spawn_s: {ours_t:.2f}")
        print(f"kube_spawn_ratio: {ours_t / stock:.3f}")
    finally:
        for hub in hubs:
            hub.stop()
        detach(root)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
