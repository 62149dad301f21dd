"""A culler pass over cluster-shape servers (pods), behind the FAKE hub (tests/support/culler_fakehub.py):
kernels as pushed, GPU from dcgm-exporter's series through a Prometheus-API test double, CPU
from a metrics API that is not there (404, as the real API server answers without a metrics
server; tests/cluster/test_culler_cluster.py shows that answer). What the policy says then:
the CPU is unknown and named, never quiet; idle kernels and an idle GPU suspend; a busy
GPU keeps; a GPU server whose GPU is unknown as well is kept."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from kubernetes_asyncio import client

from gpulease.idle_culler.culler import Culler, CullerConfig
from gpulease.idle_culler.gpu import PrometheusDcgmSource
from gpulease.idle_culler.pod_metrics import NO_METRICS_SERVER, PodMetricsCpuSource
from tests.support.culler_fakehub import REF, Clock, FakeServer, RecordingNotices, start
from tests.support.metrics_api_double import MetricsApiDouble, pod_metrics
from tests.support.prometheus_double import PrometheusDouble, dcgm_series

NS = "jhub"
PROFILES = {"slice": ("30m", "0", {"model": "H200", "mig": "1g.18gb"}),
            "two": ("30m", "0", {"model": "H200", "count": 2}),
            "cpu": ("30m", "0")}


def pod_server(user: str, profile: str, **kw) -> FakeServer:
    state = {"pod_name": f"jupyter-{user}", "namespace": NS, "dns_name": "x",
             "kubespawner_version": "7.0.0"}
    return FakeServer(user, "", user, profile=profile, state=state, **kw)


async def test_a_cluster_pass_without_a_metrics_server():
    servers = [
        pod_server("idle", "slice"),  # idle kernels, idle slice: suspended
        pod_server("gpubusy", "two"),  # both cards in the exporter, one busy: kept
        pod_server("halfseen", "two"),  # one card's series missing, the other idle: GPU unknown
        pod_server("cpuonly", "cpu"),  # no GPU: nothing asked of Prometheus for it
        pod_server("kernel", "slice", kernel_state="busy"),  # a busy kernel: kept
    ]
    prometheus = await PrometheusDouble([
        dcgm_series("GPU-1", 0.0, pod="jupyter-idle", namespace=NS, instance=3),
        dcgm_series("GPU-2", 0.91, gpu=1, pod="jupyter-gpubusy", namespace=NS),
        dcgm_series("GPU-3", 0.0, gpu=2, pod="jupyter-gpubusy", namespace=NS),
        dcgm_series("GPU-4", 0.0, gpu=3, pod="jupyter-halfseen", namespace=NS),
        dcgm_series("GPU-1", 0.0, pod="jupyter-kernel", namespace=NS, instance=4),
    ]).start()
    metrics_api = await MetricsApiDouble().start()
    metrics_api.fail = (404, "404 page not found\n")

    async def api() -> client.ApiClient:
        return client.ApiClient(client.Configuration(host=metrics_api.url))

    clock = Clock(REF)
    hub, http, hub_client = await start(servers, profiles=PROFILES, clock=clock)
    cpu = PodMetricsCpuSource(api, cache_s=0.5)
    # The readings are cached for half a second: one query and one list serve a pass.
    culler = Culler(hub_client, cpu, PrometheusDcgmSource(prometheus.url, cache_s=0.5),
                    notices=RecordingNotices(), config=CullerConfig(), clock=clock)
    try:
        await culler.run_pass()  # first sight
        # one query and one metrics list a pass, whatever the number of pods
        assert len(prometheus.queries) == 1 and metrics_api.lists == [NS]
        clock.now = REF + timedelta(minutes=31)
        report = await culler.run_pass()
        decisions = {user: report.decisions[(user, "")] for user, _ in
                     (s.key for s in servers)}
        for d in decisions.values():
            assert d.signals["cpu"] == f"unknown: {NO_METRICS_SERVER}"
        idle = decisions["idle"]
        assert idle.action == "suspend" and idle.reason == "idle for 1860s (timeout 1800s)"
        assert idle.signals["gpu"] == "0.0% compute via dcgm (threshold 5%)"
        assert decisions["gpubusy"].action == "keep"
        assert decisions["gpubusy"].reason == "active now: gpu"
        assert decisions["gpubusy"].signals["gpu"].startswith("91.0% compute via dcgm")
        half = decisions["halfseen"]
        assert half.action == "keep"
        assert half.signals["gpu"] == ("unknown: GPU 2 of pod jhub/jupyter-halfseen: no "
                                       "DCGM_FI_PROF_GR_ENGINE_ACTIVE sample for GPU 2 of pod "
                                       "jhub/jupyter-halfseen")
        assert half.reason.endswith("not suspending: neither GPU nor CPU could be read")
        assert decisions["cpuonly"].signals["gpu"] == "no gpu"
        assert decisions["cpuonly"].action == "suspend"
        assert decisions["kernel"].reason == "active now: kernels"
        assert {(b["user"], b["reason"]) for b in hub.stops} == {("idle", "idle"),
                                                                 ("cpuonly", "idle")}

        # Prometheus goes away: the slice servers' GPU is unknown and names it; with
        # the CPU unknown too, no GPU server is suspended.
        await prometheus.stop()
        await asyncio.sleep(0.6)
        kept = pod_server("later", "slice")
        kept.started = clock.now - timedelta(hours=1)
        hub.servers[kept.key] = kept
        hub._models = None
        clock.now += timedelta(minutes=40)
        report = await culler.run_pass()
        later = report.decisions[kept.key]
        assert later.action == "keep"
        assert later.signals["gpu"].startswith(f"unknown: Prometheus at {prometheus.url}")
        assert report.stops == {}
    finally:
        http.stop()
        await hub_client.close()
        await cpu.close()
        await prometheus.stop()
        await metrics_api.stop()


async def test_dra_servers_are_read_where_the_exporter_attributes_them_else_judged_on_the_rest():
    """DRA mode: dcgm-exporter with KUBERNETES_ENABLE_DRA labels a claim's devices with their
    pod (and the claim): read as any other. Without it the series carry no pod: the culler
    says there is no GPU reading and judges on the other signals (here a readable CPU)."""
    servers = [pod_server("attributed", "slice"), pod_server("cards", "two"),
               pod_server("unread", "two"), pod_server("unreadbusy", "slice")]
    prometheus = await PrometheusDouble([
        dcgm_series("GPU-1", 0.0, pod="jupyter-attributed", namespace=NS, instance=3,
                    dra_claim="jupyter-attributed-gpus-x1", mig_uuid="MIG-1"),
        dcgm_series("GPU-2", 0.5, gpu=1, pod="jupyter-cards", namespace=NS,
                    dra_claim="jupyter-cards-gpus-x2"),
        dcgm_series("GPU-3", 0.0, gpu=2, pod="jupyter-cards", namespace=NS,
                    dra_claim="jupyter-cards-gpus-x2"),
        dcgm_series("GPU-4", 0.9, gpu=3), dcgm_series("GPU-5", 0.9, gpu=4),  # no pod labels
    ]).start()
    metrics_api = await MetricsApiDouble().start()
    metrics_api.pods[NS] = [pod_metrics(f"jupyter-{s.user}", NS, notebook="0")
                            for s in servers[:3]] + [
        pod_metrics("jupyter-unreadbusy", NS, notebook="900000000n")]

    async def api() -> client.ApiClient:
        return client.ApiClient(client.Configuration(host=metrics_api.url))

    clock = Clock(REF)
    hub, http, hub_client = await start(servers, profiles=PROFILES, clock=clock)
    cpu = PodMetricsCpuSource(api, cache_s=0)
    culler = Culler(hub_client, cpu, PrometheusDcgmSource(prometheus.url, cache_s=0),
                    notices=RecordingNotices(), config=CullerConfig(), clock=clock)
    try:
        await culler.run_pass()
        clock.now = REF + timedelta(minutes=31)
        report = await culler.run_pass()
        d = {s.user: report.decisions[s.key] for s in servers}
        assert d["attributed"].signals["gpu"] == "0.0% compute via dcgm (threshold 5%)"
        assert d["attributed"].action == "suspend"
        assert d["cards"].signals["gpu"].startswith("50.0% compute via dcgm")
        assert d["cards"].action == "keep"
        why = ("unknown: no GPU reading: dcgm-exporter attributes no device to pod "
               "jhub/jupyter-unread (it maps devices to pods from the kubelet; a DRA claim's "
               "only with KUBERNETES_ENABLE_DRA, and a DRA MIG slice's instance not at all)")
        assert d["unread"].signals["gpu"] == why
        assert d["unread"].action == "suspend", d["unread"]  # idle kernels, idle CPU
        assert d["unreadbusy"].action == "keep" and d["unreadbusy"].reason == "active now: cpu"
    finally:
        http.stop()
        await hub_client.close()
        await cpu.close()
        await prometheus.stop()
        await metrics_api.stop()
