"""The test control plane is real Kubernetes where it matters: version, admission, RBAC, scheduling."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.rbac import grant, service_account_token

MODULES = Path(__file__).parent / "tools"


def _pod(name: str, namespace: str, *, resources: dict | None = None,
         security: dict | None = None) -> dict:
    container = {"name": "main", "image": "gpulease/singleuser:test",
                 "command": ["python", "-c", "import time; time.sleep(600)"]}
    if resources:
        container["resources"] = resources
    if security:
        container["securityContext"] = security
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "nodeSelector": {POOL_LABEL: namespace},
                     "terminationGracePeriodSeconds": 1}}


def test_the_api_server_reports_the_pinned_release(control_plane: ControlPlane, kube: Kube):
    required = re.search(r"^require k8s.io/kubernetes (v\S+)$",
                         (MODULES / "kubernetes" / "go.mod").read_text(), re.M).group(1)
    version = kube.get("/version")
    assert version["gitVersion"] == required  # Helm's kubeVersion checks read this
    assert version["major"] == "1" and required.startswith(f"v1.{version['minor']}.")
    assert control_plane.state["ready_s"] < 60


def test_gpu_nodes_carry_device_plugin_capacity_and_gfd_labels(gpu_nodes, kube: Kube):
    (node,) = gpu_nodes(GpuNode("mig", mig={"1g.18gb": 7}),)
    labels, capacity = node["metadata"]["labels"], node["status"]["allocatable"]
    assert capacity["nvidia.com/mig-1g.18gb"] == "7"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/mig-1g.18gb.count"] == "7"
    assert labels["nvidia.com/cuda.driver-version.full"].count(".") == 2
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"  # kwok's node stage
    name = node["metadata"]["name"]
    lease = kube.wait_for("kwok's node lease", lambda: kube.get(
        f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"))
    assert lease["spec"]["leaseDurationSeconds"] == 40 and lease["spec"]["renewTime"]


def test_a_privileged_pod_is_refused_in_a_restricted_namespace(kube: Kube, namespace: str):
    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    with pytest.raises(KubeError) as refused:
        kube.create(pods_path(namespace), _pod("root", namespace, security={"privileged": True}))
    assert refused.value.status == 403
    assert 'violates PodSecurity "restricted:latest"' in refused.value.message
    assert "privileged" in refused.value.message


def test_a_service_account_without_pod_rights_gets_403(control_plane: ControlPlane, kube: Kube,
                                                       namespace: str):
    token = service_account_token(kube, namespace, "no-pods", seconds=600)  # TokenRequest: the SA signing keys work
    as_account = control_plane.as_token(token)
    with pytest.raises(KubeError) as refused:
        as_account.create(pods_path(namespace), _pod("p", namespace))
    assert refused.value.status == 403
    assert (f'User "system:serviceaccount:{namespace}:no-pods" cannot create resource "pods"'
            in refused.value.message)
    # The same account with a Role that grants pods: it is RBAC that refused, not the token.
    grant(kube, namespace, "no-pods", rules=[
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}])
    created = kube.wait_for("the RoleBinding to apply", lambda: as_account.create(
        pods_path(namespace), _pod("p", namespace)), timeout=10)
    assert created["metadata"]["name"] == "p"


def test_an_extended_resource_whose_request_differs_from_its_limit_is_refused(
        kube: Kube, namespace: str):
    with pytest.raises(KubeError) as refused:
        kube.create(pods_path(namespace), _pod("gpu", namespace, resources={
            "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}}))
    assert refused.value.status == 422 and refused.value.reason == "Invalid"
    assert "nvidia.com/gpu" in refused.value.message
    assert "must be equal to" in refused.value.message


def test_more_mig_slices_than_any_node_has_stays_pending_with_the_schedulers_event(
        kube: Kube, namespace: str, gpu_nodes):
    gpu_nodes(GpuNode("a", mig={"1g.18gb": 7}), GpuNode("b", mig={"1g.18gb": 3}, gpus=1))
    kube.create(pods_path(namespace), _pod("big", namespace, resources={
        "limits": {"nvidia.com/mig-1g.18gb": "8"}}))

    def failed_scheduling():
        events = kube.get(f"/api/v1/namespaces/{namespace}/events",
                          fieldSelector="involvedObject.name=big")["items"]
        # (an attempt made while a new node still has its not-ready taint says only that;
        # the event that counts names the resource)
        return [e for e in events if e["reason"] == "FailedScheduling"
                and "Insufficient nvidia.com/mig-1g.18gb" in e["message"]]
    (event, *_) = kube.wait_for("the scheduler's FailedScheduling event", failed_scheduling)
    assert "Insufficient nvidia.com/mig-1g.18gb" in event["message"], event
    assert event["reportingComponent"] == "default-scheduler", event
    time.sleep(1)
    pod = kube.get(pods_path(namespace, "big"))
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"
