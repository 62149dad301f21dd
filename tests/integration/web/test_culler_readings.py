"""The culler's GPU readings for researchers (issue 47): memory in use from NVML (a double of
pynvml) and from dcgm-exporter through Prometheus (a double of its HTTP API), and the readings
loop's batch to the gpulease service's `PUT api/gpu-readings` (a recording stand-in for the
service) beside passes that a failing PUT never stops. Nothing unread is ever a number."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta

import pytest
from tornado import web

from gpulease.idle_culler.gpu import (
    DCGM_FB_QUERY,
    DCGM_METRIC,
    NoGpuSource,
    NvmlGpuSource,
    PrometheusDcgmSource,
    StaticGpuSource,
)
from gpulease.idle_culler.hubapi import ServerInfo
from gpulease.idle_culler.readings import MAX_WHY, GpuReading, ReadingsLoop, server_reading
from tests.support.culler_fakehub import REF, Clock, FakeHandler, FakeServer, culler_for, start
from tests.support.nvml_double import NvmlDouble
from tests.support.prometheus_double import PrometheusDouble, dcgm_fb_series, dcgm_series

GIB = 1 << 30
NS = "jhub"

# --- NVML ------------------------------------------------------------------------------


async def test_nvml_memory_of_a_full_card_and_of_a_mig_device():
    nvml = NvmlDouble({"GPU-1": 50}, {"MIG-a": ("GPU-1", 3)},
                      memory={"GPU-1": (3 * GIB, 80 * GIB), "MIG-a": (GIB, 18 * GIB)})
    source = NvmlGpuSource(nvml)
    assert await source.read_memory(["GPU-1", "MIG-a"]) == {
        "GPU-1": (3 * GIB, 80 * GIB), "MIG-a": (GIB, 18 * GIB)}  # the instance's, not the card's
    assert source.describe_memory("MIG-a") == "nvml"
    assert "memory MIG-a" in nvml.calls


async def test_nvml_memory_unread_is_none_with_why():
    source = NvmlGpuSource(NvmlDouble({"GPU-1": 0}, {}))  # the driver answers Not Supported
    assert await source.read_memory(["GPU-1", "GPU-9"]) == {"GPU-1": None, "GPU-9": None}
    assert source.describe_memory("GPU-1") == "NVML: Not Supported"
    assert source.describe_memory("GPU-9") == "NVML: Not Found"
    source = NvmlGpuSource(NvmlDouble({}, {}, library=False))
    assert await source.read_memory(["GPU-1"]) == {"GPU-1": None}
    assert "Library Not Found" in source.describe_memory("GPU-1")


async def test_the_readings_twin_keeps_its_own_gpm_samples():
    """GPM's utilisation is between a source's last two samples: the readings loop's reads
    through the twin must not leave a pass only the last seconds of its interval."""
    nvml = NvmlDouble({}, {"MIG-a": ("GPU-1", 3)})
    source = NvmlGpuSource(nvml)
    twin = source.for_readings()
    assert twin is not source and twin.nvml is nvml
    await source.read(["MIG-a"])  # the pass's first sample
    await asyncio.sleep(0.2)
    nvml.gi_busy_time[("GPU-1", 3)] = 0.1  # busy half of the pass's 0.2 s
    await twin.read(["MIG-a"])  # the loop samples in between
    value = (await source.read(["MIG-a"]))["MIG-a"]
    assert value is not None and 20 < value < 80  # a shared sample would leave ~0
    assert source.describe("MIG-a") == "gpm"
    for other in (NoGpuSource(), StaticGpuSource()):
        assert other.for_readings() is other


# --- dcgm-exporter through Prometheus ---------------------------------------------------


async def test_dcgm_memory_joins_as_activity_does_in_one_query_a_refresh():
    fb = [*dcgm_fb_series("GPU-a", 2048, 79 * 1024, pod="jupyter-ada", namespace=NS),
          *dcgm_fb_series("GPU-b", 512, 17 * 1024, gpu=1, pod="jupyter-bob", namespace=NS,
                          instance=3),
          *dcgm_fb_series("GPU-b", 9000, 9432, gpu=1, instance=5),  # a slice no pod holds
          dcgm_fb_series("GPU-c", 100, 100, gpu=2)[0]]  # its FB_FREE missing
    activity = [dcgm_series("GPU-a", 0.5, pod="jupyter-ada", namespace=NS),
                dcgm_series("GPU-b", 0.0, gpu=1, pod="jupyter-bob", namespace=NS, instance=3)]
    async with PrometheusDouble(activity, fb) as prometheus:
        source = PrometheusDcgmSource(prometheus.url, mig_map={"MIG-x": ("GPU-b", 5)})
        assert source.for_readings() is source  # the cached queries are shared
        devices = [*await source.pod_devices(NS, "jupyter-ada"),
                   *await source.pod_devices(NS, "jupyter-bob")]
        assert devices == ["GPU-a", "GPU-b/gi3"]
        assert await source.read_memory([*devices, "MIG-x", "GPU-c"]) == {
            "GPU-a": (2 * GIB, 81 * GIB), "GPU-b/gi3": (512 << 20, 17.5 * GIB),
            "MIG-x": (9000 << 20, 18432 << 20), "GPU-c": None}
        assert source.describe_memory("GPU-a") == "dcgm"
        assert "no DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE samples for GPU-c" == \
            source.describe_memory("GPU-c")
        await source.read_memory(["GPU-a"])  # cached
        assert prometheus.queries == [DCGM_METRIC, DCGM_FB_QUERY]


async def test_dcgm_memory_of_a_dra_slice_that_cannot_be_told_apart_is_unread():
    """Two 1g instances of GPU-n labelled with cy's one 1g claim: neither is known to be
    cy's, so neither's memory is (the rule of gpu.dra_slice); ada's own 3g instance is."""
    series, fb = [], []
    for instance, pod, profile in ((1, "jupyter-ada", "3g.71gb"), (9, "jupyter-cy", "1g.18gb"),
                                   (10, "jupyter-cy", "1g.18gb")):
        uuid = "GPU-m" if pod == "jupyter-ada" else "GPU-n"
        labels = {"pod": pod, "namespace": NS, "instance": instance, "profile": profile,
                  "dra_claim": f"{pod}-gpus"}
        series.append(dcgm_series(uuid, 0.5, **labels))
        fb += dcgm_fb_series(uuid, 1024, 1024, **labels)
    for item in [*series, *fb]:
        item["metric"]["dra_device_name"] = {1: "gpu-0-mig-3g-1"}.get(
            int(item["metric"]["GPU_I_ID"]), "gpu-1-mig-1g-9")
    async with PrometheusDouble(series, fb) as prometheus:
        source = PrometheusDcgmSource(prometheus.url)
        ada = await source.pod_devices(NS, "jupyter-ada")
        cy = await source.pod_devices(NS, "jupyter-cy")
        assert ada == ["GPU-m/gi1"] and cy == ["GPU-n/gpu-1-mig-1g-9"]
        assert await source.read_memory(ada + cy) == {ada[0]: (GIB, 2 * GIB), cy[0]: None}
        assert "2 1g.18gb instances of GPU-n" in source.describe_memory(cy[0])


