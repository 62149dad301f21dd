"""VS Code's JupyterHub extension against `gpulease up` in the cluster shape.

The extension's own traffic (tests/support/vscode_client.py, the same sequence as the
embedded box's tests/e2e/test_vscode.py) against
`gpulease up --GPULeaseHub.shape=cluster` on the test control plane
(cluster_hub_at): a user with a password mints a token, lists her servers,
starts one with NO body, and runs code on a kernel over the websocket with
the token only in its query string. Each server is a pod that kube-scheduler
places and the kubelet emulator runs (a real JupyterLab server with
gpulease.singleuser). A first empty-body start gets the cheapest CPU-only
profile, by the embedded box's rule; a named server saved with a MIG slice
profile (gpulease's api/servers, what VS Code cannot choose itself) starts
with an empty body as a pod holding the slice, which its kernel sees; and
that kernel's activity reaches the hub and the gpulease service, as the
culler reads them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube
from tests.cluster.nodes import GpuNode
from tests.cluster.pod_plan import DEVICES_ANNOTATION
from tests.cluster.test_gpulease_up_cluster import PROFILES, PW, SLICE, cluster_hub_at
from tests.support.hubproc import HubProcess
from tests.support.vscode_client import extension_sequence, revoke, wait_kernel_activity

CPU = {"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1Gi",
       "images": ["pytorch"], "price_per_hour": "0.10", "min_run": "1s"}
SLICE_PROFILE = next(p for p in PROFILES["profiles"] if p["slug"] == "slice")
# Activity reaches the hub every 2 s instead of every minute (as in test_vscode_e2e).
CONFIG = """
c.GPUKubeSpawner.environment.update({"JUPYTERHUB_ACTIVITY_INTERVAL": "2"})
"""
SHOW_DEVICES = "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])"


@pytest.fixture
def vscode_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
               tmp_path: Path) -> Iterator[tuple[HubProcess, dict]]:
    (node,) = gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, config=CONFIG,
                        profiles={"profiles": [CPU, SLICE_PROFILE]}) as hub:
        yield hub, node


def pods_by_server(kube: Kube, namespace: str) -> dict[str, dict]:
    """'user/server' -> its pod, from kubespawner's annotations."""
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return {f"{a['hub.jupyter.org/username']}/{a.get('hub.jupyter.org/servername', '')}": p
            for p in pods for a in [p["metadata"].get("annotations", {})]}


def test_vscode_extension_sequence_on_the_cluster(vscode_hub, kube: Kube, namespace: str):
    hub, node = vscode_hub
    admin = hub.token_for("admin", PW)
    hub.add_user(admin, "vera", "100")
    password = "vera-pw-12345"  # HubProcess.add_user's

    # A first start with NO body: the cheapest CPU-only profile, as on the embedded box.
    first = extension_sequence(hub, "vera", password, "", None, SHOW_DEVICES,
                               ready_timeout=120)
    assert first.output.strip() == "void"  # the runtime's word for no GPU
    (container,) = pods_by_server(kube, namespace)["vera/"]["spec"]["containers"]
    assert not [r for r in container["resources"]["limits"] if r.startswith("nvidia.com/")]
    model = hub.api("GET", "users/vera?include_stopped_servers=1", admin).json()
    assert model["servers"][""]["user_options"] == {
        "profile": "cpu", "image": "pytorch", "account": "user:vera", "tier": "on-demand"}
    revoke(hub, "vera", first)

    # A named server saved with a MIG slice profile, started by the extension with NO body:
    # a pod holding the slice, which its kernel sees, billed at that profile.
    token = hub.token_for("vera", password)
    r = hub.service("POST", "api/servers", token,
                    {"name": "vscode", "user_options": {"profile": "slice"}})
    assert r.status_code == 201, r.text
    run = extension_sequence(hub, "vera", password, "vscode", {"profile": "slice"},
                             SHOW_DEVICES, ready_timeout=120)
    pod = pods_by_server(kube, namespace)["vera/vscode"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"][SLICE] == "1"
    assert pod["spec"]["nodeName"] == node["metadata"]["name"]
    slices = json.loads(node["metadata"]["annotations"][DEVICES_ANNOTATION])[SLICE]
    assert run.output.strip() in slices, (run.output, slices)
    sessions = hub.service("GET", "api/usage", run.token).json()["sessions"]
    running = sorted((s["server"], s["profile"], s["account"]) for s in sessions
                     if s["ended"] is None)
    assert running == [("", "cpu", "user:vera"), ("vscode", "slice", "user:vera")], sessions

    # The kernel's activity over the websocket reaches the hub and the gpulease service.
    wait_kernel_activity(hub, admin, "vera", run.token, "vscode", run.url, run.kernel)
    revoke(hub, "vera", run)
