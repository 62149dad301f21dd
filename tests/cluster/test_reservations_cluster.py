"""Reservations in the cluster shape, on the test control plane: `gpulease up` with
GPUKubeSpawner, both tiers' PriorityClasses, and kube-scheduler's own preemption.

A node with two MIG slices; lee's reservation holds one of them. kim's on-demand
start gets the other; ann's on-demand start then waits in gpulease's queue although a
slice is free (it is reserved); sam's spot start may use that idle reserved slice.
lee then starts: the start takes the reservation's unit (its pod is labelled with the
reservation, at on-demand priority), kube-scheduler preempts sam's spot pod (sam is
told), lee's server runs on the reservation, not billed per second, and ann's start
still waits.
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
from tests.cluster.test_spot_cluster import CLASSES, _priority_classes

GRACE = 4
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "H200 slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "36",
     "spot_price_per_hour": "3.6", "reserved_price_per_hour": "18", "min_run": "1s"},
]}
USERS = ("lee", "kim", "ann", "sam")


def _start(hub, user: str, token: str, options: dict):
    return hub.api("POST", f"users/{user}/server", token, {"user_options": options})


def _hour(offset: int = 0) -> str:
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    return (now + dt.timedelta(hours=offset)).strftime("%Y-%m-%dT%H:00:00Z")


def test_a_reservation_holds_cluster_capacity_and_its_holder_preempts_spot(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 2}))
    on_demand_class, spot_class = _priority_classes(kube, namespace)
    for user in USERS[1:]:  # cluster_hub_at makes one home volume
        home_volume(kube, control_plane, namespace, f"{user}-home")
    config = (f"c.GPUKubeSpawner.on_demand_priority_class = {on_demand_class!r}\n"
              f"c.GPUKubeSpawner.spot_priority_class = {spot_class!r}\n")
    try:
        with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=PROFILES,
                            config=config, extra_args=(
                                "--GPULeaseHub.heartbeat_interval=1", "--Spawner.poll_interval=1",
                                f"--GPULeaseHub.spot_grace_period={GRACE}",
                                "--GPULeaseHub.queue_max_wait=5m")) as hub:
            _held(hub, kube, namespace, on_demand_class)
    finally:
        for name in (on_demand_class, spot_class):
            kube.delete(f"{CLASSES}/{name}")
        for user in USERS[1:]:
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-{user}-home")
        for user in USERS:
            try:
                kube.delete(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/"
                            f"claim-{user}")
            except KubeError:
                pass


def _held(hub, kube: Kube, namespace: str, on_demand_class: str):
    admin = hub.token_for("admin", PW)
    tokens = {user: hub.add_user(admin, user, "100") for user in USERS}
    r = hub.service("POST", "api/reservations", admin, {
        "account": "user:lee", "profile": "slice", "units": 1, "start": _hour(),
        "end": _hour(2)})
    assert r.status_code == 201, r.text
    booked = r.json()
    # capacity counted from the cluster's nodes: 2 slices, one promised
    r = hub.service("POST", "api/reservations", admin, {
        "account": "user:kim", "profile": "slice", "units": 2, "start": _hour(),
        "end": _hour(1)})
    assert r.status_code == 409 and "only 1 of 2" in r.text, r.text

    assert _start(hub, "kim", tokens["kim"], {"profile": "slice"}).status_code in (201, 202)
    hub.wait_server_ready("kim", tokens["kim"], timeout=120)
    pool = ThreadPoolExecutor(2)
    ann = pool.submit(_start, hub, "ann", tokens["ann"], {"profile": "slice"})

    def queued():
        view = hub.service("GET", "api/inventory", admin).json()
        return [q for q in view["queue"] if q["user"] == "ann"]
    wait_for("ann waits although a slice is free", queued, hub=hub)
    assert _start(hub, "sam", tokens["sam"], {"profile": "slice", "tier": "spot"}
                  ).status_code in (201, 202)
    hub.wait_server_ready("sam", tokens["sam"], timeout=120)  # on the idle reserved slice

    lee = pool.submit(_start, hub, "lee", tokens["lee"], {"profile": "slice"})

    def warned():
        return [n for n in hub.service("GET", "api/notices", tokens["sam"]).json()["notices"]
                if n["kind"] == "preemption_warning"]
    wait_for("sam is told", warned, timeout=60, hub=hub)
    assert lee.result(timeout=120).status_code in (201, 202)
    hub.wait_server_ready("lee", tokens["lee"], timeout=120)
    hub.wait_server_stopped("sam", tokens["sam"], timeout=60)
    pod = pod_of(kube, namespace, "lee")
    assert pod["spec"]["priorityClassName"] == on_demand_class
    labels = pod["metadata"]["labels"]
    assert labels["gpulease.io/tier"] == "reserved"
    assert labels["gpulease.io/reservation"] == str(booked["id"])
    view = hub.service("GET", "api/inventory", admin).json()
    holders = {h["user"]: h for n in view["nodes"] for r in n["resources"]
               for h in r["holders"]}
    assert holders["lee"]["tier"] == "reserved" and holders["lee"]["reservation"] == booked["id"]
    assert "ann" not in holders and queued()  # still waiting: lee's slice is not hers
    time.sleep(2)
    (session,) = sessions_of(hub, tokens["lee"])
    assert session["tier"] == "reserved" and session["reservation"] == booked["id"]
    assert session["cost"] == "0.000000" and session["billed_ms"] > 1000
    (spot,) = sessions_of(hub, tokens["sam"])
    assert spot["end_reason"] == "preempted"

    hub.api("DELETE", "users/ann/server", tokens["ann"])  # gives up its place
    ann.result(timeout=60)  # its request answered (how does not matter here)
    pool.shutdown()
    for user in ("kim", "lee"):
        hub.api("DELETE", f"users/{user}/server", tokens[user])
        hub.wait_server_stopped(user, tokens[user])
