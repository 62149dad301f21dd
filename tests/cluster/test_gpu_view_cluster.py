"""Issue 47 in the cluster shape: a researcher sees what their GPU does and what it costs.

`gpulease up --GPULeaseHub.shape=cluster` on the test control plane (cluster_hub_at), its
culler given `culler_prometheus_url`: a test double of Prometheus's HTTP API
(tests/support/prometheus_double.py, standing for Prometheus scraping dcgm-exporter; no
DCGM, exporter or GPU runs here), served from a thread of this test. A researcher starts
a one-card H200 profile through the hub's API; KubeSpawner makes its pod, kube-scheduler
places it on an emulated H200 node and the kubelet emulator runs it, handing it the node's
one card. The double serves DCGM_FI_PROF_GR_ENGINE_ACTIVE and DCGM_FI_DEV_FB_USED / _FREE
for that card, labelled with the pod as dcgm-exporter labels it. The real culler (the
hub's managed service) lists the server through the hub's API, finds the pod's card by
those labels, and its readings loop (idle-culler/readings.py) pushes
`PUT api/gpu-readings` to the real gpulease service. What the test shows:

- `GET api/me/gpu` with the pod's own token (its JUPYTERHUB_API_TOKEN) gives the reading
  as served (activity, memory used and total, to the byte), source "dcgm", the profile,
  its rate, and a cost so far, balance and runway that agree with the session and the
  credit granted; the researcher's own token gives the same; another researcher's token
  (an admin's too) is 403 naming the first researcher (`?user=`), and without it sees
  only their own, empty view; the pod's token for another server of its owner is 403;
- the same figures from inside the pod: gpulease.singleuser's `gpulease/gpu` handler
  (singleuser/gpu_status.py) of the pod's real Jupyter server, which asks the service
  with the pod's token, reached through the proxy with the owner's token (another
  researcher's is 403 there);
- where the double serves activity but no framebuffer series for the card, the memory
  is null with why, and where it serves nothing for the pod at all, the whole reading
  is null with why (dcgm-exporter attributes no device to the pod), never a number; the
  handler in the pod passes the null on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gpulease.core.billing.rules import billed_ms
from gpulease.core.units import format_credits, ms_cost
from gpulease.idle_culler.gpu import (
    DCGM_FB_FREE,
    DCGM_FB_QUERY,
    DCGM_FB_USED,
    DCGM_METRIC,
    no_gpu_reading,
)
from gpulease.site_urls import loopback_session
from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube
from tests.cluster.nodes import GpuNode
from tests.cluster.pod_plan import DEVICES_ANNOTATION
from tests.cluster.test_gpulease_up_cluster import PW, cluster_hub_at, pod_of, start
from tests.support.hubproc import HubProcess
from tests.support.prometheus_double import PrometheusDouble, dcgm_fb_series, dcgm_series

MIB = 1 << 20
RATE = "36"  # credits an hour
RATE_UCR = 36_000_000
CREDIT = "100"
CARD = {"slug": "card", "display_name": "One H200", "gpu": {"model": "H200", "count": 1},
        "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": RATE,
        "min_run": "1s"}
# What the double serves: exact binary fractions, so that the percent is exact too.
BUSY = 0.375  # DCGM's engine-active ratio: 37.5 %
USED_MIB, FREE_MIB = 4321, 139_450  # an H200's 143,771 MiB framebuffer
QUIET = 0.125  # 12.5 %
HEARTBEAT = 1.0  # the session's cost is confirmed every second
READING_TIMEOUT_S = 45  # the culler's pass (1 s), its Prometheus cache (5 s), a push (1 s)


class ThreadedPrometheus:
    """The Prometheus double on an event loop of its own thread (the hub's helpers and
    this test are synchronous); `double.series` and `memory_series` are swapped whole."""

    def __init__(self) -> None:
        self.double = PrometheusDouble()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> PrometheusDouble:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.double.start(), self.loop).result(10)
        return self.double

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.double.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def gpu_view(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
             tmp_path: Path) -> Iterator[tuple[HubProcess, PrometheusDouble, str]]:
    """The cluster hub whose culler reads the double every second; the node's one card."""
    (node,) = gpu_nodes(GpuNode("h200", gpus=1))
    (card,) = json.loads(node["metadata"]["annotations"][DEVICES_ANNOTATION])["nvidia.com/gpu"]
    with ThreadedPrometheus() as prometheus, cluster_hub_at(
            control_plane, kube, namespace, tmp_path, profiles={"profiles": [CARD]},
            extra_args=(f"--GPULeaseHub.culler_prometheus_url={prometheus.url}",
                        "--GPULeaseHub.culler_interval=1",
                        "--GPULeaseHub.culler_readings_interval=1",
                        f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}",
                        "--Spawner.poll_interval=1")) as hub:
        yield hub, prometheus, card


