"""The spot tier in the cluster shape, on the test control plane: `gpulease up` with
GPUKubeSpawner, both tiers' PriorityClasses, and kube-scheduler's own preemption.

A node with two MIG slices is filled by two spot servers. An on-demand start then
arrives: gpulease admits it (what spot pods hold counts as free for it) and makes its
pod at the higher priority; the real kube-scheduler preempts the more recently
started spot pod (marking it DisruptionTarget and deleting it with its grace period);
gpulease tells that researcher at once, with the deadline; the pod's preStop sleep
keeps the server running until then; its session ends `preempted`, billed at the
spot rate up to the deadline at most; the on-demand server starts on the freed slice,
billed at its own rate; the other spot server and every home are untouched.
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube, KubeError
from tests.cluster.nodes import GpuNode
from tests.cluster.test_gpulease_up_cluster import (
    PW,
    cluster_hub_at,
    pod_of,
    sessions_of,
    wait_for,
)
from tests.cluster.test_kubespawner import home_volume

GRACE = 8  # seconds (GPULeaseHub.spot_grace_period); the default is 120
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "H200 slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "36",
     "spot_price_per_hour": "3.6", "min_run": "1s"},
]}
CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def _priority_classes(kube: Kube, namespace: str) -> tuple[str, str]:
    """The chart's two classes, named for this test (they are cluster-wide)."""
    on_demand, spot = f"{namespace}-on-demand", f"{namespace}-spot"
    kube.create(CLASSES, {"metadata": {"name": on_demand}, "value": 1000,
                          "preemptionPolicy": "PreemptLowerPriority"})
    kube.create(CLASSES, {"metadata": {"name": spot}, "value": 100, "preemptionPolicy": "Never"})
    return on_demand, spot


def _start(hub, user: str, token: str, options: dict):
    return hub.api("POST", f"users/{user}/server", token, {"user_options": options})


def _iso(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_kube_scheduler_preempts_a_spot_pod_for_an_on_demand_start_with_notice(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 2}))
    on_demand_class, spot_class = _priority_classes(kube, namespace)
    for name in ("sue-home", "odin-home"):  # cluster_hub_at makes one; three users
        home_volume(kube, control_plane, namespace, name)
    config = (f"c.GPUKubeSpawner.on_demand_priority_class = {on_demand_class!r}\n"
              f"c.GPUKubeSpawner.spot_priority_class = {spot_class!r}\n")
    try:
        with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=PROFILES,
                            config=config, extra_args=(
                                "--GPULeaseHub.heartbeat_interval=1", "--Spawner.poll_interval=1",
                                f"--GPULeaseHub.spot_grace_period={GRACE}")) as hub:
            _preemption(hub, kube, namespace, on_demand_class, spot_class)
    finally:
        for name in (on_demand_class, spot_class):
            kube.delete(f"{CLASSES}/{name}")
        for name in ("sue-home", "odin-home"):
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-{name}")


def _preemption(hub, kube: Kube, namespace: str, on_demand_class: str, spot_class: str):
    admin = hub.token_for("admin", PW)
    tokens = {user: hub.add_user(admin, user, "100") for user in ("sam", "sue", "odin")}
    for user in ("sam", "sue"):  # sue's is the more recent: hers is the one preempted
        r = _start(hub, user, tokens[user], {"profile": "slice", "tier": "spot"})
        assert r.status_code in (201, 202), r.text
        hub.wait_server_ready(user, tokens[user], timeout=120)
        time.sleep(1.1)  # start times a second apart (the scheduler's resolution)
    for user in ("sam", "sue"):
        pod = pod_of(kube, namespace, user)
        assert pod["spec"]["priorityClassName"] == spot_class
        assert pod["metadata"]["labels"]["gpulease.io/tier"] == "spot"
        hook = pod["spec"]["containers"][0]["lifecycle"]["preStop"]
        assert hook == {"sleep": {"seconds": GRACE}}, hook
    # the inventory's cluster form says which holders are spot
    view = hub.service("GET", "api/inventory", admin).json()
    holders = [h for n in view["nodes"] for r in n["resources"] for h in r["holders"]]
    assert sorted((h["user"], h["tier"]) for h in holders) == [("sam", "spot"), ("sue", "spot")]

    asked = time.monotonic()
    # the start's request answers once the server runs (or after 10 s): meanwhile, sue
    pool = ThreadPoolExecutor(1)
    answer = pool.submit(_start, hub, "odin", tokens["odin"], {"profile": "slice"})

    def warned():
        return [n for n in hub.service("GET", "api/notices", tokens["sue"]).json()["notices"]
                if n["kind"] == "preemption_warning"]
    (notice,) = wait_for("sue is told", warned, timeout=60, hub=hub)
    told = time.monotonic()
    assert "Save your work" in notice["message"] and notice["deadline"], notice
    victim = pod_of(kube, namespace, "sue")
    (disruption,) = [c for c in victim["status"]["conditions"]
                     if c["type"] == "DisruptionTarget"]
    assert disruption["reason"] == "PreemptionByScheduler", disruption
    assert not [n for n in hub.service("GET", "api/notices", tokens["sam"]).json()["notices"]
                if n["kind"] == "preemption_warning"]
    # her server still runs in the grace period (the pod's preStop sleep)
    if time.monotonic() - told < GRACE - 3:
        model = hub.api("GET", "users/sue", admin).json()
        assert model["servers"][""]["ready"], model

    r = answer.result(timeout=120)
    pool.shutdown()
    assert r.status_code in (201, 202), r.text + hub.log()[-3000:]
    hub.wait_server_ready("odin", tokens["odin"], timeout=120)
    hub.wait_server_stopped("sue", tokens["sue"], timeout=60)
    assert time.monotonic() - asked >= GRACE - 1  # odin waited out her grace period
    odin_pod = pod_of(kube, namespace, "odin")
    assert odin_pod["spec"]["priorityClassName"] == on_demand_class
    assert odin_pod["metadata"]["labels"]["gpulease.io/tier"] == "on-demand"
    assert hub.api("GET", "users/sam", admin).json()["servers"][""]["ready"]
    wait_for("sue's pod gone", lambda: pod_of(kube, namespace, "sue") is None, hub=hub)
    claim = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/claim-sue")
    assert claim["status"]["phase"] == "Bound"  # her home is kept

    (sue,) = sessions_of(hub, tokens["sue"])
    assert sue["tier"] == "spot" and sue["end_reason"] == "preempted", sue
    assert _iso(sue["ended"]) <= _iso(notice["deadline"]) + dt.timedelta(milliseconds=1)
    # 3.6 credits/h = 1 µcr per ms: the spot rate, not the profile's 36
    assert sue["cost"] == f"{sue['billed_ms'] / 1e6:.6f}", sue
    (odin,) = sessions_of(hub, tokens["odin"])
    assert odin["tier"] == "on-demand" and odin["end_reason"] is None, odin
    servers = hub.service("GET", "api/me/servers", tokens["sue"]).json()["servers"]
    (mine,) = [s for s in servers if s["name"] == ""]
    assert mine["state"] == "suspended", mine
    for user in ("sam", "odin"):
        hub.api("DELETE", f"users/{user}/server", tokens[user])
        hub.wait_server_stopped(user, tokens[user])
    for user in ("sam", "sue", "odin"):
        try:
            kube.delete(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/claim-{user}")
        except KubeError:
            pass
