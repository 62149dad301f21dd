"""The culler's signal readers: pushed kernel state and its freshness, CPU of a process tree,
NVML/GPM, Prometheus."""

import asyncio
import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from tornado import web

from gpulease.idle_culler.cpu import ProcessTreeCpuSource, TreeSample, percent_between
from gpulease.idle_culler.gpu import (
    DCGM_METRIC,
    NoGpuSource,
    NvmlGpuSource,
    PrometheusDcgmSource,
    StaticGpuSource,
    combine,
)
from gpulease.idle_culler.hubapi import parse_holders, parse_profiles, servers_from_users
from gpulease.idle_culler.pushed import NOT_PUSHED, parse_server_activity, view_for
from tests.support.nvml_double import NvmlDouble

# --- pushed kernels and terminals ---------------------------------------------------

# As the gpulease service answers GET api/server-activity.
ACTIVITY_JSON = """{"since": "2025-03-03T06:00:00.000Z", "now": "2025-03-03T09:42:00.000Z",
 "servers": [
  {"user": "ada", "server": "", "pushed": "2025-03-03T09:41:50.000Z",
   "kernels": [{"id": "0b4f", "execution_state": "busy", "connections": 0,
                "last_activity": "2025-03-03T09:41:07.123Z"},
               {"id": "9c2e", "execution_state": "idle", "connections": 2,
                "last_activity": "2025-03-03T08:12:00.000Z"}],
   "terminals": {"count": 2, "last_activity": "2025-03-03T09:30:00.500Z"},
   "last_kernel_activity": "2025-03-03T09:41:40.000Z"},
  {"user": "bob", "server": "gpu", "pushed": "2025-03-03T09:00:00.000Z",
   "kernels": [], "terminals": null}]}"""
NOW = datetime(2025, 3, 3, 9, 42, tzinfo=UTC)
STARTED = datetime(2025, 3, 3, 8, tzinfo=UTC)


def test_pushed_state_parser_reads_state_activity_clients_and_terminals():
    activity = parse_server_activity(json.loads(ACTIVITY_JSON))
    assert activity.since == datetime(2025, 3, 3, 6, tzinfo=UTC)
    ada = activity.servers[("ada", "")]
    assert [k.id for k in ada.kernels] == ["0b4f", "9c2e"]
    assert ada.kernels[0].execution_state == "busy" and ada.kernels[1].connections == 2
    assert ada.kernels[0].last_activity == datetime(2025, 3, 3, 9, 41, 7, 123000, tzinfo=UTC)
    assert ada.terminals == 2
    assert ada.terminals_last_activity == datetime(2025, 3, 3, 9, 30, 0, 500000, tzinfo=UTC)
    assert ada.kernels_last_activity == datetime(2025, 3, 3, 9, 41, 40, tzinfo=UTC)
    bob = activity.servers[("bob", "gpu")]
    assert bob.kernels == () and bob.terminals is None
    assert bob.kernels_last_activity is None  # a server that does not say
    with pytest.raises(ValueError):
        parse_server_activity({"message": "Forbidden"})


def test_freshness_rule():
    activity = parse_server_activity(json.loads(ACTIVITY_JSON))
    fresh = view_for(activity, "", ("ada", ""), STARTED, NOW)
    assert fresh.kind == "fresh" and fresh.source == "pushed 10s ago" and not fresh.hold
    assert fresh.kernels[0].execution_state == "busy"
    assert fresh.kernels_last_activity == datetime(2025, 3, 3, 9, 41, 40, tzinfo=UTC)
    # Older than stale_after_s: nothing is busy now; busy kernels were active until the push.
    stale = view_for(activity, "", ("ada", ""), STARTED, NOW + timedelta(minutes=4))
    assert stale.kind == "stale" and "stale: pushed 250s ago" in stale.source
    assert [(k.execution_state, k.last_activity) for k in stale.kernels] == [
        ("idle", datetime(2025, 3, 3, 9, 41, 50, tzinfo=UTC)),
        ("idle", datetime(2025, 3, 3, 8, 12, tzinfo=UTC))]
    assert stale.kernels_last_activity == datetime(2025, 3, 3, 9, 41, 40, tzinfo=UTC)
    # A push of an earlier run of the server does not count; a server that never
    # pushed is judged on the hub's activity, unless its push may still be on its way.
    restarted = view_for(activity, "", ("bob", "gpu"), NOW - timedelta(minutes=10), NOW)
    assert restarted.kind == "not_pushed" and restarted.hub_activity_only
    assert restarted.error == NOT_PUSHED
    waiting = view_for(activity, "", ("cy", ""), NOW - timedelta(seconds=30), NOW)
    assert waiting.kind == "waiting" and waiting.kernels is None and "no push yet" in waiting.hold
    unknown = view_for(None, "HTTP 503", ("ada", ""), STARTED, NOW)
    assert unknown.kind == "unknown" and "HTTP 503" in unknown.hold


