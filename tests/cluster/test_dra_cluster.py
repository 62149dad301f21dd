"""DRA mode on the real control plane: a server's GPUs as a ResourceClaim, end to end.

`gpulease up` in the cluster shape with `GPUKubeSpawner.gpu_allocation = "dra"`,
its ServiceAccount holding z2jh's hub Role, the inventory's ClusterRole and
exactly what DRA adds (spawners/kube/rbac.py DRA_*). The nodes are emulated
H200 nodes with no device plugin (no nvidia.com/* capacity); their GPUs are
published by the test double of NVIDIA's DRA driver (tests/cluster/dra_driver.py).
The real kube-scheduler allocates devices to the claims, the real
controller-manager makes each claim from its template and removes it when
the pod is gone, and the kubelet emulator hands the server its claim's
devices (DRA_DEVICES_ENV, standing for the driver's CDI injection).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulease.core.model.profiles import GpuSpec
from gpulease.spawners.kube.dra_claims import claim_spec
from gpulease.spawners.kube.rbac import DRA_CLUSTER_ROLE_RULES, DRA_ROLE_RULES
from tests.cluster import dra_driver
from tests.cluster.conftest import POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
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

RESOURCE = "/apis/resource.k8s.io/v1"
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "H200 slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "36", "min_run": "1s"},
    {"slug": "two", "display_name": "Two H200s", "gpu": {"model": "H200", "count": 2},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "72", "min_run": "1s"},
]}
NODES = (GpuNode("mig", mig={"1g.18gb": 7}, dra=True), GpuNode("cards", gpus=4, dra=True))
HEARTBEAT = 1.0


@pytest.fixture
def dra_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
            tmp_path: Path) -> Iterator[HubProcess]:
    dra_driver.install(kube)
    for node in gpu_nodes(*NODES):
        name = node["metadata"]["name"]
        spec = next(s for s in NODES if name.endswith(f"-{s.name}"))
        dra_driver.publish(kube, GpuNode(**{**spec.__dict__, "name": name}),
                           owner=node["metadata"]["uid"])
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, profiles=PROFILES,
                        config='c.GPUKubeSpawner.gpu_allocation = "dra"\n',
                        extra_rules=DRA_ROLE_RULES, extra_cluster_rules=DRA_CLUSTER_ROLE_RULES,
                        extra_args=(f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}",
                                    "--Spawner.poll_interval=1",
                                    "--GPULeaseHub.queue_max_wait=5m")) as hub:
        yield hub


def claim_of(kube: Kube, namespace: str, pod: dict) -> dict:
    """The ResourceClaim the controller made for the pod's `gpus` entry."""
    statuses = {s["name"]: s.get("resourceClaimName")
                for s in pod.get("status", {}).get("resourceClaimStatuses") or []}
    return kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{statuses['gpus']}")


def devices_in_server(kube: Kube, namespace: str, pod: dict) -> list[str]:
    """DRA_DEVICES_ENV as the notebook process has it (its pid from the emulator's event)."""
    events = kube.get(f"/api/v1/namespaces/{namespace}/events",
                      fieldSelector=f"involvedObject.uid={pod['metadata']['uid']}")["items"]
    (started,) = [e for e in events if e["reason"] == "Started"]
    pid = re.search(r"as pid (\d+)", started["message"]).group(1)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (value,) = [v for v in environ if v.startswith(f"{dra_driver.DRA_DEVICES_ENV}=".encode())]
    return value.decode().split("=", 1)[1].split(",")


def templates(kube: Kube, namespace: str) -> list[str]:
    return sorted(t["metadata"]["name"] for t in kube.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates")["items"])


def claims(kube: Kube, namespace: str) -> list[dict]:
    return kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]


def others_claim(kube: Kube, namespace: str, node: str, cards: int) -> None:
    """Another tenant's pod (not gpulease's) holding `cards` cards through a claim of its own."""
    kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "metadata": {"name": "theirs"}, "spec": claim_spec(GpuSpec("H200", count=cards))})
    kube.create(pods_path(namespace), {
        "metadata": {"name": "theirs"},
        "spec": {"nodeSelector": {POOL_LABEL: namespace, "kubernetes.io/hostname": node},
                 "resourceClaims": [{"name": "gpus", "resourceClaimName": "theirs"}],
                 "containers": [{"name": "work", "image": SINGLEUSER_IMAGE,
                                 "command": ["python", "-c", "import time; time.sleep(600)"],
                                 "resources": {"claims": [{"name": "gpus"}]}}]}})
    kube.wait_for("their claim allocated", lambda: (kube.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims/theirs").get("status") or {}
    ).get("allocation"))


