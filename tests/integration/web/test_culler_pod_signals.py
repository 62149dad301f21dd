"""The culler's cluster-shape signals: a pod's GPU from dcgm-exporter's series through
Prometheus (a test double of its HTTP API), its CPU from metrics.k8s.io PodMetrics
(a test double of the metrics API, through the real kubernetes_asyncio client);
everything unreadable is unknown, with why, never 0."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from gpulease.idle_culler.gpu import (
    DCGM_METRIC,
    NoGpuSource,
    PrometheusDcgmSource,
    combine,
    dcgm_pods,
    pod_label,
)
from gpulease.idle_culler.hubapi import parse_profiles
from gpulease.idle_culler.pod_metrics import (
    NO_METRICS_SERVER,
    PodMetricsCpuSource,
    cpu_cores,
    explain_refusal,
    pod_of,
)
from tests.support.metrics_api_double import MetricsApiDouble, pod_metrics
from tests.support.prometheus_double import PrometheusDouble, dcgm_series, free_port

NS = "jhub"
ADA = {"pod_name": "jupyter-ada", "namespace": NS, "dns_name": "x", "kubespawner_version": "7"}


def fleet() -> list[dict]:
    """Ada: a busy full card; Bob: an idle MIG slice; a card no pod holds; Cy's pod in
    another namespace as a Prometheus that does not honour labels keeps it."""
    cy = dcgm_series("GPU-c", 0.6, gpu=2, pod="dcgm-exporter-x1", namespace="gpu-operator")
    cy["metric"] |= {"exported_pod": "jupyter-cy", "exported_namespace": "team-b"}
    return [dcgm_series("GPU-a", 0.83, pod="jupyter-ada", namespace=NS),
            dcgm_series("GPU-b", 0.004, gpu=1, pod="jupyter-bob", namespace=NS, instance=3),
            dcgm_series("GPU-b", 0.9, gpu=1, instance=5),  # a slice no pod holds
            cy]


async def test_a_pods_devices_are_the_series_labelled_with_it_busy_or_idle():
    async with PrometheusDouble(fleet()) as prometheus:
        source = PrometheusDcgmSource(prometheus.url)
        ada = await source.pod_devices(NS, "jupyter-ada")
        bob = await source.pod_devices(NS, "jupyter-bob")
        assert ada == ["GPU-a"] and bob == ["GPU-b/gi3"]
        values = await source.read(ada + bob)
        assert values == {"GPU-a": pytest.approx(83.0), "GPU-b/gi3": pytest.approx(0.4)}
        assert combine(source, await source.read(ada), 5.0) == (pytest.approx(83.0), "dcgm")
        assert combine(source, await source.read(bob), 5.0) == (pytest.approx(0.4), "dcgm")
        # honor_labels: false: the exporter's own pod is `pod`, the user's `exported_pod`
        assert await source.pod_devices("team-b", "jupyter-cy") == ["GPU-c"]
        assert await source.pod_devices("gpu-operator", "dcgm-exporter-x1") == []
        # a pod without series (no GPU, or the exporter's pod mapping is off)
        assert await source.pod_devices(NS, "jupyter-dan") == []
        # one query of the bare metric serves every pod of a pass
        assert prometheus.queries == [DCGM_METRIC]


def dra_slices(uuid: str, gpu: int, instances: dict[int, tuple[str, float]],
               holders: dict[str, tuple[str, int]]) -> list[dict]:
    """A MIG GPU as dcgm-exporter with KUBERNETES_ENABLE_DRA labels it: each instance's series
    (GPU_I_ID -> its profile, ratio) once for every pod holding a slice of the GPU, with
    that pod's slice's claim (pod -> its profile, the slice's memory slice)."""
    out = []
    for instance, (profile, ratio) in instances.items():
        for pod, (held, first) in holders.items():
            series = dcgm_series(uuid, ratio, gpu=gpu, pod=pod, namespace=NS,
                                 instance=instance, profile=profile, dra_claim=f"{pod}-gpus")
            series["metric"] |= {"dra_mig_profile": held, "dra_mig_device_uuid": "",
                                 "dra_device_name": f"gpu-{gpu}-mig-{held}-19-{first}"}
            out.append(series)
    return out


async def test_a_dra_slice_reads_its_own_instance_or_unknown_never_its_neighbours():
    """Under DRA the exporter labels a MIG GPU's every instance with every pod on it: ada's
    busy 3g and bob's idle 1g each read their own; cy and dan, on two 1g of one GPU,
    cannot be told apart: unknown with why (judged on their other signals), never busy."""
    async with PrometheusDouble([
        *dra_slices("GPU-m", 0, {1: ("3g.71gb", 0.9), 9: ("1g.18gb", 0.0)},
                    {"jupyter-ada": ("3g.71gb", 0), "jupyter-bob": ("1g.18gb", 4)}),
        *dra_slices("GPU-n", 1, {9: ("1g.18gb", 0.97), 10: ("1g.18gb", 0.0)},
                    {"jupyter-cy": ("1g.18gb", 4), "jupyter-dan": ("1g.18gb", 5)}),
    ]) as prometheus:
        source = PrometheusDcgmSource(prometheus.url)
        ada = await source.pod_devices(NS, "jupyter-ada")
        bob = await source.pod_devices(NS, "jupyter-bob")
        assert (ada, bob) == (["GPU-m/gi1"], ["GPU-m/gi9"])
        assert combine(source, await source.read(ada), 5.0) == (pytest.approx(90.0), "dcgm")
        assert combine(source, await source.read(bob), 5.0) == (0.0, "dcgm")
        for pod, first in (("jupyter-cy", 4), ("jupyter-dan", 5)):
            devices = await source.pod_devices(NS, pod)
            assert devices == [f"GPU-n/gpu-1-mig-1g.18gb-19-{first}"]
            assert combine(source, await source.read(devices), 5.0) == (None, (
                f"{devices[0]}: dcgm-exporter labels 2 1g.18gb instances of GPU-n with this "
                "pod (DRA maps MIG devices to their GPU): no way to tell which is its own"))


def test_series_without_a_pod_are_nobodys():
    body = {"status": "success", "data": {"result": [dcgm_series("GPU-z", 1.0)]}}
    assert dcgm_pods(body) == {}
    with pytest.raises(ValueError, match="Prometheus answered"):
        dcgm_pods({"status": "error", "error": "bad query"})


async def test_prometheus_down_or_failing_is_unknown_and_named():
    url = f"http://127.0.0.1:{free_port()}"
    source = PrometheusDcgmSource(url, timeout_s=2)
    assert await source.pod_devices(NS, "jupyter-ada") is None
    why = source.describe(pod_label(NS, "jupyter-ada"))
    assert why.startswith(f"Prometheus at {url}: ClientConnectorError"), why
    async with PrometheusDouble(fleet()) as prometheus:
        prometheus.fail = 503
        source = PrometheusDcgmSource(prometheus.url)
        assert await source.pod_devices(NS, "jupyter-ada") is None
        assert "Prometheus answered" in source.describe(pod_label(NS, "jupyter-ada"))
        assert await source.read(["GPU-a"]) == {"GPU-a": None}
    # a source that cannot tell a pod's devices says so
    assert await NoGpuSource().pod_devices(NS, "jupyter-ada") is None


def test_profiles_say_how_many_devices_a_server_holds():
    limits = parse_profiles({"profiles": [
        {"slug": "cpu", "idle_timeout": "30m", "max_runtime": "0"},
        {"slug": "slice", "idle_timeout": "30m", "max_runtime": "0",
         "gpu": {"model": "H200", "mig": "1g.18gb"}},
        {"slug": "two", "idle_timeout": "30m", "max_runtime": "0",
         "gpu": {"model": "H200", "count": 2}}]})
    assert [limits[s].gpus for s in ("cpu", "slice", "two")] == [0, 1, 2]


# --- CPU: metrics.k8s.io ------------------------------------------------------------

def test_cpu_quantities_and_refusals():
    assert cpu_cores("1500000000n") == 1.5 and cpu_cores("250m") == 0.25
    assert cpu_cores("2") == 2.0 and cpu_cores("12u") == pytest.approx(1.2e-5)
    with pytest.raises(ValueError, match="not a CPU quantity"):
        cpu_cores("lots")
    assert explain_refusal(404, b"404 page not found\n", NS) == NO_METRICS_SERVER
    assert "forbidden to list pods.metrics.k8s.io in namespace jhub" in explain_refusal(
        403, '{"kind": "Status", "message": "pods.metrics.k8s.io is forbidden"}', NS)
    assert "registered but not available" in explain_refusal(503, "service unavailable", NS)
    assert pod_of(ADA) == (NS, "jupyter-ada")
    assert pod_of({"pid": 4242, "gpulease_devices": ["MIG-a"]}) is None


def api_client_for(url: str):
    async def make() -> client.ApiClient:
        return client.ApiClient(client.Configuration(host=url))
    return make


async def test_pod_cpu_from_the_metrics_api_one_list_per_namespace():
    api = await MetricsApiDouble().start()
    source = PodMetricsCpuSource(api_client_for(api.url))
    try:
        api.pods[NS] = [pod_metrics("jupyter-ada", NS, notebook="1500000000n", sidecar="5m"),
                        pod_metrics("jupyter-bob", NS, notebook="2000000n")]
        ada = await source.read(("ada", ""), ADA)
        bob = await source.read(("bob", ""), {**ADA, "pod_name": "jupyter-bob"})
        assert ada.percent == pytest.approx(150.5) and not ada.error
        assert bob.percent == pytest.approx(0.2)
        new = await source.read(("cy", ""), {**ADA, "pod_name": "jupyter-cy"})
        assert new.percent is None and "no PodMetrics for pod jhub/jupyter-cy yet" in new.error
        assert api.lists == [NS]  # one list serves the namespace's servers in a pass
        assert "no pod_name" in (await source.read(("x", ""), {"pid": 3})).error
        assert "admin:server_state" in (await source.read(("x", ""), None)).error
    finally:
        await source.close()
        await api.stop()


@pytest.mark.parametrize(("status", "body", "why"), [
    (404, "404 page not found\n", NO_METRICS_SERVER),
    (403, '{"kind": "Status", "message": "forbidden"}', "forbidden to list pods.metrics.k8s.io"),
    (503, "service unavailable", "registered but not available"),
])
async def test_no_metrics_server_or_a_refusal_is_unknown_never_idle(status, body, why):
    api = await MetricsApiDouble().start()
    api.fail = (status, body)
    source = PodMetricsCpuSource(api_client_for(api.url))
    try:
        reading = await source.read(("ada", ""), ADA)
    finally:
        await source.close()
        await api.stop()
    assert reading.percent is None and why in reading.error


async def test_the_api_server_unreachable_is_unknown():
    source = PodMetricsCpuSource(api_client_for(f"http://127.0.0.1:{free_port()}"),
                                 timeout_s=2)
    try:
        reading = await source.read(("ada", ""), ADA)
    finally:
        await source.close()
    assert reading.percent is None
    assert reading.error.startswith("the API server could not be read"), reading.error