def serve(prometheus: PrometheusDouble, card: str, namespace: str, ratio: float | None,
          memory: bool) -> None:
    """The card's series as dcgm-exporter labels them with alice's pod: its activity
    (none where `ratio` is None) and, with `memory`, its framebuffer used and free."""
    pod = {"pod": "jupyter-alice", "namespace": namespace}
    prometheus.series = [] if ratio is None else [dcgm_series(card, ratio, **pod)]
    prometheus.memory_series = dcgm_fb_series(card, USED_MIB, FREE_MIB, **pod) if memory else []


def wait_for(what: str, ask: Callable[[], dict], ok: Callable[[dict], bool],
             hub: HubProcess, timeout: float = READING_TIMEOUT_S) -> dict:
    """`ask()` until `ok` of its answer; the last answer and the hub's log's end if never."""
    deadline = time.monotonic() + timeout
    answer: dict = {}
    while time.monotonic() < deadline:
        answer = ask()
        if ok(answer):
            return answer
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout} s; last answer {answer}\n"
                         f"{hub.log()[-4000:]}")


def my_gpu(hub: HubProcess, token: str, query: str = "") -> dict:
    r = hub.service("GET", f"api/me/gpu{query}", token)
    assert r.status_code == 200, r.text
    return r.json()


def in_pod(hub: HubProcess, token: str) -> dict:
    """The pod's own `gpulease/gpu` (gpulease.singleuser), through the proxy."""
    r = loopback_session().get(hub.server_url("alice", "", "gpulease/gpu"), timeout=30,
                               headers={"Authorization": f"token {token}"})
    assert r.status_code == 200, r.text
    return r.json()


def moment(iso: str) -> dt.datetime:
    """An API time (ISO 8601 with Z) as naive UTC, as the sessions are stored."""
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).replace(tzinfo=None)


def costs_agree(view: dict, started: str) -> bool:
    """The cost so far is the rate over the session to its last confirmation (`as_of`), to
    the micro-credit; the balance is the credit less it (both count to that heartbeat);
    the runway is how long that balance lasts at the rate. False where a heartbeat fell
    between the service's reads of the session and of the balance (ask again)."""
    cost = ms_cost(billed_ms(moment(started), moment(view["as_of"])), RATE_UCR)
    assert view["cost_so_far"] == format_credits(cost), (view, started)
    balance = int(Decimal(view["balance"]) * 1_000_000)
    if balance != int(Decimal(CREDIT) * 1_000_000) - cost:
        return False
    assert view["runway_s"] == balance * 3600 // RATE_UCR, view
    return True


