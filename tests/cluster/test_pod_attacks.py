"""Attacks on the cluster shape's accounting, on the real API server with a real hub.

A pod's labels are written by whoever makes it. Anyone allowed to make pods in
another namespace of the cluster (a batch tenant, a researcher's own CI
namespace) can label one `hub.jupyter.org/username: alice`: gpulease must not
count it as alice's server (against her GPU limits, as the holder of its GPUs).
Only the servers' namespace, where only the hub makes pods, holds gpulease's.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpulease.spawners.context import GPULeaseContext
from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.test_cluster_inventory_api import gpu_pod
from tests.cluster.test_cluster_queue_hub import wait_ready as wait_user_ready
from tests.cluster.test_gpu_kube_spawner_hub import gpu_hub_at
from tests.cluster.test_kubespawner import stop_keeping_home, wait_ready

SLICE = "nvidia.com/mig-1g.18gb"
# Nothing of the hub's own (its API server credentials, database, proxy or cookie
# secrets) reaches a user's pod: only JupyterHub's per-server variables and gpulease's.
HUB_SECRETS = re.compile(r"KUBE|PROXY|COOKIE|CRYPT|DB_URL|PASSWORD|SECRET|SMTP|CONFIG",
                         re.IGNORECASE)


def test_a_forged_user_label_in_another_namespace_counts_as_that_pod_not_the_user(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    with gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path,
                    extra_config="c.JupyterHub.allow_named_servers = True\n") as (hub, _home):
        forged_label_attack(hub, kube, namespace, tmp_path)


def forged_label_attack(hub, kube: Kube, namespace: str, tmp_path: Path) -> None:
    ctx = GPULeaseContext(f"sqlite:///{tmp_path}/gpulease.sqlite")
    ctx.limits.set("user:alice", {"max_slices": 1}, actor="test")
    ctx.engine.dispose()

    # Another tenant's namespace: a pod there labelled as alice's server "other", on a
    # slice of the hub's own pool.
    other = f"{namespace[:50]}-other"
    kube.create("/api/v1/namespaces", {"metadata": {"name": other}})
    try:
        kube.wait_for(f"the default ServiceAccount of {other}",
                      lambda: kube.get(f"/api/v1/namespaces/{other}/serviceaccounts/default"))
        forged = gpu_pod(namespace, "forged", f"{namespace}-h200", SLICE, 1,
                         user="alice", server="other")
        kube.create(pods_path(other), forged)
        kube.wait_for("the forged pod bound", lambda: kube.get(
            pods_path(other, "forged"))["spec"].get("nodeName"))

        # alice's one slice is still hers to use: the forged pod is not counted as hers.
        assert hub.api("POST", "/users/alice").status_code == 201
        r = hub.api("POST", "/users/alice/server", json={"profile": "h200-1g"})
        assert r.status_code in (201, 202), r.text + hub.tail()
        wait_ready(hub)

        # And her pod carries none of the hub's credentials or configuration.
        (container,) = kube.get(pods_path(namespace, "jupyter-alice"))["spec"]["containers"]
        leaked = [e["name"] for e in container.get("env", [])
                  if HUB_SECRETS.search(e["name"]) and not e["name"].startswith("JUPYTERHUB_")]
        assert leaked == [], leaked
        assert not any(str(tmp_path) in (e.get("value") or "") for e in container["env"])

        # Her limit still holds against her own pods: a second (named) server is refused.
        r = hub.api("POST", "/users/alice/servers/second", json={"profile": "h200-1g"})
        assert r.status_code == 409, r.text
        assert "limit" in r.json()["message"]
        stop_keeping_home(hub, kube, namespace)
    finally:
        kube.delete(f"/api/v1/namespaces/{other}")


def test_a_user_whose_name_kubespawner_escapes_is_held_to_her_gpu_limit(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """Attack: `a--b` is a valid gpulease user name, but kubespawner escapes it in the pod's
    `hub.jupyter.org/username` label (`a-b---<hash>`). Read from the label, her running
    pod was nobody's she knew: a named server started past her one-slice limit."""
    user = "a--b"
    with gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path, users=(user,),
                    extra_config="c.JupyterHub.allow_named_servers = True\n") as (hub, _home):
        ctx = GPULeaseContext(f"sqlite:///{tmp_path}/gpulease.sqlite")
        ctx.limits.set(f"user:{user}", {"max_slices": 1}, actor="test")
        ctx.engine.dispose()
        assert hub.api("POST", f"/users/{user}").status_code == 201
        r = hub.api("POST", f"/users/{user}/server", json={"profile": "h200-1g"})
        assert r.status_code in (201, 202), r.text + hub.tail()
        wait_user_ready(hub, user)
        (pod,) = [p for p in kube.get(pods_path(namespace))["items"]
                  if p["metadata"]["annotations"].get("hub.jupyter.org/username") == user]
        assert pod["metadata"]["labels"]["hub.jupyter.org/username"] != user  # escaped

        r = hub.api("POST", f"/users/{user}/servers/second", json={"profile": "h200-1g"})
        assert r.status_code == 409, r.text
        assert f"held by {user}/" in r.json()["message"], r.json()


