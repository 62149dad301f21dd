"""Reservations in the cluster shape, on the test control plane: `gpulease up` with
GPUKubeSpawner, both tiers' PriorityClasses, and kube-scheduler's own preemption.

A node with two MIG slices; lee's reservation holds one of them. kim's on-demand
start gets the other; ann's on-demand start then waits in gpulease's queue although a
slice is free (it is reserved); sam's spot start may use that idle reserved slice.
lee then starts: the start takes the reservation's unit (its pod is labelled with the
reservation, at on-demand priority), kube-scheduler preempts sam's spot pod (sam is
told), lee's server runs on the reservation, not billed by the millisecond, and ann's start
still waits.

Units of two cards stay whole per node: two nodes of two cards, someone else's pod on
one card of b, a pair reserved for lee. By count a card is free for kim's on-demand
start, and kube-scheduler alone (it spreads) would put it on the empty node a; gpulease
admits it to b and keeps its pod there, and lee's pair then runs on a.
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_gpulease_up_cluster import (
    PW,
    cluster_hub_at,
    pod_of,
    sessions_of,
    wait_for,
)
from tests.cluster.test_kubespawner import home_volume
from tests.cluster.test_spot_cluster import CLASSES, _priority_classes
from tests.support.reservation_clock import begin_now

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


CARD_PROFILES = {"profiles": [
    {"slug": "one", "display_name": "One H200", "gpu": {"model": "H200", "count": 1},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "8",
     "min_run": "1s"},
    {"slug": "pair", "display_name": "Two H200", "gpu": {"model": "H200", "count": 2},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "16",
     "reserved_price_per_hour": "10", "min_run": "1s"},
]}


def test_a_reserved_pair_keeps_a_whole_node_and_a_card_is_kept_off_it(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("a", gpus=2), GpuNode("b", gpus=2))
    batch = gpu_pod(namespace, "batch", f"{namespace}-b", "nvidia.com/gpu", 1)
    # It asks for half of b's CPUs too, so kube-scheduler's own scoring (least allocated)
    # would put kim's card on a: only gpulease's pinning keeps it on b.
    batch["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "32"}
    kube.create(pods_path(namespace), batch)
    home_volume(kube, control_plane, namespace, "kim-home")  # cluster_hub_at makes one
    try:
        with cluster_hub_at(control_plane, kube, namespace, tmp_path,
                            profiles=CARD_PROFILES) as hub:
            admin = hub.token_for("admin", PW)
            tokens = {user: hub.add_user(admin, user, "100") for user in ("lee", "kim")}
            r = hub.service("POST", "api/reservations", admin, {
                "account": "user:lee", "profile": "pair", "units": 1, "start": _hour(),
                "end": _hour(2)})
            assert r.status_code == 201, r.text
            wait_for("the inventory seeing the batch pod", lambda: any(
                h.get("pod", "").endswith("/batch")
                for n in hub.service("GET", "api/inventory", admin).json()["nodes"]
                for res in n["resources"] for h in res["holders"]), hub=hub)

            assert _start(hub, "kim", tokens["kim"], {"profile": "one"}).status_code in (
                201, 202)
            hub.wait_server_ready("kim", tokens["kim"], timeout=120)
            kim = pod_of(kube, namespace, "kim")
            assert kim["spec"]["nodeName"] == f"{namespace}-b"
            terms = kim["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert all({"key": "metadata.name", "operator": "In",
                        "values": [f"{namespace}-b"]} in t["matchFields"] for t in terms)

            assert _start(hub, "lee", tokens["lee"], {"profile": "pair"}).status_code in (
                201, 202)
            hub.wait_server_ready("lee", tokens["lee"], timeout=120)
            lee = pod_of(kube, namespace, "lee")
            assert lee["spec"]["nodeName"] == f"{namespace}-a"
            assert lee["metadata"]["labels"]["gpulease.io/tier"] == "reserved"
            for user in ("kim", "lee"):
                hub.api("DELETE", f"users/{user}/server", tokens[user])
                hub.wait_server_stopped(user, tokens[user])
    finally:
        kube.delete(f"/api/v1/persistentvolumes/{namespace}-kim-home")
        for user in ("lee", "kim"):
            try:
                kube.delete(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/"
                            f"claim-{user}")
            except KubeError:
                pass


def test_on_demand_pods_running_when_the_period_begins_make_way_for_the_holder(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """Capacity is there when promised, in the cluster: kim's and then ann's on-demand
    servers take both cards before lee's reservation of one begins; lee's start waits,
    ann's (the newest) is told and stopped after the grace period, and lee's pod runs
    on the reservation."""
    gpu_nodes(GpuNode("a", gpus=2))
    for user in ("kim", "ann"):  # cluster_hub_at makes lee's
        home_volume(kube, control_plane, namespace, f"{user}-home")
    profiles = {"profiles": [{**CARD_PROFILES["profiles"][0], "reserved_price_per_hour": "5"}]}
    try:
        with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=profiles,
                            extra_args=("--GPULeaseHub.heartbeat_interval=1",
                                        "--Spawner.poll_interval=1",
                                        f"--GPULeaseHub.spot_grace_period={GRACE}",
                                        "--GPULeaseHub.queue_max_wait=5m")) as hub:
            admin = hub.token_for("admin", PW)
            tokens = {user: hub.add_user(admin, user, "100") for user in ("lee", "kim", "ann")}
            for user in ("kim", "ann"):
                assert _start(hub, user, tokens[user], {"profile": "one"}).status_code in (
                    201, 202)
                hub.wait_server_ready(user, tokens[user], timeout=120)
            asked = {"account": "user:lee", "profile": "one", "units": 1, "start": _hour(),
                     "end": _hour(1)}
            r = hub.service("POST", "api/reservations", admin, asked)  # beside what runs
            assert r.status_code == 409 and "only 0 of 2" in r.text, r.text
            r = hub.service("POST", "api/reservations", admin,
                            {**asked, "start": _hour(25), "end": _hour(26)})
            assert r.status_code == 201, r.text
            booked = r.json()
            begin_now(hub, booked["id"])  # the hour comes; kim's and ann's servers run
            pool = ThreadPoolExecutor(1)
            lee = pool.submit(_start, hub, "lee", tokens["lee"], {"profile": "one"})

            def warned():
                return [n for n in hub.service("GET", "api/notices", tokens["ann"]
                                               ).json()["notices"]
                        if n["kind"] == "preemption_warning"]
            (notice,) = wait_for("ann is told", warned, timeout=60, hub=hub)
            assert "reserved for this period" in notice["message"]
            assert lee.result(timeout=120).status_code in (201, 202)
            pool.shutdown()
            hub.wait_server_ready("lee", tokens["lee"], timeout=120)
            hub.wait_server_stopped("ann", tokens["ann"], timeout=60)
            pod = pod_of(kube, namespace, "lee")
            assert pod["metadata"]["labels"]["gpulease.io/tier"] == "reserved"
            assert pod["metadata"]["labels"]["gpulease.io/reservation"] == str(booked["id"])
            (ann,) = sessions_of(hub, tokens["ann"])
            assert ann["end_reason"] == "preempted" and ann["tier"] == "on-demand"
            (kim,) = sessions_of(hub, tokens["kim"])
            assert kim["ended"] is None  # within on-demand's share: kept
            for user in ("kim", "lee"):
                hub.api("DELETE", f"users/{user}/server", tokens[user])
                hub.wait_server_stopped(user, tokens[user])
    finally:
        for user in ("kim", "ann"):
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-{user}-home")
        for user in ("lee", "kim", "ann"):
            try:
                kube.delete(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/"
                            f"claim-{user}")
            except KubeError:
                pass
