"""Driver compatibility at admission in the cluster shape, on the real control plane: a
node whose NVIDIA driver (GPU feature discovery's labels) is older than the image's CUDA
needs is never given its pod, and with no node new enough the start is refused 422
naming the image, the driver it needs and the newest driver there is.

The sample profile h200-1g starts the catalog's `pytorch` image: CUDA 12.6, driver
560.28 or newer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_gpu_kube_spawner_hub import gpu_hub_at
from tests.cluster.test_kubespawner import StockHub, wait_ready
from tests.cluster.test_spawn_faults import outcome

OLD = "550.54.15"


@pytest.fixture
def hub_on(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
           tmp_path: Path) -> Iterator:
    hubs = []

    def start(*nodes: GpuNode) -> StockHub:
        running = gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path, nodes=nodes,
                             extra_config="c.GPUKubeSpawner.queue_max_wait = 0\n")
        hub, _home = running.__enter__()
        hubs.append(running)
        assert hub.api("POST", "/users/alice").status_code == 201
        return hub
    yield start
    for running in hubs:
        running.__exit__(None, None, None)


def test_a_pod_is_kept_off_a_node_whose_driver_is_too_old(hub_on, kube: Kube, namespace: str):
    # The old node is the fuller choice (7 slices free, packing would pick the new one's
    # single slice first anyway): the affinity, not luck, keeps the pod off it.
    hub = hub_on(GpuNode("old", mig={"1g.18gb": 7}, driver=OLD),
                 GpuNode("new", mig={"1g.18gb": 7}, driver="570.124.06"))
    started = hub.api("POST", "/users/alice/server", json={"profile": "h200-1g"})
    assert started.status_code in (201, 202), started.text + hub.tail()
    wait_ready(hub)
    pod = kube.get(pods_path(namespace, "jupyter-alice"))
    assert pod["spec"]["nodeName"] == f"{namespace}-new"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms and all({"key": "metadata.name", "operator": "NotIn",
                          "values": [f"{namespace}-old"]} in t["matchFields"] for t in terms)


def test_no_node_new_enough_is_refused_422_naming_image_driver_and_newest(
        hub_on, kube: Kube, namespace: str):
    hub = hub_on(GpuNode("old", mig={"1g.18gb": 7}, driver=OLD),
                 GpuNode("older", mig={"1g.18gb": 7}, driver="535.183.01"))
    started = hub.api("POST", "/users/alice/server", json={"profile": "h200-1g"})
    ready, message = outcome(hub)
    assert not ready
    assert ("The image pytorch needs NVIDIA driver 560.28 or newer, and no H200 slice 1g.18gb "
            f"here has it (the newest driver on one is {OLD})") in message, message
    assert started.status_code in (202, 422)
    assert kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"] == []
