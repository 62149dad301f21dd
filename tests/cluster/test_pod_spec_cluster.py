"""gpulease's pod needs, through stock kubespawner's own pod manifest, on the real API server
and scheduler: the pod passes PodSecurity `restricted` and lands on a node of its GPU model."""

from __future__ import annotations

from decimal import Decimal

import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner

from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.spawners.kube.pod_spec import ClusterGpus, kubespawner_traits, pod_needs
from tests.cluster.conftest import POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode

GiB = 1024**3


def _profile(gpu: GpuSpec) -> Profile:
    return Profile(slug="p", display_name="P", description="", gpu=gpu, cpu=Decimal("2"),
                   memory_bytes=4 * GiB, images=("pytorch",), price_per_hour_ucr=1,
                   min_run_s=0, idle_timeout_s=1800, max_runtime_s=0)


async def _manifest(gpu: GpuSpec, namespace: str, name: str) -> dict:
    traits = kubespawner_traits(pod_needs(_profile(gpu), ClusterGpus()), SINGLEUSER_IMAGE)
    spawner = KubeSpawner(_mock=True, namespace=namespace, node_selector={POOL_LABEL: namespace},
                          cmd=["python", "-c", "import time; time.sleep(600)"], **traits)
    spawner.pod_name = name
    manifest = await spawner.get_pod_manifest()
    body = ApiClient().sanitize_for_serialization(manifest)
    body["metadata"]["name"] = name
    return body


def _running(kube: Kube, namespace: str, name: str) -> dict:
    return kube.wait_for(f"{name} running", lambda: (
        p := kube.get(pods_path(namespace, name)))["status"].get("phase") == "Running" and p,
        timeout=60)


@pytest.fixture(autouse=True)
def _kubeconfig(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    # kubespawner loads a kubeconfig as it is made, even a _mock one; the
    # client read $KUBECONFIG once, at import.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", control_plane.kubeconfig)


async def test_a_slice_pod_passes_restricted_and_lands_on_its_model(kube: Kube, namespace: str,
                                                                   gpu_nodes):
    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}),
              GpuNode("a100", model="A100-80GB", mig={"1g.18gb": 7}))  # same resource name
    body = await _manifest(GpuSpec("H200", "1g.18gb"), namespace, "slice")
    kube.create(pods_path(namespace), body)  # PodSecurity restricted admits it
    pod = _running(kube, namespace, "slice")
    assert pod["spec"]["nodeName"] == f"{namespace}-h200"  # the model's product, not A100's
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/mig-1g.18gb"] == "1"
    assert container["resources"]["requests"]["nvidia.com/mig-1g.18gb"] == "1"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not any("kube-api-access" in v["name"] for v in pod["spec"].get("volumes", []))


async def test_full_cards_land_on_either_board_of_the_model(kube: Kube, namespace: str,
                                                            gpu_nodes):
    gpu_nodes(GpuNode("sxm", model="A100-80GB", gpus=1),
              GpuNode("pcie", model="A100-80GB", gpus=1, product="NVIDIA-A100-80GB-PCIe"),
              GpuNode("h200", gpus=8))
    for name in ("one", "two"):
        kube.create(pods_path(namespace), await _manifest(GpuSpec("A100-80GB"), namespace, name))
    nodes = {_running(kube, namespace, n)["spec"]["nodeName"] for n in ("one", "two")}
    assert nodes == {f"{namespace}-sxm", f"{namespace}-pcie"}
