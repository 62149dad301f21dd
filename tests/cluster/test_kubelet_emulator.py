"""The kubelet emulator (a test double) on the real control plane: pods scheduled by the
real scheduler onto emulated GPU nodes run as local processes, get devices of their
own, report their status and end completely when deleted."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.conftest import POD_UID, POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.kubelet_emulator import AGENT
from tests.cluster.nodes import GpuNode
from tests.cluster.pod_plan import DEVICES_ANNOTATION


def _pod(name: str, namespace: str, script: str, *, limits: dict | None = None,
         workdir: Path | None = None, grace: int = 2, image: str = "gpulease/singleuser:test",
         restart: str = "Never") -> dict:
    container = {"name": "main", "image": image, "command": ["python", "-c", script],
                 "resources": {"limits": limits or {}}}
    spec = {"containers": [container], "nodeSelector": {POOL_LABEL: namespace},
            "restartPolicy": restart, "terminationGracePeriodSeconds": grace}
    if workdir:
        container["workingDir"] = "/data"
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "hostPath": {"path": str(workdir)}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _phase(kube: Kube, namespace: str, name: str) -> str:
    return kube.get(pods_path(namespace, name))["status"].get("phase", "")


@pytest.fixture
def data(control_plane: ControlPlane) -> Path:
    """A host folder pods (uid 1000) can write, for a hostPath volume."""
    folder = control_plane.root / "volumes" / uuid.uuid4().hex[:8]
    folder.mkdir(parents=True)
    folder.parent.chmod(0o755)
    folder.chmod(0o1777)
    return folder


def test_a_pod_runs_as_its_user_at_its_own_address_and_reports_its_exit(
        kube: Kube, namespace: str, gpu_nodes, data: Path):
    gpu_nodes(GpuNode("n", gpus=1))
    script = ("import json, os, socket, sys; "
              "json.dump({'uid': os.getuid(), 'env': dict(os.environ)}, open('me.json', 'w')); "
              "sys.exit(3)")
    kube.create(pods_path(namespace), _pod("one", namespace, script, workdir=data))
    pod = kube.wait_for("pod one ended", lambda: (p := kube.get(pods_path(namespace, "one")))
                        ["status"].get("phase") in ("Succeeded", "Failed") and p, timeout=30)
    assert pod["status"]["phase"] == "Failed"
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 3
    assert status["state"]["terminated"]["reason"] == "Error"
    me = json.loads((data / "me.json").read_text())
    assert me["uid"] == (POD_UID if os.geteuid() == 0 else os.geteuid())
    assert pod["status"]["podIP"].startswith("127.1.") and pod["status"]["hostIP"] == "127.0.0.1"
    assert me["env"]["HOSTNAME"] == "one"
    events = {e["reason"] for e in kube.get(f"/api/v1/namespaces/{namespace}/events",
                                            fieldSelector="involvedObject.name=one")["items"]}
    assert {"Scheduled", "Pulled", "Started"} <= events
    # Pod status has one kubelet writing it, the emulator (kwok keeps only the
    # Nodes); the scheduler may have written an Unschedulable condition first,
    # when its cache had not yet seen the new Node.
    writers = {m["manager"] for m in pod["metadata"]["managedFields"]
               if m.get("subresource") == "status"}
    assert AGENT in writers and writers <= {AGENT, "kube-scheduler"}, writers


def test_a_failed_container_reports_the_end_of_its_log_as_its_termination_message(
        kube: Kube, namespace: str, gpu_nodes):
    """terminationMessagePolicy FallbackToLogsOnError, as a kubelet applies it."""
    gpu_nodes(GpuNode("n", gpus=1))
    script = ("import sys\nfor i in range(100): print('line', i)\nsys.stdout.flush()\n"
              "print('\\x1b[31mboom\\x1b[0m', file=sys.stderr)\nsys.exit(4)")
    body = _pod("tail", namespace, script)
    body["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    kube.create(pods_path(namespace), body)
    kube.create(pods_path(namespace), _pod("plain", namespace, script))
    ended = {}
    for name in ("tail", "plain"):
        ended[name] = kube.wait_for(f"pod {name} ended", lambda n=name: (
            p := kube.get(pods_path(namespace, n)))["status"].get("phase") == "Failed" and p,
            timeout=30)["status"]["containerStatuses"][0]["state"]["terminated"]
    lines = ended["tail"]["message"].splitlines()
    assert len(lines) == 80 and lines[0] == "line 21" and lines[-1] == "\x1b[31mboom\x1b[0m"
    assert "message" not in ended["plain"]  # the default policy (File) reads no log


def _listening(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=1).close()
    except OSError:  # not yet (the pod is Running once started, before it listens)
        return False
    return True


def test_running_pods_are_ready_and_reached_at_their_own_addresses(kube: Kube, namespace: str,
                                                                   gpu_nodes):
    gpu_nodes(GpuNode("n"))
    # As KubeSpawner does, both bind everything on one port of one node (one through
    # its environment, one through its arguments); the emulator rewrites 0.0.0.0 to
    # each pod's address, so neither takes the other's port.
    listen = ("import os, socket, sys, time; s = socket.socket(); "
              "s.bind((os.environ.get('BIND') or sys.argv[1], 8888)); s.listen(); time.sleep(600)")
    by_env = _pod("by-env", namespace, listen)
    by_env["spec"]["containers"][0]["env"] = [{"name": "BIND", "value": "0.0.0.0"}]
    by_args = _pod("by-args", namespace, listen)
    by_args["spec"]["containers"][0]["args"] = ["0.0.0.0"]
    for body in (by_env, by_args):
        kube.create(pods_path(namespace), body)
    ips = set()
    for name in ("by-env", "by-args"):
        pod = kube.wait_for(f"{name} Running", lambda n=name: (
            p := kube.get(pods_path(namespace, n)))["status"].get("phase") == "Running" and p)
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True" and ready["ContainersReady"] == "True"
        assert pod["status"]["containerStatuses"][0]["ready"] is True
        ip = pod["status"]["podIP"]
        kube.wait_for(f"{name} listening on {ip}:8888", lambda ip=ip: _listening(ip, 8888),
                      timeout=20)
        ips.add(ip)
    assert len(ips) == 2


def _gone(kube: Kube, namespace: str, name: str) -> bool:
    try:
        kube.get(pods_path(namespace, name))
    except KubeError as e:
        return e.status == 404
    return False


def test_no_device_is_ever_given_to_two_pods(kube: Kube, namespace: str, gpu_nodes,
                                            data: Path):
    (node,) = gpu_nodes(GpuNode("n", mig={"1g.18gb": 3}))
    declared = json.loads(node["metadata"]["annotations"][DEVICES_ANNOTATION])
    slices = declared["nvidia.com/mig-1g.18gb"]
    script = ("import os, time; "
              "open(os.environ['HOSTNAME'], 'w').write(os.environ['NVIDIA_VISIBLE_DEVICES']); "
              "time.sleep(600)")
    for n in range(5):
        kube.create(pods_path(namespace), _pod(f"p{n}", namespace, script, workdir=data,
                                               limits={"nvidia.com/mig-1g.18gb": "1"}, grace=1))

    def visible() -> dict[str, str]:
        return {f.name: f.read_text() for f in data.iterdir() if f.read_text()}
    kube.wait_for("three pods with a slice each", lambda: len(visible()) == 3, timeout=30)
    time.sleep(1)
    seen = visible()
    assert len(seen) == 3  # the other two wait for a free slice (Insufficient)
    assert sorted(seen.values()) == sorted(slices)  # each a declared ID, none twice
    pending = [f"p{n}" for n in range(5) if f"p{n}" not in seen]
    assert all(_phase(kube, namespace, p) == "Pending" for p in pending)

    # A deleted pod's slice goes to a waiting pod, and only that slice.
    first = sorted(seen)[0]
    freed = seen[first]
    kube.delete(pods_path(namespace, first))
    kube.wait_for("a waiting pod given the freed slice", lambda: len(visible()) == 4, timeout=30)
    (newcomer,) = set(visible()) - set(seen)
    assert visible()[newcomer] == freed


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_deleted_pods_processes_are_gone_after_its_grace_period(
        kube: Kube, namespace: str, gpu_nodes):
    gpu_nodes(GpuNode("n"))
    marker = f"gpulease-test-{uuid.uuid4().hex}"
    # The container ignores SIGTERM and leaves a child in a session of its own.
    script = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '{marker}'], "
              "start_new_session=True); time.sleep(600)")
    kube.create(pods_path(namespace), _pod("stubborn", namespace, script + f"  # {marker}", grace=2))
    kube.wait_for("both processes running", lambda: len(_processes_with(marker)) == 2, timeout=30)
    asked = time.monotonic()
    kube.delete(pods_path(namespace, "stubborn"))
    kube.wait_for("the pod object removed by the emulator",
                  lambda: _gone(kube, namespace, "stubborn"), timeout=30)
    took = time.monotonic() - asked
    assert _processes_with(marker) == []
    assert 2 <= took < 10  # SIGTERM ignored: SIGKILL came at the end of the grace period


def test_a_second_shorter_delete_shortens_the_grace_period(kube: Kube, namespace: str,
                                                          gpu_nodes):
    """As a real kubelet: a pod terminating with a long grace period is killed sooner when
    deleted again with a shorter one, and at once (within the kubelet's 2 s minimum) when
    removed from the API server with grace 0 (GPUKubeSpawner.kill_now's delete)."""
    gpu_nodes(GpuNode("n"))
    marker = {name: f"gpulease-test-{uuid.uuid4().hex}" for name in ("shortened", "removed")}
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(900)"
    for name, mark in marker.items():
        kube.create(pods_path(namespace), _pod(name, namespace, f"{script}  # {mark}", grace=300))
    kube.wait_for("both pods running", lambda: all(
        len(_processes_with(m)) == 1 for m in marker.values()), timeout=30)
    time.sleep(2)  # Python has started and ignores SIGTERM (a SIGTERM before that ends it)
    for name in marker:  # the first delete: SIGTERM, ignored, 300 s of grace
        kube.delete(pods_path(namespace, name))
    time.sleep(3)
    counts = {n: len(_processes_with(m)) for n, m in marker.items()}
    assert counts == {"shortened": 1, "removed": 1}  # still in their grace period
    asked = time.monotonic()
    kube.delete(pods_path(namespace, "shortened"), {"gracePeriodSeconds": 3})
    kube.delete(pods_path(namespace, "removed"), {"gracePeriodSeconds": 0})
    assert _gone(kube, namespace, "removed")  # the API object goes at once
    kube.wait_for("the removed pod's process killed",
                  lambda: not _processes_with(marker["removed"]), timeout=15)
    assert time.monotonic() - asked < 8
    kube.wait_for("the shortened pod removed", lambda: _gone(kube, namespace, "shortened"),
                  timeout=20)
    # The API server counts the shorter grace from the first delete (3 s after it: about
    # now), and the kubelet gives its minimum, 2 s, from when it sees the change.
    assert 2 <= time.monotonic() - asked < 12
    assert not _processes_with(marker["shortened"])


def test_an_image_without_a_local_stand_in_fails_to_pull(kube: Kube, namespace: str, gpu_nodes,
                                                         control_plane: ControlPlane):
    gpu_nodes(GpuNode("n"))
    kube.create(pods_path(namespace), _pod("nope", namespace, "pass",
                                           image="registry.example/none:1"))

    def waiting():
        statuses = kube.get(pods_path(namespace, "nope"))["status"].get("containerStatuses", [])
        return statuses and statuses[0]["state"].get("waiting")
    state = kube.wait_for("the container waiting", waiting)
    assert state["reason"] == "ErrImagePull"
    assert "registry.example/none:1" in state["message"]
    assert _phase(kube, namespace, "nope") == "Pending"