def test_hub_models_to_servers_profiles_and_holders():
    users = [{"name": "ada", "servers": {
        "": {"ready": True, "pending": None, "started": "2025-03-03T08:00:00.000000Z",
             "last_activity": "2025-03-03T09:00:00.000000Z", "url": "/user/ada/",
             "user_options": {"profile": "h200-1g"},
             "state": {"pid": 4242, "gpulease_devices": ["MIG-aa"]}},
        "gpu2": {"ready": False, "pending": "spawn", "started": None, "url": "/user/ada/gpu2/"},
    }}]
    [info] = servers_from_users(users)
    assert info.key == ("ada", "") and info.profile == "h200-1g" and info.state["pid"] == 4242
    assert info.started == datetime(2025, 3, 3, 8, tzinfo=UTC)
    limits = parse_profiles({"profiles": [{"slug": "h200-1g", "idle_timeout": "30m",
                                           "max_runtime": "1h30m"},
                                          {"slug": "cpu", "idle_timeout": "0",
                                           "max_runtime": "0"}]})
    assert limits["h200-1g"].idle_timeout_s == 1800 and limits["h200-1g"].max_runtime_s == 5400
    assert limits["cpu"].idle_timeout_s == 0
    inv = {"nodes": [{"gpus": [{"devices": [
        {"uuid": "MIG-aa", "holder": {"user": "ada", "server": ""}},
        {"uuid": "MIG-bb", "holder": None}]}]}]}
    assert parse_holders(inv) == {("ada", ""): ["MIG-aa"]}


def test_a_profile_saved_as_a_list_of_one_is_that_profile():
    # The hub takes a form's lists of one in user_options; read as "['short']", no
    # profile's max_runtime applied (saved so before the hub saved plain strings).
    users = [{"name": "lena", "servers": {"": {
        "ready": True, "pending": None, "started": "2025-03-03T08:00:00Z", "url": "/user/lena/",
        "user_options": {"profile": ["short"]}}}}]
    [info] = servers_from_users(users)
    assert info.profile == "short"


# --- CPU of a real process tree -----------------------------------------------------

BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
# The burner runs as a grandchild: the whole tree counts, not only the top pid.
PARENT = ("import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])")


def test_percent_between_samples():
    a = TreeSample(10, 1.0, 100.0, 5.0)
    assert percent_between(a, TreeSample(10, 1.0, 102.0, 6.0)) == 50.0
    assert percent_between(a, TreeSample(10, 1.0, 101.0, 4.0)) == 0.0  # a child vanished
    assert percent_between(a, TreeSample(10, 2.0, 101.0, 9.0)) is None  # pid reused


async def test_cpu_of_a_burning_tree_versus_a_sleeping_one():
    burner = subprocess.Popen([sys.executable, "-c", PARENT, BURN])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        source = ProcessTreeCpuSource()
        await asyncio.sleep(0.3)  # let the grandchild start
        first = await source.read(("b", ""), {"pid": burner.pid})
        assert first.percent is None and "first sample" in first.error
        await source.read(("s", ""), {"pid": sleeper.pid})
        await asyncio.sleep(1.0)
        busy = await source.read(("b", ""), {"pid": burner.pid})
        quiet = await source.read(("s", ""), {"pid": sleeper.pid})
        # A burner gets less than a core when the machine's two are busy (CI runs
        # hubs alongside): far above the sleeper is what tells them apart.
        assert busy.percent is not None and busy.percent > 20, busy
        assert quiet.percent is not None and quiet.percent < 5, quiet
    finally:
        for p in (burner, sleeper):
            p.kill()
            p.wait()
    gone = await source.read(("s", ""), {"pid": sleeper.pid})
    assert gone.percent is None and "not found" in gone.error
    assert "admin:server_state" in (await source.read(("x", ""), None)).error
    assert "no pid" in (await source.read(("x", ""), {})).error
    source.forget(set())
    assert source.samples == {}


# --- NVML against a double of pynvml (read only) ------------------------------------

