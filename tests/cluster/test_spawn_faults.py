"""Spawn faults in the cluster shape: a real JupyterHub runs GPUKubeSpawner, whose every
request to the API server goes through the fault proxy (tests/cluster/faults.py).

The pool has one MIG slice, so capacity held by a server that does not exist
shows at once: another start of that slice (alice's named server `other`,
which mounts the same home claim) is refused (queue_max_wait 0: a 503 at once,
naming what is free). For each fault: what the user sees (the start's answer
and the message its progress ends with, as the spawn page shows them), what
the cluster holds (pods, the home claim) and what the admission counts.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpulease.spawners.kube.cluster_runner import WATCH_READY_S
from tests.cluster.conftest import ControlPlane
from tests.cluster.faults import Fault, FaultProxy
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_gpu_kube_spawner_hub import gpu_hub_at
from tests.cluster.test_kubespawner import StockHub

SLICE = "h200-1g"  # the pool's one 1g.18gb slice
RETRY_TIMEOUT_S = 8  # kubespawner's k8s_api_request_retry_timeout here (default 30)
FAULT_CONFIG = f"""
c.JupyterHub.allow_named_servers = True
c.GPUKubeSpawner.queue_max_wait = 0
c.GPUKubeSpawner.k8s_api_request_retry_timeout = {RETRY_TIMEOUT_S}
"""
NO_ROOM = "No H200 node has 1 free for H200 slice 1g.18gb now"


@pytest.fixture
def hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, proxy: FaultProxy,
        tmp_path: Path) -> Iterator[StockHub]:
    """The GPU hub on one node of one slice, reaching the API server through the proxy;
    user alice, with credit."""
    with gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path,
                    nodes=(GpuNode("h200", mig={"1g.18gb": 1}),), server=proxy.url,
                    extra_config=FAULT_CONFIG) as (running, _home):
        assert running.api("POST", "/users/alice").status_code == 201
        yield running


def _path(name: str) -> str:
    return f"/users/alice/servers/{name}" if name else "/users/alice/server"


def start(hub: StockHub, name: str = "") -> requests.Response:
    return hub.api("POST", _path(name), json={"profile": SLICE})


def outcome(hub: StockHub, name: str = "", timeout: float = 120) -> tuple[bool, str]:
    """(ready, message) of the spawn as its progress ends: what the spawn page shows."""
    with requests.get(f"{hub.url}/hub/api{_path(name)}/progress", stream=True,
                      headers={"Authorization": f"token {hub.token}"}, timeout=timeout) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("ready") or event.get("failed"):
                    return bool(event.get("ready")), event.get("message", "")
    raise AssertionError(f"the progress of {_path(name)} ended without an outcome")


def server(hub: StockHub, name: str = "") -> dict:
    return hub.api("GET", "/users/alice").json()["servers"].get(name, {})


def runs(hub: StockHub, name: str = "") -> None:
    """The start succeeds and the hub says the server is ready."""
    r = start(hub, name)
    assert r.status_code in (201, 202), r.text + hub.tail()
    ready, message = outcome(hub, name)
    assert ready, message + hub.tail()
    assert server(hub, name)["ready"]


def fails(hub: StockHub, name: str = "") -> tuple[requests.Response, str]:
    """The start fails: its answer, and the message its progress ends with."""
    r = start(hub, name)
    ready, message = outcome(hub, name)
    assert not ready, f"the start of {_path(name)} succeeded"
    assert not server(hub, name), "the hub still has a server of the failed start"
    return r, message


def stop(hub: StockHub, kube: Kube, namespace: str, name: str = "") -> None:
    """Stop the server; until the hub forgets it and its pod is gone."""
    assert hub.api("DELETE", _path(name)).status_code in (202, 204)
    deadline = time.monotonic() + 60
    while server(hub, name):
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.3)
    kube.wait_for(f"the pod of {_path(name)} deleted", lambda: not pods(kube, namespace))


def pods(kube: Kube, namespace: str) -> list[str]:
    return [p["metadata"]["name"] for p in kube.get(pods_path(namespace))["items"]]


def claims(kube: Kube, namespace: str) -> list[str]:
    items = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims")["items"]
    return [c["metadata"]["name"] for c in items]


def refused_for_want_of_room(hub: StockHub) -> None:
    """The other start is refused at once: the one slice is counted as held."""
    r = start(hub, "other")
    assert r.status_code == 503 and NO_ROOM in r.json()["message"], r.text


def the_slice_is_free(hub: StockHub, kube: Kube, namespace: str) -> None:
    """Nothing holds the one slice: the other start runs (a ghost would make it a 503)."""
    runs(hub, "other")
    stop(hub, kube, namespace, "other")


def pod_create(namespace: str) -> str:
    return rf"^/api/v1/namespaces/{namespace}/pods$"


def claim_create(namespace: str) -> str:
    return rf"^/api/v1/namespaces/{namespace}/persistentvolumeclaims$"


# --- a failing create --------------------------------------------------------------------


def test_a_500_on_the_pod_create_fails_the_start_clearly_and_holds_nothing(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy):
    proxy.add(Fault("POST", pod_create(namespace), status=500))
    answer, message = fails(hub)
    said = ("Cannot start h200-1g: the Kubernetes API server answered HTTP 500 to making the "
            "pod jupyter-alice (injected by the test's fault proxy: InternalError); "
            "try again shortly.")
    assert answer.status_code == 502 and answer.json()["message"] == said, answer.text
    assert said in message
    assert pods(kube, namespace) == [] and claims(kube, namespace) == ["claim-alice"]

    the_slice_is_free(hub, kube, namespace)
    runs(hub)  # tried again, her start runs
    assert pods(kube, namespace) == ["jupyter-alice"]


@pytest.mark.parametrize("times", [1, 0], ids=["once", "every-time"])
def test_a_409_on_the_pod_create_ends_the_start_cleanly(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy, times: int):
    # kubespawner takes a 409 for a pod of that name left over: it deletes it (stop) and
    # creates again, until k8s_api_request_retry_timeout
    fault = proxy.add(Fault("POST", pod_create(namespace), status=409, times=times))
    if times == 1:
        runs(hub)
        assert pods(kube, namespace) == ["jupyter-alice"]
        refused_for_want_of_room(hub)  # her pod is counted, once
        stop(hub, kube, namespace)
    else:
        began = time.monotonic()
        _answer, message = fails(hub)
        assert time.monotonic() - began < RETRY_TIMEOUT_S + 10
        assert f"Could not create pod {namespace}/jupyter-alice" in message, message
        assert fault.fired >= 2 and pods(kube, namespace) == []
        proxy.clear()
    the_slice_is_free(hub, kube, namespace)


@pytest.mark.parametrize("request_", ["create", "get"])
def test_a_500_on_the_home_claim_fails_the_start_clearly(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy, request_: str):
    claim = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    if request_ == "create":
        proxy.add(Fault("POST", claim_create(namespace), status=500))
        said = "HTTP 500 to making the home claim claim-alice (injected by the test's fault"
    else:
        # Her claim was made long ago and the claim quota is full: the create is refused
        # (403) and kubespawner reads the claim to go on; that read fails.
        kube.create(f"/api/v1/namespaces/{namespace}/resourcequotas", {
            "metadata": {"name": "homes"}, "spec": {"hard": {"persistentvolumeclaims": "1"}}})
        kube.create(claim, {"metadata": {"name": "claim-alice"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": f"manual-{namespace}"}})
        kube.wait_for("the claim counted by the quota", lambda: kube.get(
            f"/api/v1/namespaces/{namespace}/resourcequotas/homes").get("status", {}).get(
            "used", {}).get("persistentvolumeclaims") == "1")
        proxy.add(Fault("GET", rf"{claim}/claim-alice$", status=500))
        said = "HTTP 403 to making the home claim claim-alice (persistentvolumeclaims"
    answer, message = fails(hub)
    assert answer.status_code == 502 and said in answer.json()["message"], answer.text
    assert said in message
    assert pods(kube, namespace) == []
    the_slice_is_free(hub, kube, namespace)
    runs(hub)
    assert claims(kube, namespace) == ["claim-alice"]


# --- a slow API server, watches dropped or expired ------------------------------------------


@pytest.mark.parametrize("delay", [2.0, 5.0], ids=["under-request-timeout", "over-it"])
def test_a_slow_pod_create_still_starts_the_server(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy, delay: float):
    # kubespawner gives each request k8s_api_request_timeout (3 s), then asks again
    proxy.add(Fault("POST", pod_create(namespace), delay=delay))
    runs(hub)
    tries = (hub.folder / "hub.log").read_text().count("Attempting to create pod jupyter-alice")
    assert tries == (1 if delay < 3 else 2)  # over it: created again, and one pod made
    assert pods(kube, namespace) == ["jupyter-alice"]
    refused_for_want_of_room(hub)


@pytest.mark.parametrize("fault", ["dropped", "expired"])
def test_pod_watches_dropped_or_expired_during_a_spawn(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy, fault: str):
    watches = {  # kubespawner's pod watch of the namespace, gpulease's of every namespace
        "kubespawner": rf"^/api/v1/namespaces/{namespace}/pods\?.*watch=",
        "cluster": r"^/api/v1/pods\?.*watch="}
    faults = {which: proxy.add(Fault("GET", path, drop_after=1.0, times=0) if fault == "dropped"
                               else Fault("GET", path, expire_watch=True, times=3))
              for which, path in watches.items()}
    runs(hub)
    assert {which: f.fired > 0 for which, f in faults.items()} == dict.fromkeys(watches, True)
    assert pods(kube, namespace) == ["jupyter-alice"]
    refused_for_want_of_room(hub)  # the watched picture counts her pod
    assert hub.api("GET", "/users/alice").json()["servers"][""]["ready"]


# --- the cluster inventory cannot be read ----------------------------------------------------


def test_a_start_waits_for_the_clusters_first_listing_then_is_refused_until_it_comes(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy):
    proxy.add(Fault("GET", r"^/api/v1/nodes$", status=500, times=0))
    said = ("Cannot start h200-1g: Cannot read the cluster's nodes and pods from the "
            "Kubernetes API server (nodes: HTTP 500")
    for _ in range(2):  # the API server fails for 20 s: the watch's pauses grow past 10 s
        began = time.monotonic()
        _answer, message = fails(hub)
        assert WATCH_READY_S - 1 < time.monotonic() - began < WATCH_READY_S + 10
        assert said in message, message
    assert pods(kube, namespace) == [] and claims(kube, namespace) == []
    proxy.clear()
    began = time.monotonic()
    runs(hub)  # at once: not after the watch's next pause
    assert time.monotonic() - began < WATCH_READY_S


def test_a_start_refused_while_its_progress_starts_the_event_watch_leaves_that_watch_running(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy):
    """The test above, made certain: a refused start's progress stream reaches
    kubespawner's shared event watch, whose first list the API server answers only after
    the start has ended (JupyterHub then cancels the stream). That watch still starts,
    and the next start runs at once: it was left never loaded, and every later start
    waited on it until start_timeout, logging nothing (1 in 4 runs of the test above)."""
    proxy.add(Fault("GET", r"^/api/v1/nodes$", status=500, times=0))
    listed, cleaned_up = threading.Event(), threading.Event()
    first_list = proxy.add(Fault(
        "GET", rf"^/api/v1/namespaces/{namespace}/events\?(?!.*watch=)", hold=listed))
    # the refused start's clean-up (JupyterHub's poll: the pod watch's first list) ends it
    # only once its progress is listing the events
    proxy.add(Fault("GET", rf"^/api/v1/namespaces/{namespace}/pods\?(?!.*watch=)",
                    hold=cleaned_up))
    threading.Thread(target=start, args=(hub,), daemon=True).start()
    time.sleep(1)  # the start waits for the nodes' first list: its progress is followed
    ended: list[tuple[bool, str]] = []
    follower = threading.Thread(target=lambda: ended.append(outcome(hub)), daemon=True)
    follower.start()
    deadline = time.monotonic() + WATCH_READY_S + 10
    try:
        while not first_list.fired:
            assert time.monotonic() < deadline, "the progress never listed the events" + hub.tail()
            time.sleep(0.05)
    finally:
        cleaned_up.set()
    follower.join(30)
    assert ended and not ended[0][0], ended
    assert not server(hub), "the refused start still has a server"
    listed.set()  # the events' first list answers now, after the start that asked ended
    proxy.clear()
    began = time.monotonic()
    runs(hub)
    assert time.monotonic() - began < WATCH_READY_S, hub.tail()


def test_a_pod_admitted_then_beaten_to_its_slice_waits_with_the_schedulers_reason(
        hub: StockHub, kube: Kube, namespace: str, proxy: FaultProxy):
    """Admitted while the slice was free; another tenant's pod takes it before alice's pod
    is made (its create is held until the other pod is bound): her pod waits,
    Unschedulable, the scheduler's reason in her progress, until the slice frees, then it
    runs."""
    made = threading.Event()
    proxy.add(Fault("POST", pod_create(namespace), hold=made, times=0))  # retries too
    started: list[requests.Response] = []
    thread = threading.Thread(target=lambda: started.append(start(hub)), daemon=True)
    thread.start()
    claim = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/claim-alice"
    try:
        kube.wait_for("alice admitted (her home claim made)", lambda: claims(kube, namespace))
        assert kube.get(claim)
        kube.create(pods_path(namespace), gpu_pod(
            namespace, "other-tenant", f"{namespace}-h200", "nvidia.com/mig-1g.18gb", 1))
        kube.wait_for("the other tenant's pod bound", lambda: kube.get(
            pods_path(namespace, "other-tenant"))["spec"].get("nodeName"))
    finally:
        made.set()  # alice's pod create goes on
    messages = []
    with requests.get(f"{hub.url}/hub/api{_path('')}/progress", stream=True,
                      headers={"Authorization": f"token {hub.token}"}, timeout=60) as r:
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                messages.append(json.loads(line[5:]).get("message", ""))
                if "Insufficient nvidia.com/mig-1g.18gb" in messages[-1]:
                    break
    assert any("FailedScheduling" in m or "Insufficient" in m for m in messages), messages
    assert not server(hub)["ready"]
    refused_for_want_of_room(hub)  # alice's admitted, unbound pod is counted

    # A graceful delete: the pod object stays until its container is gone, so the slice is
    # not offered again while the device is still in use (a forced one races the kubelet).
    kube.delete(pods_path(namespace, "other-tenant"))
    ready, message = outcome(hub)
    assert ready, message + hub.tail()
    thread.join(30)
    assert started and started[0].status_code in (201, 202)