async def test_dcgm_memory_with_prometheus_failing_is_unread_with_why():
    async with PrometheusDouble() as prometheus:
        prometheus.fail = 503
        source = PrometheusDcgmSource(prometheus.url)
        assert await source.read_memory(["GPU-a"]) == {"GPU-a": None}
        assert source.describe_memory("GPU-a").startswith(f"Prometheus at {prometheus.url}")


# --- the readings loop ------------------------------------------------------------------


class GpuReadingsHandler(FakeHandler):
    """The stand-in for the service's `PUT api/gpu-readings`: records each batch, or fails."""

    def put(self) -> None:
        if self.hub.readings_fail:
            raise web.HTTPError(503)
        self.hub.readings.append(json.loads(self.request.body))
        self.set_status(204)


async def start_with_readings(servers, **kw):
    hub, http, client = await start(servers, **kw)
    hub.readings, hub.readings_fail = [], False
    app = http.request_callback  # the tornado Application the stand-in serves
    app.add_handlers(".*", [(r"/services/gpulease/api/gpu-readings", GpuReadingsHandler,
                             {"hub": hub})])
    return hub, http, client


def fleet() -> list[FakeServer]:
    return [FakeServer("ada", "", "gpu-busy", devices=["MIG-1", "MIG-2"]),
            FakeServer("bob", "train", "idle", devices=["MIG-3"]),
            FakeServer("cy", "", "idle", profile="cpu", devices=[])]