async def test_nvml_utilisation_for_a_full_card():
    nvml = NvmlDouble({"GPU-1": 87, "GPU-2": 0}, {})
    source = NvmlGpuSource(nvml)
    values = await source.read(["GPU-1", "GPU-2"])
    assert values == {"GPU-1": 87.0, "GPU-2": 0.0}
    assert source.describe("GPU-1") == "nvml"
    assert (await source.read(["GPU-9"]))["GPU-9"] is None
    assert "Not Found" in source.describe("GPU-9")


async def test_gpm_for_a_mig_device_needs_two_samples():
    nvml = NvmlDouble({"GPU-1": 0}, {"MIG-a": ("GPU-1", 3)})
    source = NvmlGpuSource(nvml)
    assert (await source.read(["MIG-a"]))["MIG-a"] is None
    assert "first sample" in source.describe("MIG-a")
    await asyncio.sleep(0.2)
    nvml.gi_busy_time[("GPU-1", 3)] = 0.1  # busy half of the 0.2 s
    value = (await source.read(["MIG-a"]))["MIG-a"]
    assert value is not None and 20 < value < 60
    assert source.describe("MIG-a") == "gpm"
    assert "gpm GPU-1 3" in nvml.calls and "util" not in nvml.calls
    assert len(nvml.allocated) == 1  # the previous sample is freed, the latest kept
    source.forget(set())
    assert nvml.allocated == set()


async def test_mig_without_gpm_is_unknown_and_no_driver_is_unknown():
    source = NvmlGpuSource(NvmlDouble({}, {"MIG-a": ("GPU-1", 1)}, gpm_supported=False))
    assert await source.read(["MIG-a"]) == {"MIG-a": None}
    assert "without GPM" in source.describe("MIG-a")
    source = NvmlGpuSource(NvmlDouble({}, {}, library=False))
    assert await source.read(["GPU-1"]) == {"GPU-1": None}
    assert "Library Not Found" in source.describe("GPU-1")


def test_combine_devices_busiest_wins_and_unknown_is_not_quiet():
    s = StaticGpuSource({"a": 0.0, "b": 70.0, "c": None})
    assert combine(s, {"a": 0.0, "b": 70.0}, 5.0) == (70.0, "static")
    assert combine(s, {"b": 70.0, "c": None}, 5.0) == (70.0, "static")
    assert combine(s, {"a": 0.0, "c": None}, 5.0)[0] is None
    assert combine(s, {}, 5.0)[0] is None
    none = NoGpuSource()
    assert combine(none, {"x": None}, 5.0) == (None, "x: no GPU activity source configured")


# --- Prometheus / dcgm-exporter -------------------------------------------------------

PROM_ANSWER = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": DCGM_METRIC, "UUID": "GPU-full", "gpu": "0", "pod": "jupyter-ada"},
     "value": [1741000000.0, "0.83"]},
    {"metric": {"__name__": DCGM_METRIC, "UUID": "GPU-mig", "GPU_I_ID": "3",
                "GPU_I_PROFILE": "1g.18gb"}, "value": [1741000000.0, "0.004"]},
    {"metric": {"__name__": DCGM_METRIC, "UUID": "GPU-mig", "GPU_I_ID": "5"},
     "value": [1741000000.0, "0.51"]},
]}}


class QueryHandler(web.RequestHandler):
    def get(self):
        self.application.settings["queries"].append(self.get_argument("query"))
        self.finish(PROM_ANSWER)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_prometheus_dcgm_joins_by_uuid_and_gpu_instance():
    queries: list[str] = []
    app = web.Application([(r"/api/v1/query", QueryHandler)], queries=queries)
    port = free_port()
    server = app.listen(port, address="127.0.0.1")
    try:
        source = PrometheusDcgmSource(f"http://127.0.0.1:{port}",
                                      mig_map={"MIG-x": ("GPU-mig", 3), "MIG-y": ("GPU-mig", 5)})
        values = await source.read(["GPU-full", "MIG-x", "MIG-y", "MIG-unmapped"])
        assert values["GPU-full"] == pytest.approx(83.0)
        assert values["MIG-x"] == pytest.approx(0.4)
        assert values["MIG-y"] == pytest.approx(51.0)
        assert values["MIG-unmapped"] is None
        assert source.describe("MIG-y") == "dcgm"
        assert "no DCGM_FI_PROF_GR_ENGINE_ACTIVE sample" in source.describe("MIG-unmapped")
        await source.read(["GPU-full"])  # cached: one query per pass, not per server
        assert queries == [DCGM_METRIC]
    finally:
        server.stop()


async def test_prometheus_down_is_unknown():
    source = PrometheusDcgmSource(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    assert await source.read(["GPU-full"]) == {"GPU-full": None}
    assert source.describe("GPU-full").startswith("Prometheus at http://127.0.0.1:")