def test_a_pod_asking_1k_gpus_in_another_namespace_does_not_stop_every_gpu_start(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """Attack: anyone who may make a pod anywhere asks `nvidia.com/gpu: 1k` (a whole
    quantity: the API server takes it, and the pod stays Pending). The inventory read
    it with int() and raised: every GPU start of every user failed, until it was gone."""
    with gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path) as (hub, _home):
        other = f"{namespace[:50]}-other"
        kube.create("/api/v1/namespaces", {"metadata": {"name": other}})
        try:
            kube.wait_for(f"the default ServiceAccount of {other}",
                          lambda: kube.get(f"/api/v1/namespaces/{other}/serviceaccounts/default"))
            kube.create(pods_path(other), gpu_pod(namespace, "thousand", f"{namespace}-h200",
                                                  "nvidia.com/gpu", "1k"))
            assert hub.api("POST", "/users/alice").status_code == 201
            r = hub.api("POST", "/users/alice/server", json={"profile": "h200-1g"})
            assert r.status_code in (201, 202), r.text + hub.tail()
            wait_user_ready(hub, "alice")
            stop_keeping_home(hub, kube, namespace)
        finally:
            kube.delete(f"/api/v1/namespaces/{other}")


def test_a_cpu_only_pod_tells_the_nvidia_runtime_to_give_it_no_gpu(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    """Attack: the CPU-only profile (0.10 credits/h) runs the pytorch and cuda images,
    built FROM nvidia/cuda, whose ENV NVIDIA_VISIBLE_DEVICES=all the NVIDIA container
    runtime honours in a container that asked the device plugin for nothing (the GPU
    operator makes it the default runtime). On a GPU node without a GPU taint such a pod
    got every GPU of the node, unbilled and uncounted. The embedded shape sets `void`."""
    with gpu_hub_at(control_plane, kube, namespace, gpu_nodes, tmp_path) as (hub, _home):
        assert hub.api("POST", "/users/alice").status_code == 201
        r = hub.api("POST", "/users/alice/server", json={"profile": "cpu"})
        assert r.status_code in (201, 202), r.text + hub.tail()
        wait_user_ready(hub, "alice")
        (container,) = kube.get(pods_path(namespace, "jupyter-alice"))["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", env
        assert "CUDA_VISIBLE_DEVICES" in env and not env["CUDA_VISIBLE_DEVICES"], env  # ""
        stop_keeping_home(hub, kube, namespace)

        # A GPU start of the same spawner after it leaves the device plugin's word alone.
        r = hub.api("POST", "/users/alice/server", json={"profile": "h200-1g"})
        assert r.status_code in (201, 202), r.text + hub.tail()
        wait_user_ready(hub, "alice")
        (container,) = kube.get(pods_path(namespace, "jupyter-alice"))["spec"]["containers"]
        names = {e["name"] for e in container.get("env", [])}
        assert not names & {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}, names
        stop_keeping_home(hub, kube, namespace)