def test_a_slice_and_two_cards_run_on_their_claims_and_a_stop_releases_them(
        dra_hub: HubProcess, kube: Kube, namespace: str, control_plane: ControlPlane,
        browser_context):
    hub = dra_hub
    home_volume(kube, control_plane, namespace, "bob-home")  # the fixture's is alice's
    admin = hub.token_for("admin", PW)
    tokens = {user: hub.add_user(admin, user, "100") for user in ("alice", "bob")}
    cards_node = f"{namespace}-cards"
    others_claim(kube, namespace, cards_node, 3)  # 1 of the 4 cards left

    # alice's slice starts; bob's two cards wait in the queue, no pod made
    for user, profile in (("alice", "slice"), ("bob", "two")):
        r = start(hub, user, tokens[user], profile)
        assert r.status_code in (201, 202), r.text
    waiting = "Waiting for a free 2× H200 (full cards): position"
    assert f"{waiting} 1 in the queue" in wait_for_progress(
        hub, "bob", tokens["bob"], waiting)[-1]
    assert pod_of(kube, namespace, "bob") is None
    hub.wait_server_ready("alice", tokens["alice"], timeout=120)
    # their pod ends: the controller clears its claim's allocation, and bob's start goes
    kube.delete(pods_path(namespace, "theirs"), {"gracePeriodSeconds": 1})
    hub.wait_server_ready("bob", tokens["bob"], timeout=120)

    for user, node, count, prefix in (("alice", "mig", 1, "MIG-"), ("bob", "cards", 2, "GPU-")):
        pod = pod_of(kube, namespace, user)
        (container,) = pod["spec"]["containers"]
        limits = container["resources"].get("limits") or {}
        assert not [r for r in limits if r.startswith("nvidia.com/")], limits
        assert container["resources"]["claims"] == [{"name": "gpus"}]
        (entry,) = pod["spec"]["resourceClaims"]
        assert entry["resourceClaimTemplateName"].startswith("gpulease-gpus-")
        assert pod["spec"]["nodeName"] == f"{namespace}-{node}"
        claim = claim_of(kube, namespace, pod)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == count
        assert {(r["driver"], r["pool"]) for r in results} == {
            ("gpu.nvidia.com", f"{namespace}-{node}")}
        assert pod["metadata"]["uid"] in {r["uid"] for r in claim["status"]["reservedFor"]}
        ids = devices_in_server(kube, namespace, pod)
        assert len(ids) == count == len(set(ids)) and all(i.startswith(prefix) for i in ids)

    # The inventory's DRA form: each device by uuid, with its holder.
    rows = {n["name"]: n for n in hub.service("GET", "api/inventory", admin).json()["nodes"]}
    mig, cards = rows[f"{namespace}-mig"], rows[cards_node]
    assert mig["mig_strategy"] == cards["mig_strategy"] == "dra"
    assert sorted((d["holder"] or {}).get("user", "") for d in mig["devices"]) == [""] * 6 + [
        "alice"]
    assert sorted((d["holder"] or {}).get("user", "") for d in cards["devices"]) == [
        "", "", "bob", "bob"]
    assert [res["free"] for res in cards["resources"]] == [2]
    assert len(templates(kube, namespace)) == 2
    # the admin's inventory page, in Chromium: a device table per DRA node
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "admin")
    page.fill("#password_input", PW)
    page.click("#login_submit")
    page.locator("#login_submit").wait_for(state="detached")  # signed in: the form is gone
    page.goto(hub.urls.service("admin/inventory"))
    shown = page.locator(f'section.node[data-node="{namespace}-mig"]')
    assert "MIG strategy dra" in shown.inner_text()
    (held,) = [d for d in mig["devices"] if d["holder"]]
    cells = shown.locator(f'table.devices tr[data-uuid="{held["uuid"]}"] td').all_inner_texts()
    assert cells == [held["uuid"], held["name"], "MIG 1g.18gb", "alice/(default)"]
    assert shown.locator("table.devices tbody tr").count() == 7

    # A stop deletes the pod; the controller deletes its claim, and the devices are free.
    assert hub.api("DELETE", "users/alice/server", tokens["alice"]).status_code in (202, 204)
    hub.wait_server_stopped("alice", tokens["alice"])
    wait_for("alice's pod and claim gone", lambda: pod_of(kube, namespace, "alice") is None
             and not [c for c in claims(kube, namespace)
                      if c["metadata"]["name"].startswith("jupyter-alice")], hub=hub)

    def slice_free() -> bool:
        rows = {n["name"]: n for n in hub.service("GET", "api/inventory", admin).json()["nodes"]}
        return all(d["holder"] is None for d in rows[f"{namespace}-mig"]["devices"])
    wait_for("alice's slice free in the inventory", slice_free, hub=hub)
    (session,) = sessions_of(hub, tokens["alice"])
    assert session["end_reason"] == "user" and session["ended"] is not None
    # her template went with her pod; bob's stays while his pod names it
    (left,) = templates(kube, namespace)
    assert left == pod_of(kube, namespace, "bob")["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"]
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-bob-home")


