"""GPUKubeSpawner on the real API server: its pod passes PodSecurity `restricted` with the
user's home claim mounted, and kubespawner's shared watches always run: replaced when they
give up, or when their first list failed, and started even when the caller that started
them is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from decimal import Decimal

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.config import kube_config

from gpulease.core.model.catalog import Image
from gpulease.core.model.profiles import GpuSpec, Profile
from gpulease.core.policy.options import ServerChoice
from gpulease.spawners.kube.spawner import GPUKubeSpawner, pod_options
from tests.cluster import dra_driver
from tests.cluster.conftest import POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode

GiB = 1024**3


@pytest.fixture(autouse=True)
def _kubeconfig(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    # kubespawner loads a kubeconfig as it is made; the client read $KUBECONFIG at import.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", control_plane.kubeconfig)


def slice_choice() -> ServerChoice:
    profile = Profile(slug="h200-slice", display_name="slice", description="",
                      gpu=GpuSpec("H200", "1g.18gb"), cpu=Decimal("1"), memory_bytes=2 * GiB,
                      images=("singleuser",), price_per_hour_ucr=1, min_run_s=0,
                      idle_timeout_s=1800, max_runtime_s=0)
    image = Image(name="singleuser", image=SINGLEUSER_IMAGE, cuda=None, min_driver=None,
                  frameworks={}, description="", local_env=None)
    return ServerChoice(profile=profile, image=image, account="user:ada", chosen_by="request")


def spawner_of(namespace: str) -> GPUKubeSpawner:
    spawner = GPUKubeSpawner(_mock=True, namespace=namespace,
                             node_selector={POOL_LABEL: namespace})
    spawner.user.name = "ada"
    spawner.pvc_name = spawner._expand_user_properties(spawner.pvc_name_template)
    spawner.pod_name = "jupyter-ada"
    return spawner


async def test_its_pod_passes_restricted_and_mounts_the_users_home_claim(
        kube: Kube, namespace: str, gpu_nodes):
    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    spawner = spawner_of(namespace)
    for name, value in pod_options(slice_choice(), spawner.cluster_gpus()).items():
        setattr(spawner, name, value)
    body = ApiClient().sanitize_for_serialization(await spawner.get_pod_manifest())
    created = kube.create(pods_path(namespace), body)  # PodSecurity restricted admits it
    (volume,) = [v for v in created["spec"]["volumes"] if v["name"] == "home"]
    assert volume["persistentVolumeClaim"]["claimName"] == "claim-ada"
    assert created["spec"]["automountServiceAccountToken"] is False

    root = {**body, "metadata": {**body["metadata"], "name": "as-root"}}
    root["spec"] = {**body["spec"], "securityContext": {"runAsUser": 0}}
    with pytest.raises(KubeError) as refused:  # the check that admitted it can refuse
        kube.create(pods_path(namespace), root)
    assert refused.value.status == 403 and "restricted" in str(refused.value)


async def test_in_dra_mode_its_pod_names_a_template_the_api_server_takes(
        kube: Kube, namespace: str):
    """The template's CEL compiles (the API server checks it at create) and the pod, asking
    no extended resource, passes restricted with its claim."""
    from gpulease.spawners.kube.dra_claims import claim_spec, claim_template

    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    spawner = spawner_of(namespace)
    spawner.gpu_allocation = "dra"
    choice = slice_choice()
    template = claim_template(claim_spec(choice.profile.gpu), namespace, "h200-slice")
    kube.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
                template)
    for name, value in pod_options(choice, spawner.cluster_gpus()).items():
        setattr(spawner, name, value)
    spawner.gpulease_choice = choice
    spawner._gpulease_claim_template = template["metadata"]["name"]
    body = ApiClient().sanitize_for_serialization(await spawner.get_pod_manifest())
    created = kube.create(pods_path(namespace), body)
    (container,) = created["spec"]["containers"]
    assert not [r for r in (container["resources"].get("limits") or {})
                if r.startswith("nvidia.com/")]
    assert container["resources"]["claims"] == [{"name": "gpus"}]
    assert created["spec"]["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}]
    assert "affinity" not in created["spec"] or not created["spec"]["affinity"]
    # the controller-manager makes the pod's claim from the template
    kube.wait_for("the pod's ResourceClaim", lambda: kube.get(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")["items"])


async def test_a_template_of_gpuleases_name_asking_for_more_is_never_used(
        kube: Kube, namespace: str):
    """Its name is a hash, not a lock: one made by someone else under that name (asking for
    eight cards of any kind) refuses the start; gpulease's own is used as found."""
    from kubernetes_asyncio.client import ResourceV1Api

    from gpulease.core.model.nvidia_dra import GPU_DEVICE_CLASS
    from gpulease.spawners.kube.dra_claims import claim_spec, claim_template
    from gpulease.spawners.kube.dra_templates import ClaimTemplates, ForeignTemplate

    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
    dra_driver.install(kube)  # NVIDIA's DeviceClasses (the driver's chart; its double)
    spec = claim_spec(GpuSpec("H200", count=2))
    foreign = claim_template(copy.deepcopy(spec), namespace, "x")
    foreign["spec"]["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": GPU_DEVICE_CLASS, "count": 8}
    kube.create(path, foreign)
    templates = ClaimTemplates(ResourceV1Api(spawner_of(namespace).api.api_client), namespace,
                               lambda: [])
    with pytest.raises(ForeignTemplate, match="was not made by gpulease for this profile"):
        await templates.ensure(spec, "h200-2")
    assert not templates.starting  # the refused start holds nothing
    kube.delete(f"{path}/{foreign['metadata']['name']}")
    kube.create(path, claim_template(spec, namespace, "h200-2"))
    assert await templates.ensure(spec, "h200-2") == foreign["metadata"]["name"]


