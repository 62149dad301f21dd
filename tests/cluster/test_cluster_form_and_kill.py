"""`gpulease up` in the cluster shape: what users see free comes from the cluster, and a stop
that hangs is killed.

- The start form (the hub's /hub/spawn page, as a logged-in user's browser gets it) and
  `api/profiles` count a slice profile and a 2-GPU profile on the cluster's nodes of the
  spawner's node selector, minus every pod's holds; they change as other pods take
  capacity; a profile no node offers says it can never run here.
- A server whose stop hangs (a container that ignores SIGTERM, deleted with a 300 s grace
  period) is killed by GPUKubeSpawner.kill_now when the heartbeat's out-of-credit stop does
  not complete: its pod is deleted again with grace 1 s (the kubelet kills it at once), the
  stop then completes, and its billing session closes as out_of_credit, not before its pod
  left the API server (tests/cluster/test_kill_frees_slice.py: why not grace 0).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.cluster.conftest import SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_gpulease_up_cluster import (
    HEARTBEAT,
    PW,
    cluster_hub_at,
    pod_of,
    sessions_of,
    start,
    wait_for,
)

SLICE = "nvidia.com/mig-1g.18gb"
MORE_PROFILES = [
    {"slug": "two-cards", "display_name": "Two H200", "gpu": {"model": "H200", "count": 2},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "72", "min_run": "1s"},
    {"slug": "a100", "display_name": "An A100", "gpu": {"model": "A100-80GB"},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "20", "min_run": "1s"},
]


def shown_on_form(page: str, slug: str) -> str:
    """The availability text of one profile's card on the start form."""
    card = re.search(rf'data-profile="{slug}">(.*?)</label>', page, re.S)
    assert card, f"no card for {slug} in:\n{page[:3000]}"
    found = re.search(r'class="gpulease-availability[^"]*"[^>]*>([^<]*)<', card.group(1))
    assert found, card.group(1)
    return found.group(1)


def test_the_start_form_and_api_profiles_count_the_clusters_gpus(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("slices", mig={"1g.18gb": 7}), GpuNode("cards-a", gpus=2),
              GpuNode("cards-b", gpus=2))
    with cluster_hub_at(control_plane, kube, namespace, tmp_path) as hub:
        admin = hub.token_for("admin", PW)
        r = hub.service("PUT", "api/profiles", admin, {"profiles": MORE_PROFILES,
                                                       "prune": False})
        assert r.status_code == 200, r.text
        hub.add_user(admin, "alice", "100")
        browser = hub.login_form("alice", "alice-pw-12345")
        assert browser.login_status == 302

        def form() -> str:
            page = browser.get(f"{hub.url}/hub/spawn", timeout=60)
            assert page.status_code == 200, page.text[:2000]
            return page.content.decode()

        def profiles() -> dict[str, dict]:
            r = hub.service("GET", "api/profiles", hub.token_for("alice", "alice-pw-12345"))
            assert r.status_code == 200, r.text
            return {p["slug"]: p["availability"] for p in r.json()["profiles"]}

        page = form()
        assert shown_on_form(page, "slice") == "7 of 7 free"
        assert shown_on_form(page, "two-cards") == "4 of 4 free"
        never = shown_on_form(page, "a100")
        assert "No node offers 1× A100-80GB (full card), so it can never run here" in never
        assert "(offered: H200 full cards, H200 slice 1g.18gb)" in never
        listed = profiles()
        assert listed["slice"] == {"free": 7, "total": 7, "queued": 0, "state": "free"}
        assert listed["a100"]["state"] == "never"

        # Other pods take capacity: three slices, and one card on each card node, so two
        # cards are free but not two on one node: a 2-GPU start would wait.
        for name, node, resource, count in (("batch-s", "slices", SLICE, 3),
                                            ("batch-a", "cards-a", "nvidia.com/gpu", 1),
                                            ("batch-b", "cards-b", "nvidia.com/gpu", 1)):
            kube.create(pods_path(namespace), gpu_pod(namespace, name, f"{namespace}-{node}",
                                                      resource, count))
        wait_for("the form showing the other pods' holds (each pod's is seen apart)",
                 lambda: shown_on_form(page := form(), "slice") == "4 of 7 free"
                 and shown_on_form(page, "two-cards").startswith("2 of 4"), timeout=30, hub=hub)
        page = form()
        assert shown_on_form(page, "two-cards") == "2 of 4 free now: you will wait in the queue"
        listed = wait_for("api/profiles showing the holds (its listing is kept 3 s)",
                          lambda: (p := profiles())["slice"]["free"] == 4 and p, timeout=15)
        assert listed["slice"]["state"] == "free"
        assert listed["two-cards"] == {"free": 2, "total": 4, "queued": 0, "state": "queue"}

        # A pod goes: its card is free again, and the 2-GPU profile fits on that node.
        kube.delete(pods_path(namespace, "batch-a"))
        wait_for("the form showing the card freed",
                 lambda: shown_on_form(form(), "two-cards") == "3 of 4 free", timeout=40, hub=hub)


STUBBORN = {"name": "stubborn", "image": SINGLEUSER_IMAGE, "command": [
    "python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "time.sleep(3600)"]}


def test_a_stop_that_hangs_is_killed_and_its_billing_closes(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, extra_args=(
            f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1",
            # A pod whose stop hangs: a container that ignores SIGTERM, and a long grace.
            "--GPUKubeSpawner.delete_grace_period=300",
            f"--GPUKubeSpawner.extra_containers={json.dumps([STUBBORN])}",
            '--GPUKubeSpawner.extra_pod_config={"terminationGracePeriodSeconds": 300}')) as hub:
        admin = hub.token_for("admin", PW)
        # Twelve seconds of the pricey slice, billed from its container's start: it runs
        # out once the server is up (a loaded machine takes seconds to start it).
        alice = hub.add_user(admin, "alice", "12")
        assert start(hub, "alice", alice, "pricey-slice").status_code in (201, 202)
        hub.wait_server_ready("alice", alice, timeout=120)
        uid = pod_of(kube, namespace, "alice")["metadata"]["uid"]
        ready = time.monotonic()

        # The out-of-credit stop deletes the pod with 300 s of grace; until the pod is
        # gone from the API server its session stays open.
        terminating = wait_for("alice's pod terminating", lambda: (
            p := pod_of(kube, namespace, "alice")) and p["metadata"].get("deletionTimestamp")
            and p, timeout=30, hub=hub)
        assert terminating["metadata"]["uid"] == uid
        open_while_there = sessions_of(hub, alice)[-1]
        still = pod_of(kube, namespace, "alice")
        if still is not None and still["metadata"]["uid"] == uid:
            assert open_while_there["ended"] is None, open_while_there

        wait_for("alice's pod deleted (killed)", lambda: pod_of(kube, namespace, "alice") is None,
                 timeout=30, hub=hub)
        hub.wait_server_stopped("alice", alice, timeout=30)
        assert time.monotonic() - ready < 40  # not the 300 s of grace
        session = sessions_of(hub, alice)[-1]
        assert session["end_reason"] == "out_of_credit" and session["ended"] is not None
        log = hub.log()
        assert f"its pod {namespace}/jupyter-alice deleted with grace 1 s" in log, log[-4000:]
        assert "has no kill_now" not in log

