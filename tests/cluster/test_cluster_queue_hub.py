"""The cluster queue as users see it: a real JupyterHub and proxy running GPUKubeSpawner.

Every MIG slice of the pool is taken by pods outside gpulease; two starts wait
in the fair queue with their positions in the spawn's progress, no pod of
theirs is made while they wait, and each starts as a slice frees, in order.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpulease.spawners.context import GPULeaseContext
from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_gpu_kube_spawner_hub import gpu_hub  # noqa: F401 (a fixture)
from tests.cluster.test_kubespawner import StockHub, home_volume
from tests.support.queue_reads import wait_for_progress

SLICES = 7  # gpu_hub's MIG node: 7 x 1g.18gb
WAITING = "Waiting for a free H200 slice 1g.18gb: position"


def server_of(hub: StockHub, user: str) -> dict:
    return hub.api("GET", f"/users/{user}").json()["servers"].get("", {})


def wait_ready(hub: StockHub, user: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (server := server_of(hub, user)).get("ready"):
        assert server, f"{user}'s start ended without a server:\n{hub.tail()}"
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.5)


def has_pod(kube: Kube, namespace: str, name: str) -> bool:
    try:
        kube.get(pods_path(namespace, name))
    except KubeError:
        return False
    return True


def free_a_slice(kube: Kube, namespace: str, pod: str) -> None:
    """The other tenant's pod ends as pods do: a graceful delete, which the kubelet
    completes once its container is gone. (A delete with grace 0 removes the object
    while the kubelet still has the device: the next pod bound there is refused,
    UnexpectedAdmissionError, as a real kubelet may; tests/cluster/test_kill_frees_slice.py
    is that case.)"""
    kube.delete(pods_path(namespace, pod), {"gracePeriodSeconds": 1})
    kube.wait_for(f"{pod} gone", lambda: not has_pod(kube, namespace, pod))


def test_starts_wait_with_their_positions_and_start_in_order_as_slices_free(
        gpu_hub, kube: Kube, namespace: str, tmp_path: Path,  # noqa: F811
        control_plane: ControlPlane):
    hub, _ = gpu_hub
    home_volume(kube, control_plane, namespace, "bob-home")  # gpu_hub's volume is alice's
    ctx = GPULeaseContext(f"sqlite:///{tmp_path}/gpulease.sqlite")
    ctx.ledger.grant("user:bob", 50_000_000, note="test credit", actor="test")
    ctx.engine.dispose()
    node = f"{namespace}-h200"
    for i in range(SLICES):  # another tenant's pods hold every slice
        kube.create(pods_path(namespace), gpu_pod(namespace, f"other-{i}", node,
                                                  "nvidia.com/mig-1g.18gb", 1))
    kube.wait_for("every slice held", lambda: all(
        kube.get(pods_path(namespace, f"other-{i}"))["spec"].get("nodeName")
        for i in range(SLICES)))

    for user in ("alice", "bob"):
        assert hub.api("POST", f"/users/{user}").status_code == 201
        r = hub.api("POST", f"/users/{user}/server", json={"profile": "h200-1g"})
        assert r.status_code == 202, r.text + hub.tail()
    assert f"{WAITING} 1 in the queue" in wait_for_progress(hub, "alice", hub.token, WAITING)[-1]
    assert f"{WAITING} 2 in the queue" in wait_for_progress(hub, "bob", hub.token, WAITING)[-1]
    assert not has_pod(kube, namespace, "jupyter-alice")  # no pod while it waits

    free_a_slice(kube, namespace, "other-0")
    wait_ready(hub, "alice")
    assert f"{WAITING} 1 in the queue" in wait_for_progress(hub, "bob", hub.token, WAITING)[-1]
    assert server_of(hub, "bob")["ready"] is False and not has_pod(kube, namespace, "jupyter-bob")

    free_a_slice(kube, namespace, "other-1")
    wait_ready(hub, "bob")
    spec = kube.get(pods_path(namespace, "jupyter-bob"))["spec"]
    assert spec["nodeName"] == node
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-bob-home")
