"""GPUKubeSpawner's pod, from a profile choice, as kubespawner builds it (no cluster here;
tests/cluster/test_gpu_kube_spawner.py has the real API server judge it)."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from gpulease.core.model.catalog import Image
from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.core.policy.options import ServerChoice
from gpulease.spawners.kube.spawner import HOME_CLAIM, GPUKubeSpawner, pod_options

GiB = 1024**3


def choice(gpu: GpuSpec | None, slug: str = "h200-slice") -> ServerChoice:
    profile = Profile(slug=slug, display_name=slug, description="", gpu=gpu, cpu=Decimal("2"),
                      memory_bytes=8 * GiB, images=("pytorch",), price_per_hour_ucr=1,
                      min_run_s=0, idle_timeout_s=1800, max_runtime_s=0)
    image = Image(name="pytorch", image="example.org/gpulease/pytorch:1", cuda=None,
                  min_driver=None, frameworks={}, description="", local_env=None)
    return ServerChoice(profile=profile, image=image, account="user:ada", chosen_by="request")


def make(name: str = "") -> GPUKubeSpawner:
    """A spawner of user ada (made on a running loop: kubespawner makes its client then)."""
    spawner = GPUKubeSpawner(_mock=True, namespace="gpulease", name=name)
    spawner.user.name = "ada"
    spawner.pvc_name = spawner._expand_user_properties(spawner.pvc_name_template)
    return spawner


def manifest(picked: ServerChoice, name: str = "") -> tuple[GPUKubeSpawner, dict]:
    async def build() -> tuple[GPUKubeSpawner, dict]:
        spawner = make(name)
        for option, value in pod_options(picked, spawner.cluster_gpus()).items():
            setattr(spawner, option, value)
        pod = await spawner.get_pod_manifest()
        return spawner, spawner.api.api_client.sanitize_for_serialization(pod)
    return asyncio.run(build())


pytestmark = pytest.mark.usefixtures("no_cluster")  # tests/conftest.py


def test_a_mig_slice_pod_asks_for_its_slice_on_the_models_nodes_and_is_locked_down():
    _, pod = manifest(choice(GpuSpec("H200", "1g.18gb")))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "example.org/gpulease/pytorch:1"
    assert container["args"][0] == "gpulease-singleuser"
    assert container["resources"]["limits"]["nvidia.com/mig-1g.18gb"] == "1"
    assert container["resources"]["requests"]["nvidia.com/mig-1g.18gb"] == "1"
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (expr,) = required["nodeSelectorTerms"][0]["matchExpressions"]
    assert expr["key"] == "nvidia.com/gpu.product" and "NVIDIA-H200" in expr["values"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in [
        {k: t.get(k) for k in ("key", "operator", "effect")} for t in spec["tolerations"]]
    assert spec["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"


def test_a_failed_notebook_container_leaves_the_tail_of_its_log_in_its_status():
    """terminationMessagePolicy FallbackToLogsOnError: the kubelet puts the end of a failed
    container's log in state.terminated.message, which its start's failure shows."""
    for picked in (choice(GpuSpec("H200", "1g.18gb")), choice(None, "cpu")):
        _, pod = manifest(picked)
        (container,) = pod["spec"]["containers"]
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_every_server_of_a_user_mounts_the_one_home_claim():
    spawner, pod = manifest(choice(GpuSpec("A100-80GB", None, 2), "two-a100"), name="train")
    assert spawner.pvc_name_template == HOME_CLAIM and spawner.pvc_name == "claim-ada"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "home"]
    assert volume["persistentVolumeClaim"]["claimName"] == "claim-ada"
    assert spawner.delete_pvc is False
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_deleting_a_server_never_deletes_the_home():
    async def delete() -> list[str]:
        spawner = make("train")
        asked: list[str] = []

        class NoApi:  # any call to the API server is recorded
            def __getattr__(self, name: str):
                asked.append(name)
                raise AssertionError(f"the API server was asked {name}")
        spawner.api = NoApi()
        await spawner.delete_forever()
        return asked
    assert asyncio.run(delete()) == []


def test_the_pod_names_the_packing_scheduler_only_when_one_is_configured():
    async def scheduler_of(packing: str | None) -> str | None:
        spawner = make()
        if packing is not None:
            spawner.packing_scheduler = packing
        for option, value in pod_options(choice(GpuSpec("H200", None, 1)),
                                         spawner.cluster_gpus()).items():
            setattr(spawner, option, value)
        pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
        return pod["spec"].get("schedulerName")
    assert asyncio.run(scheduler_of("gpulease-scheduler")) == "gpulease-scheduler"
    assert asyncio.run(scheduler_of(None)) is None  # the API server's default-scheduler
    assert asyncio.run(scheduler_of("")) is None
