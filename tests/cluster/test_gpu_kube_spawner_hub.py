"""GPUKubeSpawner in a real JupyterHub with the real proxy, on the test cluster.

The hub runs `jupyterhub` with GPUKubeSpawner (not yet `gpulease up`: the
cluster shape is not wired into it, docs/cluster.md) and a ServiceAccount
holding only Zero to JupyterHub's hub Role; gpulease's database holds the
sample profiles and the user's credit. A MIG-slice start goes through
gpulease's admission (options, rights, credit), becomes a pod with exactly
its slice, and is run by the kubelet emulator on an emulated H200 node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulease.hub.context import GPULeaseContext
from gpulease.hub.profiles import SAMPLE_PROFILES, load_profiles_file
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_kubespawner import HUB_CONFIG, StockHub, home_volume, hub_kubeconfig
from tests.hubproc import require_chp, run_in_kernel

# The stock hub's settings, with GPUKubeSpawner and gpulease's database instead.
GPU_HUB_CONFIG = HUB_CONFIG.split('c.JupyterHub.spawner_class')[0] + """
c.JupyterHub.spawner_class = "gpulease.spawners.kube.GPUKubeSpawner"
c.GPUKubeSpawner.db_url = {db_url!r}
c.GPUKubeSpawner.namespace = {namespace!r}
c.GPUKubeSpawner.node_selector = {{{pool!r}: {namespace!r}}}
c.GPUKubeSpawner.storage_class = {storage_class!r}
c.GPUKubeSpawner.storage_capacity = "1Gi"
c.GPUKubeSpawner.storage_access_modes = ["ReadWriteOnce"]
c.GPUKubeSpawner.start_timeout = 90
c.GPUKubeSpawner.http_timeout = 90
"""


@pytest.fixture
def gpu_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
            tmp_path: Path) -> Iterator[tuple[StockHub, Path]]:
    require_chp()
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    storage_class, home = home_volume(kube, control_plane, namespace)
    db_url = f"sqlite:///{tmp_path}/gpulease.sqlite"
    ctx = GPULeaseContext(db_url)
    ctx.profiles.apply(load_profiles_file(SAMPLE_PROFILES, ctx.catalog), actor="test")
    ctx.ledger.grant("user:alice", 50_000_000, note="test credit", actor="test")
    ctx.engine.dispose()
    hub = StockHub(tmp_path, hub_kubeconfig(kube, control_plane, namespace, tmp_path),
                   template=GPU_HUB_CONFIG, namespace=namespace, pool=POOL_LABEL,
                   storage_class=storage_class, db_url=db_url, image="", uid=0)
    yield hub, home
    hub.stop()
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-home")


def _server(hub: StockHub) -> dict:
    return hub.api("GET", "/users/alice").json()["servers"].get("", {})


def test_a_mig_slice_server_runs_in_its_pod_with_only_its_slice(gpu_hub, kube: Kube,
                                                                namespace: str):
    hub, home = gpu_hub
    assert hub.api("POST", "/users/alice").status_code == 201
    started = hub.api("POST", "/users/alice/server", json={"profile": "h200-1g"})
    assert started.status_code in (201, 202), started.text + hub.tail()
    deadline = time.monotonic() + 120
    while not _server(hub).get("ready"):
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.5)

    pod = kube.get(pods_path(namespace, "jupyter-alice"))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/mig-1g.18gb"] == "1"
    assert container["image"] == "registry.example.org/gpulease/pytorch:2.6-cuda12.6"
    assert container["args"][0] == "gpulease-singleuser"
    (term,) = spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["NVIDIA-H200"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "home"]
    assert volume["persistentVolumeClaim"]["claimName"] == "claim-alice"

    token = hub.api("POST", "/users/alice/tokens", json={"expires_in": 600}).json()["token"]
    out = run_in_kernel(hub.url, "/user/alice/", token, (
        "import os, pathlib\n"
        "pathlib.Path(os.path.expanduser('~/kept.txt')).write_text('mine')\n"
        "print(os.environ['NVIDIA_VISIBLE_DEVICES'],"
        " os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))"))
    devices, has_token = out.split()
    assert devices.startswith("MIG-") and "," not in devices  # exactly one slice
    assert has_token == "False"

    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    deadline = time.monotonic() + 60
    while _server(hub):
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.5)

    def pod_gone() -> bool:
        try:
            kube.get(pods_path(namespace, "jupyter-alice"))
        except KubeError as e:
            return e.status == 404
        return False
    kube.wait_for("the pod deleted", pod_gone, timeout=30)
    claim = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/claim-alice")
    assert claim["status"]["phase"] == "Bound"  # the home stays
    assert (home / "kept.txt").read_text() == "mine"
