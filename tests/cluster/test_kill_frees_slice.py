"""A killed server's slice goes to the next start only once its containers are gone.

GPUKubeSpawner.kill_now ends a stop that does not complete (a container that ignores
SIGTERM within a 300 s grace period). Deleting the pod with grace 0 removed the Pod
object at once, while the kubelet still had to kill the containers (its 2 s minimum):
gpulease's watch saw the slice free, admitted the start waiting for it, kube-scheduler
bound its pod there, and the kubelet refused it (UnexpectedAdmissionError: the device
still in use), so that user's start failed after kubespawner's start_timeout while its
admission kept the free slice counted as taken. The kill now shortens the grace period
instead: the object stays, and counts, until the kubelet has killed the containers.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube
from tests.cluster.nodes import GpuNode
from tests.cluster.pod_plan import DEVICES_ANNOTATION
from tests.cluster.test_cluster_form_and_kill import STUBBORN
from tests.cluster.test_gpulease_up_cluster import (
    HEARTBEAT,
    PW,
    cluster_hub_at,
    pod_of,
    sessions_of,
    start,
    wait_for,
)
from tests.cluster.test_kubespawner import home_volume
from tests.support.queue_reads import queue_of


def bobs_home(kube: Kube, control_plane: ControlPlane, namespace: str) -> None:
    """bob's home exists already (he worked here before): his start makes only his pod,
    at once, as a start waiting for a slice does once it is admitted."""
    storage_class, _ = home_volume(kube, control_plane, namespace, "bob-home")
    kube.create(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
        "metadata": {"name": "claim-bob"},
        "spec": {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}})


def test_a_killed_servers_slice_goes_to_the_queued_start_once_it_is_free(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 1}))  # one slice: the queued start needs it
    bobs_home(kube, control_plane, namespace)
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, extra_args=(
            f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1",
            "--GPUKubeSpawner.delete_grace_period=300",
            f"--GPUKubeSpawner.extra_containers={json.dumps([STUBBORN])}",
            '--GPUKubeSpawner.extra_pod_config={"terminationGracePeriodSeconds": 300}',
            "--GPUKubeSpawner.start_timeout=300")) as hub:
        admin = hub.token_for("admin", PW)
        alice = hub.add_user(admin, "alice", "8")  # eight seconds of the pricey slice
        bob = hub.add_user(admin, "bob", "100")
        assert start(hub, "alice", alice, "pricey-slice").status_code in (201, 202)
        hub.wait_server_ready("alice", alice, timeout=120)
        bobs = ThreadPoolExecutor(1).submit(start, hub, "bob", bob, "slice")
        wait_for("bob waiting in the queue for alice's slice", lambda: [
            q["user"] for q in queue_of(hub, admin)] == ["bob"], timeout=30, hub=hub)
        assert pod_of(kube, namespace, "bob") is None
        assert bobs.result(timeout=30).status_code in (201, 202)

        wait_for("alice's pod killed", lambda: pod_of(kube, namespace, "alice") is None,
                 timeout=60, hub=hub)
        # bob's start takes the slice once alice's containers are gone, and runs: not a pod
        # the kubelet refused, waited on until start_timeout.
        hub.wait_server_ready("bob", bob, timeout=60)
        pod = pod_of(kube, namespace, "bob")
        assert pod is not None and pod["status"].get("phase") == "Running", pod
        hub.wait_server_stopped("alice", alice, timeout=30)
        assert sessions_of(hub, alice)[-1]["end_reason"] == "out_of_credit"
        log = hub.log()
        assert f"its pod {namespace}/jupyter-alice deleted with grace 1 s" in log, log[-4000:]
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-bob-home")


def test_a_pod_the_kubelet_refuses_ends_its_start_at_once_and_frees_its_admission(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """The node advertises a slice its kubelet cannot give (its device gone from the device
    plugin, or still in use by a pod force-deleted a moment ago): bob's pod is admitted,
    bound and refused (UnexpectedAdmissionError, Failed for good). His start fails at once
    naming why (it waited for kubespawner's start_timeout, the queue's wait and more), and
    his admission is forgotten: once the device is back his next start runs on it,
    replacing the Failed pod (kubespawner's 409 path, no stop of that start)."""
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 1}))
    node = f"/api/v1/nodes/{namespace}-h200"
    devices = kube.get(node)["metadata"]["annotations"][DEVICES_ANNOTATION]
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, extra_args=(
            f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1",
            "--GPULeaseHub.queue_max_wait=10m")) as hub:
        admin = hub.token_for("admin", PW)
        bob = hub.add_user(admin, "bob", "100")
        kube.patch(node, {"metadata": {"annotations": {DEVICES_ANNOTATION: "{}"}}})
        time.sleep(1)  # the kubelet emulator's node watch
        refused = start(hub, "bob", bob, "slice")
        assert refused.status_code == 503, refused.text  # within the POST's 10 s
        assert ("Cannot start slice: the node's kubelet refused its pod "
                "(UnexpectedAdmissionError: Allocate failed") in refused.json()["message"]
        servers = hub.api("GET", "users/bob", bob).json()["servers"]
        assert not servers or not servers[""].get("pending"), servers

        kube.patch(node, {"metadata": {"annotations": {DEVICES_ANNOTATION: devices}}})
        time.sleep(1)
        assert start(hub, "bob", bob, "slice").status_code in (201, 202)  # counted free
        hub.wait_server_ready("bob", bob, timeout=60)