async def test_a_pod_watch_that_gave_up_is_replaced(kube: Kube, namespace: str):
    spawner = spawner_of(namespace)
    dead = await spawner._start_watching_pods()
    key = spawner._get_reflector_key("pods")
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await dead.stop()  # as after kubespawner's ~50 s of failed retries
        kube.create(pods_path(namespace), {
            "metadata": {"name": "late", "labels": {"component": "singleuser-server"}},
            "spec": {"containers": [{"name": "c", "image": "none"}]}})
        dead.on_failure()  # what kubespawner's reflector calls when it gives up
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while GPUKubeSpawner.reflectors.get(key) is dead:
            assert loop.time() < deadline, "the pod watch was not replaced"
            await asyncio.sleep(0.1)
        fresh = GPUKubeSpawner.reflectors[key]
        assert f"{namespace}/late" in fresh.resources  # it listed what the dead one missed
        assert fresh.on_failure is not None  # and it too is replaced if it gives up
    finally:
        reflector = GPUKubeSpawner.reflectors.pop(key, None)
        if reflector is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await reflector.stop()


async def _forget(key: str) -> None:
    reflector = GPUKubeSpawner.reflectors.pop(key, None)
    if reflector is not None:
        with contextlib.suppress(asyncio.CancelledError):
            await reflector.stop()


async def test_an_event_watch_whose_first_caller_is_cancelled_still_starts(
        kube: Kube, namespace: str):
    """The caller that starts the shared event watch is cancelled during its first list,
    as JupyterHub cancels a start's progress stream when the start fails: the watch
    still starts, and the next caller gets it running (kubespawner left it registered
    with a first load that never came: every later start waited until start_timeout)."""
    spawner = spawner_of(namespace)
    key = spawner._get_reflector_key("events")
    first = asyncio.ensure_future(spawner._start_watching_events())
    try:
        while key not in GPUKubeSpawner.reflectors:  # registered: its first list is asked
            await asyncio.sleep(0)
        first.cancel()
        reflector = await asyncio.wait_for(spawner._start_watching_events(), 10)
        assert reflector.first_load_future.done() and reflector.watch_task is not None
        assert not reflector.watch_task.done()
    finally:
        await _forget(key)


async def test_a_pod_watch_whose_first_list_failed_is_started_anew(
        kube: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch):
    """The first list of the shared pod watch fails (the API server away for a moment):
    that caller gets the error, and the next one a watch that runs, not the dead one
    kubespawner kept handing out (its pods never seen: starts waited until start_timeout)."""
    spawner = spawner_of(namespace)
    key = spawner._get_reflector_key("pods")
    listing = CoreV1Api.list_namespaced_pod
    failures = [aiohttp.ClientConnectionError("the API server away (injected)")]

    async def list_once_failing(self, *args, **kwargs):
        if failures:
            raise failures.pop()
        return await listing(self, *args, **kwargs)

    monkeypatch.setattr(CoreV1Api, "list_namespaced_pod", list_once_failing)
    try:
        with pytest.raises(aiohttp.ClientConnectionError):
            await spawner._start_watching_pods()
        dead = GPUKubeSpawner.reflectors[key]
        reflector = await asyncio.wait_for(spawner._start_watching_pods(), 10)
        assert reflector is not dead and reflector.watch_task is not None
        assert GPUKubeSpawner.reflectors[key] is reflector
        assert reflector.on_failure is not None  # replaced too if it gives up later
    finally:
        await _forget(key)
