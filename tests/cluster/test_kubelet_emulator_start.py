"""The kubelet emulator's start of a pod, as billing reads it: the image pull (a delay of
the image's own, the pod Pending meanwhile), `startedAt` at the container's exec, and a
pod removed with grace 0 at any point of its start (tests/cluster/pod_plan.py)."""

from __future__ import annotations

import time
import uuid

from gpulease.spawners.kube.pod_start import k8s_time, launched_at
from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.stand_ins import map_stand_in, ours
from tests.cluster.test_kubelet_emulator import _gone, _pod, _processes_with


def _events(kube: Kube, namespace: str, name: str) -> list[dict]:
    return [e for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["involvedObject"]["name"] == name]


def _waiting(kube: Kube, namespace: str, name: str) -> str | None:
    try:
        statuses = kube.get(pods_path(namespace, name))["status"].get("containerStatuses", [])
    except KubeError:
        return None
    return statuses[0]["state"].get("waiting", {}).get("reason") if statuses else None


def test_a_pull_delay_keeps_the_pod_pending_and_its_container_starts_at_its_exec(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes):
    gpu_nodes(GpuNode("n", gpus=1))
    image = f"registry.example.test/{namespace}/slow-pull:1"
    map_stand_in(control_plane, image, ours(), pull_delay_s=3)
    kube.create(pods_path(namespace), _pod("slow", namespace, "import time; time.sleep(60)",
                                           image=image))
    kube.wait_for("the pod pulling its image", lambda: _waiting(
        kube, namespace, "slow") == "ContainerCreating", timeout=30)
    assert kube.get(pods_path(namespace, "slow"))["status"]["phase"] == "Pending"
    pod = kube.wait_for("the pod running", lambda: (p := kube.get(pods_path(
        namespace, "slow")))["status"].get("phase") == "Running" and p, timeout=30)
    (status,) = pod["status"]["containerStatuses"]
    started = k8s_time(status["state"]["running"]["startedAt"])
    created = k8s_time(pod["metadata"]["creationTimestamp"])
    assert launched_at(pod) == started
    assert (started - created).total_seconds() >= 2  # the 3 s pull, both times truncated
    assert k8s_time(pod["status"]["startTime"]) < started  # the kubelet took it before

    reasons = [e["reason"] for e in _events(kube, namespace, "slow")]
    assert "Pulling" in reasons, reasons
    (said,) = [e["message"] for e in _events(kube, namespace, "slow") if e["reason"] == "Started"]
    execed = said.rsplit("exec'd at ", 1)[1]
    assert k8s_time(execed).replace(microsecond=0) == started  # truncated, as Kubernetes does


def test_a_pod_removed_with_grace_0_while_its_image_is_pulled_never_runs(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes):
    gpu_nodes(GpuNode("n", gpus=1))
    image = f"registry.example.test/{namespace}/slow-pull:1"
    map_stand_in(control_plane, image, ours(), pull_delay_s=4)
    marker = f"gpulease-test-{uuid.uuid4().hex}"
    kube.create(pods_path(namespace), _pod("never", namespace,
                                           f"import time; time.sleep(600)  # {marker}",
                                           image=image, grace=300))
    kube.wait_for("the pod pulling its image", lambda: _waiting(
        kube, namespace, "never") == "ContainerCreating", timeout=30)
    kube.delete(pods_path(namespace, "never"), {"gracePeriodSeconds": 0})
    assert _gone(kube, namespace, "never")
    time.sleep(5)  # past the pull: nothing was started
    assert _processes_with(marker) == []
    assert "Started" not in [e["reason"] for e in _events(kube, namespace, "never")]
