"""DynamicMIG on the real control plane: slices carved on demand, end to end.

`gpulease up` in the cluster shape, DRA mode, on an emulated node whose H200 is
published by the test double of NVIDIA's DRA driver in DynamicMIG mode
(tests/cluster/dra_driver.py: a counter set, the full GPU and every MIG
placement). The real kube-scheduler carves each server's slice (its claim's
device), gpulease's queue admits by the same fit rule, and the kubelet
emulator hands the server the MIG device the driver would have created.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpulease.spawners.kube.rbac import DRA_CLUSTER_ROLE_RULES, DRA_ROLE_RULES
from tests.cluster import dra_driver
from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube
from tests.cluster.nodes import GpuNode
from tests.cluster.test_dra_cluster import claim_of, devices_in_server
from tests.cluster.test_gpulease_up_cluster import (
    PW,
    cluster_hub_at,
    pod_of,
    sessions_of,
    start,
    wait_for,
)
from tests.cluster.test_kubespawner import home_volume
from tests.support.hubproc import HubProcess
from tests.support.queue_reads import wait_for_progress


def profile(slug: str, mig: str, price: str) -> dict:
    return {"slug": slug, "display_name": f"H200 {mig}", "gpu": {"model": "H200", "mig": mig},
            "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": price,
            "min_run": "1s"}


PROFILES = {"profiles": [{**profile("1g", "1g.18gb", "36"), "reserved_price_per_hour": "30"},
                         profile("2g", "2g.35gb", "72"), profile("3g", "3g.71gb", "108")]}
HEARTBEAT = 1.0
HOMES = ("bob-home", "cy-home", "di-home")  # alice's is the fixture's


def carved_node(gpu_nodes, kube: Kube, name: str = "dyn") -> str:
    """One emulated node with one H200 in DynamicMIG mode; its name."""
    dra_driver.install(kube)
    spec = GpuNode(name, gpus=1, dra=True, dynamic_mig=True)
    (node,) = gpu_nodes(spec)
    full = node["metadata"]["name"]
    dra_driver.publish(kube, GpuNode(**{**spec.__dict__, "name": full}),
                       owner=node["metadata"]["uid"])
    return full


@pytest.fixture
def dynamic_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
                tmp_path: Path) -> Iterator[HubProcess]:
    carved_node(gpu_nodes, kube)
    for home in HOMES:
        home_volume(kube, control_plane, namespace, home)
    try:
        with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=PROFILES,
                            config='c.GPUKubeSpawner.gpu_allocation = "dra"\n',
                            extra_rules=DRA_ROLE_RULES,
                            extra_cluster_rules=DRA_CLUSTER_ROLE_RULES,
                            extra_args=(f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}",
                                        "--Spawner.poll_interval=1",
                                        "--GPULeaseHub.queue_max_wait=5m")) as hub:
            yield hub
    finally:
        for home in HOMES:
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-{home}")


def device_of(kube: Kube, namespace: str, user: str) -> str:
    """The device kube-scheduler allocated to the user's server's claim."""
    (result,) = claim_of(kube, namespace, pod_of(kube, namespace, user))["status"][
        "allocation"]["devices"]["results"]
    return result["device"]


def carved(hub: HubProcess, admin: str, node: str) -> list[tuple[str, str]]:
    """The inventory's slices carved on the node's one GPU: (device, holder)."""
    rows = {n["name"]: n for n in hub.service("GET", "api/inventory", admin).json()["nodes"]}
    (gpu,) = rows[node]["gpus"]
    return [(c["device"], (c["holder"] or {}).get("user", "")) for c in gpu["carved"]]


def test_a_mix_of_slices_fills_a_gpu_a_later_one_waits_in_the_queue_and_starts_when_one_frees(
        dynamic_hub: HubProcess, kube: Kube, namespace: str, browser_context):
    hub = dynamic_hub
    node = f"{namespace}-dyn"
    admin = hub.token_for("admin", PW)
    tokens = {u: hub.add_user(admin, u, "100") for u in ("alice", "bob", "cy", "di")}

    # A 3g, a 2g and a 1g, one after another: carved where the allocator's first fit
    # puts them (memory slices 0-3, 4-5, 6), never overlapping.
    for user, slug in (("alice", "3g"), ("bob", "2g"), ("cy", "1g")):
        r = start(hub, user, tokens[user], slug)
        assert r.status_code in (201, 202), r.text
        hub.wait_server_ready(user, tokens[user], timeout=120)
    assert [device_of(kube, namespace, u) for u in ("alice", "bob", "cy")] == [
        "gpu-0-mig-3g71gb-9-0", "gpu-0-mig-2g35gb-14-4", "gpu-0-mig-1g18gb-19-6"]
    ids = [devices_in_server(kube, namespace, pod_of(kube, namespace, u))
           for u in ("alice", "bob", "cy")]
    assert all(len(i) == 1 and i[0].startswith("MIG-") for i in ids)
    assert len({i[0] for i in ids}) == 3

    # The inventory: the GPU's carved slices, by first memory slice, with their holders.
    assert carved(hub, admin, node) == [("gpu-0-mig-3g71gb-9-0", "alice"),
                                        ("gpu-0-mig-2g35gb-14-4", "bob"),
                                        ("gpu-0-mig-1g18gb-19-6", "cy")]
    # The start form's counts: no 2g could be carved now, so a start would queue.
    listed = {p["slug"]: p["availability"] for p in
              hub.service("GET", "api/profiles", tokens["di"]).json()["profiles"]}
    assert listed["2g"]["free"] == 0 and listed["2g"]["state"] == "queue", listed
    assert listed["1g"]["total"] == 7

    # A 2g does not fit (2g's go at 0, 2 or 4): it waits with its position, no pod made.
    r = start(hub, "di", tokens["di"], "2g")
    assert r.status_code in (201, 202), r.text
    waiting = "Waiting for a free H200 slice 2g.35gb: position"
    assert f"{waiting} 1 in the queue" in wait_for_progress(
        hub, "di", tokens["di"], waiting)[-1]
    assert pod_of(kube, namespace, "di") is None

    # bob is suspended as idle (the culler's way): his slice is destroyed, billing stops,
    # and di's start takes the placement freed.
    time.sleep(2 * HEARTBEAT)
    r = hub.service("POST", "api/stop", admin, {"user": "bob", "server": "", "reason": "idle"})
    assert r.status_code == 202, r.text
    hub.wait_server_stopped("bob", tokens["bob"])
    hub.wait_server_ready("di", tokens["di"], timeout=120)
    assert device_of(kube, namespace, "di") == "gpu-0-mig-2g35gb-14-4"
    (suspended,) = sessions_of(hub, tokens["bob"])
    assert suspended["end_reason"] == "idle" and suspended["billed_seconds"] >= 2
    servers = hub.service("GET", "api/me/servers", tokens["bob"]).json()["servers"]
    assert [s["state"] for s in servers if s["name"] == ""] == ["suspended"]
    time.sleep(2 * HEARTBEAT)
    assert sessions_of(hub, tokens["bob"])[-1]["billed_ms"] == suspended["billed_ms"]

    # One click to resume: no 2g fits, so bob waits; alice's stop frees 0-3 and he gets
    # a 2g carved there.
    assert start(hub, "bob", tokens["bob"], None).status_code in (201, 202)
    assert f"{waiting} 1 in the queue" in wait_for_progress(
        hub, "bob", tokens["bob"], waiting)[-1]
    assert hub.api("DELETE", "users/alice/server", tokens["alice"]).status_code in (202, 204)
    hub.wait_server_ready("bob", tokens["bob"], timeout=120)
    assert device_of(kube, namespace, "bob") == "gpu-0-mig-2g35gb-14-0"
    wait_for("the inventory showing the GPU as carved now",
             lambda: carved(hub, admin, node) == [("gpu-0-mig-2g35gb-14-0", "bob"),
                                                  ("gpu-0-mig-2g35gb-14-4", "di"),
                                                  ("gpu-0-mig-1g18gb-19-6", "cy")], hub=hub)

    # The admin's inventory page, in Chromium: the GPU's slices carved now.
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "admin")
    page.fill("#password_input", PW)
    page.click("#login_submit")
    page.locator("#login_submit").wait_for(state="detached")  # signed in: the form is gone
    page.goto(hub.urls.service("admin/inventory"))
    rows = page.locator(f'section.node[data-node="{node}"] table.carved tbody tr')
    assert [r.locator("td").all_inner_texts() for r in rows.all()] == [
        ["gpu-0", "gpu-0-mig-2g35gb-14-0", "MIG 2g.35gb", "0", "bob/(default)"],
        ["gpu-0", "gpu-0-mig-2g35gb-14-4", "MIG 2g.35gb", "4", "di/(default)"],
        ["gpu-0", "gpu-0-mig-1g18gb-19-6", "MIG 1g.18gb", "6", "cy/(default)"]]

    # Reservations promise counts of one kind, which carved GPUs cannot keep (every kind
    # is carved from the same GPU): refused, saying so.
    start_at = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=2)
    r = hub.service("POST", "api/reservations", admin, {
        "account": "user:cy", "profile": "1g", "units": 1,
        "start": start_at.strftime("%Y-%m-%dT%H:00:00Z"),
        "end": (start_at + timedelta(hours=1)).strftime("%Y-%m-%dT%H:00:00Z")})
    assert r.status_code == 422 and "carved on demand (DynamicMIG" in r.text, r.text

    # Billing as for any slice: each session at its profile's price, charged on stop.
    (alice,) = sessions_of(hub, tokens["alice"])
    assert alice["end_reason"] == "user" and alice["profile"] == "3g"
    assert float(alice["cost"]) > 0
    balance = float(hub.service("GET", "api/balance", tokens["alice"]).json()["balance"])
    assert abs(100 - balance - float(alice["cost"])) < 1e-6
    assert [s["profile"] for s in sessions_of(hub, tokens["bob"])] == ["2g", "2g"]


def test_gpulease_preempts_the_spot_server_whose_carved_slice_makes_room(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """Two spot servers, a 3g (slices 0-3) and a newer 1g (slice 4): an on-demand 3g fits
    once either goes; gpulease stops the most recently started, and the on-demand 3g is
    carved at 4-7."""
    from tests.cluster.test_spot_cluster import GRACE, _priority_classes

    carved_node(gpu_nodes, kube)
    on_demand_class, spot_class = _priority_classes(kube, namespace)
    for name in ("sue-home", "odin-home"):
        home_volume(kube, control_plane, namespace, name)
    spot = {"profiles": [{**p, "spot_price_per_hour": "3.6"} for p in PROFILES["profiles"]]}
    config = ('c.GPUKubeSpawner.gpu_allocation = "dra"\n'
              f"c.GPUKubeSpawner.on_demand_priority_class = {on_demand_class!r}\n"
              f"c.GPUKubeSpawner.spot_priority_class = {spot_class!r}\n")
    try:
        with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=spot,
                            config=config, extra_rules=DRA_ROLE_RULES,
                            extra_cluster_rules=DRA_CLUSTER_ROLE_RULES, extra_args=(
                                "--GPULeaseHub.heartbeat_interval=1", "--Spawner.poll_interval=1",
                                f"--GPULeaseHub.spot_grace_period={GRACE}")) as hub:
            admin = hub.token_for("admin", PW)
            tokens = {u: hub.add_user(admin, u, "100") for u in ("sam", "sue", "odin")}
            for user, slug in (("sam", "3g"), ("sue", "1g")):
                r = hub.api("POST", f"users/{user}/server", tokens[user],
                            {"user_options": {"profile": slug, "tier": "spot"}})
                assert r.status_code in (201, 202), r.text
                hub.wait_server_ready(user, tokens[user], timeout=120)
                time.sleep(1.1)  # start times a second apart (the API's resolution)
            assert device_of(kube, namespace, "sue") == "gpu-0-mig-1g18gb-19-4"
            r = start(hub, "odin", tokens["odin"], "3g")
            assert r.status_code in (201, 202), r.text

            def warned(user: str):
                return [n for n in hub.service("GET", "api/notices", tokens[user]).json()[
                    "notices"] if n["kind"] == "preemption_warning"]
            wait_for("sue is told", lambda: warned("sue"), timeout=60, hub=hub)
            assert pod_of(kube, namespace, "odin") is None  # no pod while the slice is held
            hub.wait_server_ready("odin", tokens["odin"], timeout=120)
            assert device_of(kube, namespace, "odin") == "gpu-0-mig-3g71gb-9-4"
            hub.wait_server_stopped("sue", tokens["sue"], timeout=30)
            (sue,) = sessions_of(hub, tokens["sue"])
            assert sue["tier"] == "spot" and sue["end_reason"] == "preempted", sue
            assert hub.api("GET", "users/sam", admin).json()["servers"][""]["ready"]
            assert not warned("sam")
    finally:
        for name in (on_demand_class, spot_class):
            kube.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        for name in ("sue-home", "odin-home"):
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-{name}")