async def test_one_batch_for_the_gpu_servers_and_null_with_why_where_unread():
    servers = fleet()
    clock = Clock(REF)
    hub, http, client = await start_with_readings(
        servers, clock=clock, profiles={"h200-1g": ("30m", "0"), "cpu": ("30m", "0", None)})
    culler = culler_for(client, servers, clock)
    # ada's two slices: busy and quiet (their mean), memory summed; bob's slice unreadable
    culler.gpu = StaticGpuSource({"MIG-1": 60.0, "MIG-2": 1.0, "MIG-3": None},
                                 memory={"MIG-1": (GIB, 18 * GIB), "MIG-2": (2 * GIB, 18 * GIB)})
    try:
        await culler.run_pass()
        loop = ReadingsLoop(culler)
        assert await loop.tick()
    finally:
        http.stop()
        await client.close()
    started = "2025-03-03T07:00:00Z"  # each server's start, as the hub listed it
    assert hub.readings == [{"interval_s": 10.0, "servers": [
        {"user": "ada", "server": "", "started": started, "activity": 30.5,
         "memory_used_bytes": 3 * GIB, "memory_total_bytes": 36 * GIB, "source": "",
         "why": ""},  # 'static' is no source
        {"user": "bob", "server": "train", "started": started, "activity": None,
         "memory_used_bytes": None, "memory_total_bytes": None, "source": "",
         "why": "MIG-3: set unknown by the test; memory: MIG-3: no memory set by the test"},
    ]}]  # cy holds no GPU: no line


def test_a_server_with_one_device_unread_has_no_mean():
    """A busy device beside an unread one: the mean could be anything from half its value
    up, so none is sent (the culler's idleness still counts the busy one as busy)."""
    ada = fleet()[0]
    info = ServerInfo(ada.user, ada.name, ada.url, ada.started, None, ada.profile, None)
    source = StaticGpuSource({"MIG-1": 90.0, "MIG-2": None})
    line = server_reading(info, source, {"MIG-1": 90.0, "MIG-2": None}, {}, 5.0)
    assert line.activity is None and "MIG-2: set unknown by the test" in line.why


async def test_a_failing_put_never_stops_the_passes_and_is_logged_once(caplog):
    servers = fleet()[:1]
    clock = Clock(REF)
    hub, http, client = await start_with_readings(servers, clock=clock)
    hub.readings_fail = True
    culler = culler_for(client, servers, clock, interval_s=0.2, readings_interval_s=0.05)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="gpulease.culler")
    try:
        task = asyncio.create_task(culler.run_forever(stop))
        await asyncio.sleep(0.7)
        assert len(hub.activity_reads) >= 3  # the passes go on
        failures = [r for r in caplog.records if "not taken" in r.getMessage()]
        assert len(failures) == 1 and "HTTP 503" in failures[0].getMessage()
        hub.readings_fail = False
        clock.now = REF + timedelta(seconds=1)
        await asyncio.sleep(0.3)
        assert hub.readings and hub.readings[-1]["servers"][0]["user"] == "ada"
        assert any("taken again" in r.getMessage() for r in caplog.records)
        stop.set()
        await asyncio.wait_for(task, 5)
    finally:
        http.stop()
        await client.close()


def test_the_option_and_its_environment_default():
    from gpulease.idle_culler.app import parse_args

    base = ["--hub-url", "http://127.0.0.1:1"]
    assert parse_args(base, env={}).readings_interval == 10.0
    assert parse_args(base, env={"GPULEASE_CULLER_READINGS_INTERVAL": "0"}).readings_interval == 0
    assert parse_args([*base, "--readings-interval", "2.5"], env={}).readings_interval == 2.5
    for bad in ("0.5", "301", "-1"):  # what the service would refuse every push of
        with pytest.raises(SystemExit):
            parse_args([*base, "--readings-interval", bad], env={})


async def test_readings_off_sends_nothing():
    servers = fleet()[:1]
    clock = Clock(REF)
    hub, http, client = await start_with_readings(servers, clock=clock)
    culler = culler_for(client, servers, clock, interval_s=0.1, readings_interval_s=0)
    stop = asyncio.Event()
    try:
        task = asyncio.create_task(culler.run_forever(stop))
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 5)
    finally:
        http.stop()
        await client.close()
    assert hub.readings == [] and hub.activity_reads


def test_a_long_why_is_cut_to_what_the_service_takes():
    reading = GpuReading("ada", "", "2025-03-03T07:00:00Z", None, None, None, "", "x" * 2000)
    assert reading.as_json()["why"] == "x" * MAX_WHY
