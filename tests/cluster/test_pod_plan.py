"""The kubelet emulator's decisions, without a cluster (tests/cluster/pod_plan.py)."""

from __future__ import annotations

import pytest

from tests.cluster import pod_plan
from tests.cluster.pod_plan import Image, PlanError


def _pod(**container) -> dict:
    base = {"name": "notebook", "image": "img", "args": ["jupyterhub-singleuser"]}
    return {"metadata": {"name": "jupyter-alice", "namespace": "ns", "uid": "u-1"},
            "spec": {"nodeName": "n1", "containers": [{**base, **container}],
                     "securityContext": {"runAsUser": 1000, "fsGroup": 100}}}


def test_devices_are_picked_from_the_declared_ones_never_a_taken_one():
    declared = {"nvidia.com/mig-1g.18gb": ["MIG-a", "MIG-b", "MIG-c"]}
    chosen = pod_plan.pick_devices({"nvidia.com/mig-1g.18gb": 2}, declared, taken={"MIG-a"})
    assert chosen == {"nvidia.com/mig-1g.18gb": ["MIG-b", "MIG-c"]}
    with pytest.raises(PlanError) as refused:
        pod_plan.pick_devices({"nvidia.com/mig-1g.18gb": 2}, declared, taken={"MIG-a", "MIG-b"})
    assert refused.value.reason == "UnexpectedAdmissionError"
    assert "Requested: 2, Available: 1" in refused.value.message


def test_gpu_requests_count_only_nvidia_resources():
    pod = _pod(resources={"limits": {"nvidia.com/gpu": "2", "cpu": "4"},
                          "requests": {"memory": "1Gi"}})
    assert pod_plan.gpu_requests(pod) == {"nvidia.com/gpu": 2}


def test_the_server_binds_the_pods_own_address_and_home_is_the_volume():
    pod = _pod(env=[{"name": "JUPYTERHUB_SERVICE_URL", "value": "http://0.0.0.0:8888/user/alice/"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
               volumeMounts=[{"name": "home", "mountPath": "/home/jovyan"}])
    plan = pod_plan.plan_container(pod, pod["spec"]["containers"][0], Image("/envs/lab"),
                                   "127.1.0.7", {"/home/jovyan": "/srv/pv/alice"},
                                   {"nvidia.com/mig-1g.18gb": ["MIG-x"]})
    assert plan.env["JUPYTERHUB_SERVICE_URL"] == "http://127.1.0.7:8888/user/alice/"
    assert plan.env["POD"] == "jupyter-alice"
    assert plan.env["HOME"] == plan.cwd == "/srv/pv/alice"
    assert plan.env["PATH"].startswith("/envs/lab/bin:")
    assert plan.env["NVIDIA_VISIBLE_DEVICES"] == "MIG-x"
    assert plan.env[pod_plan.POD_MARKER] == "u-1"
    assert (plan.uid, plan.gid, plan.groups) == (1000, 1000, [100])
    assert plan.argv == ["jupyterhub-singleuser"]


def test_a_pod_without_gpus_sees_none():
    pod = _pod()
    plan = pod_plan.plan_container(pod, pod["spec"]["containers"][0], Image("/e"), "127.1.0.2",
                                   {}, {})
    assert plan.env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_run_as_non_root_with_a_root_image_is_refused():
    pod = _pod(securityContext={"runAsNonRoot": True})
    pod["spec"]["securityContext"] = {}
    with pytest.raises(PlanError) as refused:
        pod_plan.plan_container(pod, pod["spec"]["containers"][0], Image("/e", user=0),
                                "127.1.0.2", {}, {})
    assert refused.value.reason == "CreateContainerConfigError"


def test_exit_codes_decide_the_phase():
    pod = _pod()
    ok = pod_plan.terminated_status(pod, {"notebook": 0}, "t0", "t1")
    assert ok["phase"] == "Succeeded"
    assert ok["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    failed = pod_plan.terminated_status(pod, {"notebook": 137}, "t0", "t1")
    assert failed["phase"] == "Failed"
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_a_failed_container_under_fallback_to_logs_gets_its_logs_tail_as_its_message():
    """The kubelet's rule: exit code not 0 and terminationMessagePolicy FallbackToLogsOnError
    (the emulator has no termination message file): the last 80 lines, of which the last
    2048 bytes; nothing for a container that succeeded or keeps the default policy."""
    pod = _pod()
    pod["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    log = b"".join(b"line %03d\n" % i for i in range(100))
    failed = pod_plan.terminated_status(pod, {"notebook": 3}, "t0", "t1", logs={"notebook": log})
    message = failed["containerStatuses"][0]["state"]["terminated"]["message"]
    assert message.splitlines() == [f"line {i:03d}" for i in range(20, 100)]
    wide = b"".join(b"%03d" % i + b"x" * 96 + b"\n" for i in range(50))  # 100 bytes a line
    message = pod_plan.terminated_status(pod, {"notebook": 1}, "t0", "t1",
                                         logs={"notebook": wide})["containerStatuses"][0][
        "state"]["terminated"]["message"]
    assert len(message) == 2048 and message.endswith("049" + "x" * 96 + "\n")
    ok = pod_plan.terminated_status(pod, {"notebook": 0}, "t0", "t1", logs={"notebook": log})
    assert "message" not in ok["containerStatuses"][0]["state"]["terminated"]
    plain = _pod()  # the default policy, File: only the (absent) file's content
    failed = pod_plan.terminated_status(plain, {"notebook": 3}, "t0", "t1",
                                        logs={"notebook": log})
    assert "message" not in failed["containerStatuses"][0]["state"]["terminated"]