def test_a_hub_restart_keeps_the_server_and_an_edited_profile_gets_a_new_template(
        dra_hub: HubProcess, kube: Kube, namespace: str, control_plane: ControlPlane):
    hub = dra_hub
    admin = hub.token_for("admin", PW)
    home_volume(kube, control_plane, namespace, "bob-home")  # the fixture's is alice's
    alice = hub.add_user(admin, "alice", "100")
    bob = hub.add_user(admin, "bob", "100")
    assert start(hub, "alice", alice, "two").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=120)
    pod = pod_of(kube, namespace, "alice")
    (before,) = sessions_of(hub, alice)
    first = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]

    # Ctrl-C and start again: the pod, its claim and its billing session carry on.
    assert hub.interrupt() == 0
    hub.start(timeout=120)
    alice = hub.token_for("alice", "alice-pw-12345")
    assert hub.wait_server_ready("alice", alice, timeout=10)
    assert pod_of(kube, namespace, "alice")["metadata"]["uid"] == pod["metadata"]["uid"]
    assert claim_of(kube, namespace, pod)["status"]["allocation"]
    time.sleep(2 * HEARTBEAT)
    (after,) = sessions_of(hub, alice)
    assert after["started"] == before["started"] and after["ended"] is None
    assert after["billed_seconds"] > before["billed_seconds"]

    # The profile edited at run time (one card, not two): the next start gets a new template
    # (a template's spec is immutable), the running server keeps its own.
    r = hub.service("PUT", "api/profiles/two", admin, {
        **PROFILES["profiles"][1], "gpu": {"model": "H200", "count": 1}})
    assert r.status_code in (200, 201), r.text
    assert start(hub, "bob", bob, "two").status_code in (201, 202)
    hub.wait_server_ready("bob", bob, timeout=120)
    second = pod_of(kube, namespace, "bob")["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"]
    assert second != first and templates(kube, namespace) == sorted([first, second])
    assert len(claim_of(kube, namespace, pod_of(kube, namespace, "bob"))["status"][
        "allocation"]["devices"]["results"]) == 1
    # alice's stop: her pod gone, no pod names the old template, so it is deleted
    assert hub.api("DELETE", "users/alice/server", alice).status_code in (202, 204)
    hub.wait_server_stopped("alice", alice)
    wait_for("the old template deleted", lambda: templates(kube, namespace) == [second], hub=hub)
    assert kube.get(pods_path(namespace, "jupyter-bob"))["status"]["phase"] == "Running"
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-bob-home")


def test_gpulease_preempts_a_spot_server_for_an_on_demand_start_and_waits_for_its_claim(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """kube-scheduler does not preempt for DRA devices: gpulease chooses the most recently
    started spot server, tells it, stops it at the deadline through the hub, and the
    on-demand start (waiting meanwhile, though the queue is off) goes once the victim's
    claim is deallocated."""
    from tests.cluster.test_spot_cluster import GRACE, _priority_classes

    dra_driver.install(kube)
    (node,) = gpu_nodes(GpuNode("mig2", mig={"1g.18gb": 2}, dra=True))
    dra_driver.publish(kube, GpuNode(node["metadata"]["name"], mig={"1g.18gb": 2}, dra=True),
                       owner=node["metadata"]["uid"])
    on_demand_class, spot_class = _priority_classes(kube, namespace)
    for name in ("sue-home", "odin-home"):
        home_volume(kube, control_plane, namespace, name)
    spot = {"profiles": [{**PROFILES["profiles"][0], "spot_price_per_hour": "3.6"}]}
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
            for user in ("sam", "sue"):  # sue's is the more recent: hers is preempted
                r = hub.api("POST", f"users/{user}/server", tokens[user],
                            {"user_options": {"profile": "slice", "tier": "spot"}})
                assert r.status_code in (201, 202), r.text
                hub.wait_server_ready(user, tokens[user], timeout=120)
                time.sleep(1.1)  # start times a second apart (the API's resolution)
            asked = time.monotonic()
            r = start(hub, "odin", tokens["odin"], "slice")
            assert r.status_code in (201, 202), r.text

            def warned():
                return [n for n in hub.service("GET", "api/notices", tokens["sue"]).json()[
                    "notices"] if n["kind"] == "preemption_warning"]
            (notice,) = wait_for("sue is told", warned, timeout=60, hub=hub)
            assert notice["deadline"]
            assert pod_of(kube, namespace, "odin") is None  # no pod while the claim is held
            hub.wait_server_ready("odin", tokens["odin"], timeout=120)
            assert time.monotonic() - asked >= GRACE - 1  # it waited out sue's grace
            assert pod_of(kube, namespace, "sue") is None  # gone before odin's pod was made
            hub.wait_server_stopped("sue", tokens["sue"], timeout=30)  # her stop's last steps
            (sue,) = sessions_of(hub, tokens["sue"])
            assert sue["tier"] == "spot" and sue["end_reason"] == "preempted", sue
            assert hub.api("GET", "users/sam", admin).json()["servers"][""]["ready"]
            assert not [n for n in hub.service("GET", "api/notices", tokens["sam"]).json()[
                "notices"] if n["kind"] == "preemption_warning"]
            odin = pod_of(kube, namespace, "odin")
            assert claim_of(kube, namespace, odin)["status"]["allocation"]
    finally:
        for name in (on_demand_class, spot_class):
            kube.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        for name in ("sue-home", "odin-home"):
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-{name}")
