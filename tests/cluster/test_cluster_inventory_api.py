"""api/inventory's cluster form and the inventory page, on the real API server.

A real `gpulease up --GPULeaseHub.shape=cluster` (tests/support/hubproc.py: the real
proxy and the gpulease service, which the hub gives GPULEASE_CLUSTER_NAMESPACE
and its KUBECONFIG), with a ServiceAccount token holding only the
inventory's ClusterRole (CLUSTER_RULES). GPU nodes of mixed MIG layouts and
pods holding GPUs (made directly, with the labels and annotations
GPUKubeSpawner's pods carry) make the cluster form's counts and holders; a
cordoned node shows unschedulable; the ClusterRoleBinding removed makes the
answer a 502 naming the right.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpulease.site_urls import loopback_session
from gpulease.spawners.kube.cluster_watch import CLUSTER_RULES
from tests.cluster.conftest import POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.rbac import RBAC, grant_cluster, service_account_token
from tests.cluster.test_gpulease_up_cluster import SUBDOMAIN_HOST
from tests.support.hubproc import HubProcess

PW = "admin-secret-pw"


def inventory_kubeconfig(kube: Kube, plane: ControlPlane, namespace: str, folder: Path) -> Path:
    """A kubeconfig with a token of the `inventory` ServiceAccount holding only CLUSTER_RULES."""
    token = service_account_token(kube, namespace, "inventory")
    grant_cluster(kube, namespace, "inventory", CLUSTER_RULES)
    path = folder / "inventory.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "inventory",
        "clusters": [{"name": "test", "cluster": {"server": plane.state["server"],
                                                  "certificate-authority": plane.state["ca"]}}],
        "users": [{"name": "inventory", "user": {"token": token}}],
        "contexts": [{"name": "inventory", "context": {"cluster": "test", "user": "inventory",
                                                       "namespace": namespace}}]}))
    return path


@pytest.fixture
def hub(control_plane: ControlPlane, kube: Kube, namespace: str,
        tmp_path: Path) -> Iterator[HubProcess]:
    """`gpulease up` in the cluster shape; no server is started, so its KUBECONFIG (which
    it passes to the service) needs only the inventory's ClusterRole."""
    kubeconfig = inventory_kubeconfig(kube, control_plane, namespace, tmp_path)
    hub = HubProcess(state=tmp_path / "state", admin_password=PW,
                     env={"KUBECONFIG": str(kubeconfig)}, extra_args=[
                         "--GPULeaseHub.shape=cluster", SUBDOMAIN_HOST,
                         f"--GPULeaseHub.cluster_namespace={namespace}",
                         '--GPULeaseHub.auditor_groups=["auditors"]'])
    hub.start(timeout=120)
    yield hub
    hub.close()


def gpu_pod(namespace: str, name: str, node: str, resource: str, count: int,
            user: str = "", server: str = "") -> dict:
    """A pod as GPUKubeSpawner makes them (user label, server annotation), or another's."""
    return {"metadata": {"name": name,
                         "labels": {"hub.jupyter.org/username": user} if user else {},
                         "annotations": {"hub.jupyter.org/servername": server} if user else {}},
            "spec": {"nodeSelector": {POOL_LABEL: namespace, "kubernetes.io/hostname": node},
                     "containers": [{"name": "notebook", "image": SINGLEUSER_IMAGE,
                                     "command": ["python", "-c", "import time; time.sleep(600)"],
                                     "resources": {"limits": {resource: str(count)}}}]}}


def ours(view: dict, namespace: str) -> dict[str, dict]:
    """This test's nodes of the cluster form (the control plane is shared), by short name."""
    return {n["name"].removeprefix(f"{namespace}-"): n for n in view["nodes"]
            if n["name"].startswith(f"{namespace}-")}


def by_resource(node: dict) -> dict[str, tuple[int, int, list]]:
    return {r["resource"]: (r["allocatable"], r["free"],
                            sorted(r["holders"], key=lambda h: (h.get("user", ""), h.get("pod", ""))))
            for r in node["resources"]}


def wait_view(hub: HubProcess, token: str, what: str, check, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        answer = hub.service("GET", "api/inventory", token)
        view = answer.json()
        if answer.status_code == 200 and check(view):
            return view
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}: {view}"
        time.sleep(0.5)