def test_a_pods_gpu_and_cost_through_dcgm_to_its_researcher_only(
        gpu_view: tuple[HubProcess, PrometheusDouble, str], kube: Kube, namespace: str):
    hub, prometheus, card = gpu_view
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", CREDIT)
    bob = hub.add_user(admin, "bob", CREDIT)
    serve(prometheus, card, namespace, BUSY, memory=True)

    assert start(hub, "alice", alice, "card").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=120)
    pod = pod_of(kube, namespace, "alice")
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    pod_token = env["JUPYTERHUB_API_TOKEN"]
    assert pod_token and pod_token not in (alice, bob)
    sessions = hub.service("GET", "api/usage", alice).json()["sessions"]
    (session,) = [s for s in sessions if s["ended"] is None]
    assert session["profile"] == "card"

    # The culler's reading of the card, as the double served it, to the pod's own token.
    view = wait_for("a dcgm reading of alice's card", lambda: my_gpu(hub, pod_token),
                    lambda v: (v["reading"] or {}).get("activity") is not None, hub)
    assert (view["user"], view["server"], view["account"]) == ("alice", "", "user:alice")
    assert (view["profile"], view["rate_per_hour"]) == ("card", "36.000000")
    reading = view["reading"]
    assert {k: reading[k] for k in reading if k != "at"} == {
        "activity": 37.5, "memory_used_bytes": USED_MIB * MIB,
        "memory_total_bytes": (USED_MIB + FREE_MIB) * MIB, "source": "dcgm", "why": ""}
    # the chart: every point so far is that card's, as served
    assert view["history"] and all(
        (p["activity"], p["memory_used_bytes"]) == (37.5, USED_MIB * MIB)
        for p in view["history"]), view["history"]
    # through the DCGM source: the activity query (the pass's, and the pod's devices by
    # its labels) and the framebuffer query (the readings loop's)
    assert DCGM_METRIC in prometheus.queries and DCGM_FB_QUERY in prometheus.queries
    wait_for("a cost so far, balance and runway that agree", lambda: my_gpu(hub, pod_token),
             lambda v: Decimal(v["cost_so_far"]) > 0 and costs_agree(v, session["started"]),
             hub, timeout=10)

    # Her own token sees the same server's view; nobody else's does.
    own = my_gpu(hub, alice, "?server=&user=alice")
    assert (own["user"], own["server"], own["profile"]) == ("alice", "", "card")
    assert own["reading"]["source"] == "dcgm" and own["reading"]["activity"] == 37.5
    for token, query in ((bob, "?user=alice"), (bob, "?user=alice&server="),
                         (admin, "?user=alice"),  # an admin too: this is her own view
                         (pod_token, "?server=other")):  # her pod's token: its server only
        r = hub.service("GET", f"api/me/gpu{query}", token)
        assert r.status_code == 403, (query, r.status_code, r.text)
    his = my_gpu(hub, bob)
    assert (his["user"], his["reading"], his["history"], his["profile"]) == \
        ("bob", None, [], None)
    assert his["balance"] == "100.000000" and his["cost_so_far"] is None

    # The same figures from inside the pod: its server's handler asks the service with
    # the pod's token; its owner reaches it through the proxy, another researcher never.
    shown = wait_for("the pod's gpulease/gpu with the reading", lambda: in_pod(hub, alice),
                     lambda v: "error" not in v and (v.get("reading") or {}).get(
                         "activity") == 37.5, hub, timeout=15)
    assert (shown["user"], shown["server"], shown["profile"], shown["rate_per_hour"]) == \
        ("alice", "", "card", "36.000000")
    assert {k: shown["reading"][k] for k in shown["reading"] if k != "at"} == {
        "activity": 37.5, "memory_used_bytes": USED_MIB * MIB,
        "memory_total_bytes": (USED_MIB + FREE_MIB) * MIB, "source": "dcgm", "why": ""}
    wait_for("the pod's cost, balance and runway that agree", lambda: in_pod(hub, alice),
             lambda v: Decimal(v["cost_so_far"]) > 0 and costs_agree(v, session["started"]),
             hub, timeout=15)
    r = loopback_session().get(hub.server_url("alice", "", "gpulease/gpu"), timeout=30,
                               headers={"Authorization": f"token {bob}"})
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "reading" not in r.text

    # Activity served, no framebuffer series: the memory is null with why, not a number.
    serve(prometheus, card, namespace, QUIET, memory=False)
    # (the source caches each query apart for 5 s: the two change a few seconds apart)
    view = wait_for("a reading without memory", lambda: my_gpu(hub, pod_token),
                    lambda v: (v["reading"] or {}).get("activity") == 12.5
                    and v["reading"]["memory_used_bytes"] is None, hub)
    reading = view["reading"]
    assert (reading["memory_used_bytes"], reading["memory_total_bytes"]) == (None, None)
    assert reading["source"] == "dcgm"
    assert reading["why"] == (f"memory: {card}: no {DCGM_FB_USED} and {DCGM_FB_FREE} "
                              f"samples for {card}"), reading

    # Nothing served for the pod: no reading at all, null with why, never a number.
    serve(prometheus, card, namespace, None, memory=False)
    view = wait_for("a null reading", lambda: my_gpu(hub, pod_token),
                    lambda v: v["reading"] is not None and v["reading"]["activity"] is None,
                    hub)
    reading = view["reading"]
    assert {k: reading[k] for k in reading if k != "at"} == {
        "activity": None, "memory_used_bytes": None, "memory_total_bytes": None,
        "source": "", "why": no_gpu_reading(namespace, "jupyter-alice")}, reading
    assert view["profile"] == "card" and view["rate_per_hour"] == "36.000000"
    shown = wait_for("the pod's gpulease/gpu with the null reading", lambda: in_pod(hub, alice),
                     lambda v: "error" not in v and v.get("reading") is not None
                     and v["reading"]["activity"] is None, hub, timeout=15)
    assert {k: shown["reading"][k] for k in shown["reading"] if k != "at"} == {
        k: reading[k] for k in reading if k != "at"}
    assert (shown["profile"], shown["rate_per_hour"]) == ("card", "36.000000")
