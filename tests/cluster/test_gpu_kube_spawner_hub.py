"""GPUKubeSpawner in a real JupyterHub with the real proxy, on the test cluster.

The hub runs `jupyterhub` with GPUKubeSpawner (not yet `gpulease up`: the
cluster shape is not wired into it, docs/cluster.md) and a ServiceAccount
holding only gpulease's hub Role and ClusterRole (spawners/kube/rbac.py);
gpulease's database holds the sample profiles, a 2-GPU one and the user's
credit. A MIG-slice and a
2-GPU start go through gpulease's admission (options, rights, credit),
become pods with exactly their GPUs, and are run by the kubelet emulator on
emulated H200 nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from gpulease.core.model.profiles import (
    SAMPLE_PROFILES,
    load_profiles_file,
    parse_profiles_document,
)
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.kube.rbac import HUB_CLUSTER_ROLE_RULES, HUB_ROLE_RULES
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_kubespawner import (
    HUB_CONFIG,
    StockHub,
    home_volume,
    hub_kubeconfig,
    stop_keeping_home,
    wait_ready,
)
from tests.support.hubproc import require_chp, run_in_kernel

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
DEFAULT_NODES = (GpuNode("h200", mig={"1g.18gb": 7}), GpuNode("h200x8", gpus=8))


@contextmanager
def gpu_hub_at(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
               tmp_path: Path, nodes: tuple[GpuNode, ...] = DEFAULT_NODES,
               users: tuple[str, ...] = ("alice",), server: str = "",
               extra_config: str = "") -> Iterator[tuple[StockHub, Path]]:
    """The GPU hub on these `nodes`: gpulease's sample profiles and a 2-GPU one, credit
    for each of `users`, a home volume; the hub reaches the API server at `server`
    (the fault proxy, say; default: the API server itself); `extra_config` appended."""
    require_chp()
    gpu_nodes(*nodes)
    storage_class, home = home_volume(kube, control_plane, namespace)
    db_url = f"sqlite:///{tmp_path}/gpulease.sqlite"
    ctx = GPULeaseContext(db_url)
    two = parse_profiles_document({"profiles": [{
        "slug": "two-h200", "display_name": "Two H200", "description": "two whole cards",
        "gpu": {"model": "H200", "count": 2}, "cpu": 2, "memory": "8Gi",
        "images": ["pytorch"], "price_per_hour": "16.00"}]}, ctx.catalog, "test")
    ctx.profiles.apply(load_profiles_file(SAMPLE_PROFILES, ctx.catalog) + two, actor="test")
    for user in users:
        ctx.ledger.grant(f"user:{user}", 50_000_000, note="test credit", actor="test")
    ctx.engine.dispose()
    kubeconfig = hub_kubeconfig(kube, control_plane, namespace, tmp_path,
                                rules=HUB_ROLE_RULES, cluster_rules=HUB_CLUSTER_ROLE_RULES)
    if server:
        config = yaml.safe_load(kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = server
        kubeconfig.write_text(yaml.safe_dump(config))
    hub = StockHub(tmp_path, kubeconfig, template=GPU_HUB_CONFIG + extra_config,
                   namespace=namespace, pool=POOL_LABEL, storage_class=storage_class,
                   db_url=db_url, image="", uid=0)
    try:
        yield hub, home
    finally:
        hub.stop()
        kube.delete(f"/api/v1/persistentvolumes/{namespace}-home")


@pytest.fixture
def gpu_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
            tmp_path: Path) -> Iterator[tuple[StockHub, Path]]:
    with gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path) as running:
        yield running


@pytest.mark.parametrize("profile, resource, count, node, prefix", [
    ("h200-1g", "nvidia.com/mig-1g.18gb", 1, "h200", "MIG-"),
    ("two-h200", "nvidia.com/gpu", 2, "h200x8", "GPU-"),
], ids=["mig-slice", "two-gpus"])
def test_a_server_runs_in_its_pod_with_exactly_its_gpus(gpu_hub, kube: Kube, namespace: str,
                                                        profile: str, resource: str,
                                                        count: int, node: str, prefix: str):
    hub, home = gpu_hub
    assert hub.api("POST", "/users/alice").status_code == 201
    started = hub.api("POST", "/users/alice/server", json={"profile": profile})
    assert started.status_code in (201, 202), started.text + hub.tail()
    wait_ready(hub)

    pod = kube.get(pods_path(namespace, "jupyter-alice"))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"][resource] == str(count)
    assert spec["nodeName"] == f"{namespace}-{node}"
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
    ids = devices.split(",")
    assert len(ids) == count == len(set(ids)) and all(i.startswith(prefix) for i in ids)
    assert has_token == "False"

    stop_keeping_home(hub, kube, namespace)
    assert (home / "kept.txt").read_text() == "mine"