def test_the_cluster_form_counts_holders_follows_a_cordon_and_refuses_when_forbidden(
        hub: HubProcess, kube: Kube, namespace: str, gpu_nodes, browser_context):
    single = GpuNode("single", gpus=7, product="NVIDIA-H200-MIG-1g.18gb")
    gpu_nodes(GpuNode("mixed", mig={"1g.18gb": 4, "3g.71gb": 1}),  # a 4+3 split H200
              GpuNode("full8", gpus=8),
              GpuNode("a100", model="A100-80GB", mig={"3g.40gb": 2}),
              single)
    kube.patch(f"/api/v1/nodes/{namespace}-single",  # the device plugin's single strategy
               {"metadata": {"labels": {"nvidia.com/mig.strategy": "single"}}})
    node = {n: f"{namespace}-{n}" for n in ("mixed", "full8", "a100", "single")}
    for pod in (gpu_pod(namespace, "jupyter-ada--train", node["full8"], "nvidia.com/gpu", 2,
                        "ada", "train"),
                gpu_pod(namespace, "batch-job", node["full8"], "nvidia.com/gpu", 1),
                gpu_pod(namespace, "jupyter-bob", node["mixed"], "nvidia.com/mig-1g.18gb", 1,
                        "bob", ""),
                gpu_pod(namespace, "jupyter-bob--big", node["mixed"], "nvidia.com/mig-3g.71gb",
                        1, "bob", "big"),
                gpu_pod(namespace, "jupyter-cy", node["single"], "nvidia.com/gpu", 3, "cy", "")):
        kube.create(pods_path(namespace), pod)
    kube.wait_for("every pod running", lambda: all(
        p["status"].get("phase") == "Running" for p in kube.get(pods_path(namespace))["items"]),
        timeout=60)

    admin = hub.token_for("admin", PW)
    view = wait_view(hub, admin, "every hold counted", lambda v: sum(
        len(r["holders"]) for n in ours(v, namespace).values() for r in n["resources"]) == 5)
    assert (view["shape"], view["namespace"]) == ("cluster", namespace)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", view["listed_at"])
    nodes = ours(view, namespace)
    assert {k: (n["model"], n["mig_strategy"], n["driver"], n["schedulable"])
            for k, n in nodes.items()} == {
        "mixed": ("H200", "mixed", "570.133.20", True),
        "full8": ("H200", "none", "570.133.20", True),
        "a100": ("A100-80GB", "mixed", "570.133.20", True),
        "single": ("H200", "single", "570.133.20", True)}
    assert by_resource(nodes["mixed"]) == {
        "nvidia.com/mig-1g.18gb": (4, 3, [{"count": 1, "server": "", "tier": "on-demand", "user": "bob"}]),
        "nvidia.com/mig-3g.71gb": (1, 0, [{"count": 1, "server": "big", "tier": "on-demand", "user": "bob"}])}
    assert by_resource(nodes["full8"]) == {"nvidia.com/gpu": (8, 5, [
        {"count": 1, "pod": f"{namespace}/batch-job"},  # not gpulease's: still taken
        {"count": 2, "server": "train", "tier": "on-demand", "user": "ada"}])}
    assert by_resource(nodes["a100"]) == {"nvidia.com/mig-3g.40gb": (2, 2, [])}
    assert by_resource(nodes["single"]) == {"nvidia.com/gpu": (
        7, 4, [{"count": 3, "server": "", "tier": "on-demand", "user": "cy"}])}

    # who may read it: as in the embedded shape, admins and auditors (holders included)
    audrey = hub.add_user(admin, "audrey", None)
    bob = hub.add_user(admin, "bob", None)
    hub.api("POST", "groups/auditors", admin)
    assert hub.api("POST", "groups/auditors/users", admin, {"users": ["audrey"]}).ok
    seen = hub.service("GET", "api/inventory", audrey)
    assert seen.status_code == 200 and ours(seen.json(), namespace)["full8"] == nodes["full8"]
    refused = hub.service("GET", "api/inventory", bob)
    assert refused.status_code == 403 and "gpulease admin or auditor" in refused.json()["message"]
    anonymous = loopback_session().get(hub.urls.service("api/inventory"), timeout=30)
    assert anonymous.status_code == 403

    # cordoned: unschedulable, within the listing's few seconds
    kube.patch(f"/api/v1/nodes/{node['full8']}", {"spec": {"unschedulable": True}})
    view = wait_view(hub, admin, "full8 cordoned",
                     lambda v: not ours(v, namespace)["full8"]["schedulable"], timeout=15)
    assert ours(view, namespace)["mixed"]["schedulable"]

    # the page: a table per node, in Chromium
    page = browser_context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "admin")
    page.fill("#password_input", PW)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/.*"))
    page.goto(hub.urls.service("admin/inventory"))
    mixed = page.locator(f'section.node[data-node="{node["mixed"]}"]')
    assert "H200, MIG strategy mixed" in mixed.inner_text()
    row = mixed.locator('tr[data-resource="nvidia.com/mig-1g.18gb"]')
    assert row.locator("td").all_inner_texts() == ["nvidia.com/mig-1g.18gb", "4", "3",
                                                   "bob/(default) ×1"]
    full8 = page.locator(f'section.node[data-node="{node["full8"]}"]')
    assert "Not schedulable" in full8.inner_text()
    cells = full8.locator('tr[data-resource="nvidia.com/gpu"] td').all_inner_texts()
    assert cells[:3] == ["nvidia.com/gpu", "8", "5"]
    assert set(cells[3].split(", ")) == {"ada/train ×2",
                                         f"{namespace}/batch-job (not gpulease's) ×1"}

    # the right taken away: a 502 naming it, as JSON and as a page, never a bare 500
    kube.delete(f"{RBAC}/clusterrolebindings/{namespace}-inventory")
    deadline = time.monotonic() + 30
    while (answer := hub.service("GET", "api/inventory", admin)).status_code == 200:
        assert time.monotonic() < deadline, "still listed without the ClusterRoleBinding"
        time.sleep(0.5)
    body = answer.json()
    assert answer.status_code == 502 and set(body) == {"status", "message", "errors"}
    assert "forbids gpulease to list nodes (403" in body["message"]
    assert "needs list on nodes and pods cluster-wide" in body["message"]
    shown = page.goto(hub.urls.service("admin/inventory"))
    assert shown.status == 502 and "forbids gpulease to list nodes" in page.inner_text("main")

    # api/profiles still lists, its availability unknown: the API server's own words
    # (its address, the refusal naming the ServiceAccount) for admins only
    def reasons(token: str) -> set[str]:
        answer = hub.service("GET", "api/profiles", token)
        assert answer.status_code == 200, answer.text
        return {p["availability"].get("why", "") for p in answer.json()["profiles"]
                if p["availability"]["state"] == "unknown"}
    assert any("forbids gpulease to list nodes" in why for why in reasons(admin))
    assert reasons(bob) == {"the cluster cannot be read right now; try again shortly"}
