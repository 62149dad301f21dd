"""The cluster shape's queue survives a hub restart (gpulease.hub.servers.queue_resume), through
`gpulease up` on the test control plane (test_gpulease_up_cluster.py's cluster_hub).

Every MIG slice of the pool is held by another tenant's pods; alice's start waits in
the queue; the hub is stopped with Ctrl-C and started again: her start waits in the
new hub's queue, with its position and saved options and no pod, and starts when a
slice frees.
"""

from __future__ import annotations

import time

from tests.cluster.kube import Kube, pods_path
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_gpulease_up_cluster import (  # noqa: F401 (cluster_hub: a fixture)
    PW,
    SLICE,
    cluster_hub,
    pod_of,
    start,
)
from tests.support.hubproc import HubProcess
from tests.support.queue_reads import queue_of, wait_for_progress

SLICES = 7  # cluster_hub's node: 7 x 1g.18gb
WAITING = "Waiting for a free H200 slice 1g.18gb: position 1 in the queue"


def test_a_queued_start_survives_a_hub_restart_and_starts_when_a_slice_frees(
        cluster_hub: HubProcess, kube: Kube, namespace: str):  # noqa: F811
    hub = cluster_hub
    node = f"{namespace}-h200"
    for i in range(SLICES):  # another tenant's pods hold every slice
        kube.create(pods_path(namespace), gpu_pod(namespace, f"other-{i}", node, SLICE, 1))
    kube.wait_for("every slice held", lambda: all(
        kube.get(pods_path(namespace, f"other-{i}"))["spec"].get("nodeName")
        for i in range(SLICES)))
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")
    assert start(hub, "alice", alice, "slice").status_code == 202
    wait_for_progress(hub, "alice", alice, WAITING, timeout=60)
    waiting = [{"user": "alice", "server": "", "profile": "slice", "position": 1}]
    assert queue_of(hub, admin) == waiting

    assert hub.interrupt() == 0, hub.log()[-3000:]
    hub.start(timeout=120)
    admin = hub.token_for("admin", PW)
    alice = hub.token_for("alice", "alice-pw-12345")
    assert wait_for_progress(hub, "alice", alice, WAITING, timeout=60)[-1] == WAITING
    assert queue_of(hub, admin) == waiting
    model = hub.api("GET", "users/alice?include_stopped_servers=1", admin).json()
    assert model["servers"][""]["user_options"] == {"profile": "slice"}
    assert pod_of(kube, namespace, "alice") is None  # no pod while it waits
    assert "Starting again alice/(default) (slice)" in hub.log()

    kube.delete(pods_path(namespace, "other-0"), {"gracePeriodSeconds": 0})
    hub.wait_server_ready("alice", alice, timeout=120)
    (container,) = pod_of(kube, namespace, "alice")["spec"]["containers"]
    assert container["resources"]["limits"][SLICE] == "1"
    assert queue_of(hub, admin) == []
    for i in range(1, SLICES):
        kube.delete(pods_path(namespace, f"other-{i}"), {"gracePeriodSeconds": 0})
    deadline = time.monotonic() + 60
    assert hub.api("DELETE", "users/alice/server", alice).status_code in (202, 204)
    while pod_of(kube, namespace, "alice") is not None:
        assert time.monotonic() < deadline
        time.sleep(0.5)
