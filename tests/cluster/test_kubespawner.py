"""Stock KubeSpawner, unpatched, in a real JupyterHub with the real proxy, on the test cluster.

The hub talks to the API server with exactly a ServiceAccount's rights (the
Role Zero to JupyterHub gives its hub); the pod is scheduled by the real
kube-scheduler onto an emulated GPU node, run by the kubelet emulator and
reached by the hub at the pod's own address.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.cluster.conftest import POD_UID, POOL_LABEL, SINGLEUSER_IMAGE, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.rbac import grant, grant_cluster, service_account_token
from tests.support.hubproc import CHP, free_port, require_chp, run_in_kernel
from tests.support.processes import stop_process

# What z2jh's hub Role grants (templates/hub/rbac.yaml).
HUB_RULES = [
    {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
     "verbs": ["get", "watch", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]


def hub_kubeconfig(kube: Kube, plane: ControlPlane, namespace: str, folder: Path,
                   rules: list[dict] = HUB_RULES, cluster_rules: list[dict] | None = None
                   ) -> Path:
    """A kubeconfig with a token of the `hub` ServiceAccount, bound to a Role of `rules`
    only (z2jh's hub Role by default) and, if given, a ClusterRole of `cluster_rules`."""
    token = service_account_token(kube, namespace, "hub")
    grant(kube, namespace, "hub", rules=rules)
    if cluster_rules is not None:
        grant_cluster(kube, namespace, "hub", cluster_rules)
    path = folder / "hub.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hub",
        "clusters": [{"name": "test", "cluster": {"server": plane.state["server"],
                                                  "certificate-authority": plane.state["ca"]}}],
        "users": [{"name": "hub", "user": {"token": token}}],
        "contexts": [{"name": "hub", "context": {"cluster": "test", "user": "hub",
                                                 "namespace": namespace}}]}))
    return path


def home_volume(kube: Kube, plane: ControlPlane, namespace: str, name: str = "home"
                ) -> tuple[str, Path]:
    """A PersistentVolume (hostPath) of a storage class of this test's own, for one claim
    (`name` tells a second one from the first)."""
    folder = plane.root / "volumes" / f"{namespace}-{name}"
    folder.mkdir(parents=True)
    folder.parent.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(folder, POD_UID, 100)
    storage_class = f"manual-{namespace}"
    kube.create("/api/v1/persistentvolumes", {
        "metadata": {"name": f"{namespace}-{name}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": storage_class,
                 "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": str(folder), "type": "Directory"}}})
    return storage_class, folder


HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.services = [{{"name": "e2e", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["e2e"]}}]
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.KubeSpawner.namespace = {namespace!r}
c.KubeSpawner.image = {image!r}
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.uid = {uid}
c.KubeSpawner.gid = 100
c.KubeSpawner.fs_gid = 100
c.KubeSpawner.node_selector = {{{pool!r}: {namespace!r}}}
c.KubeSpawner.extra_resource_limits = {{"nvidia.com/mig-1g.18gb": "1"}}
c.KubeSpawner.storage_pvc_ensure = True
c.KubeSpawner.storage_class = {storage_class!r}
c.KubeSpawner.storage_capacity = "1Gi"
c.KubeSpawner.storage_access_modes = ["ReadWriteOnce"]
c.KubeSpawner.volumes = [{{"name": "home", "persistentVolumeClaim": {{"claimName": "{{pvc_name}}"}}}}]
c.KubeSpawner.volume_mounts = [{{"name": "home", "mountPath": "/home/jovyan"}}]
c.KubeSpawner.start_timeout = 90
c.KubeSpawner.http_timeout = 90
"""


class StockHub:
    """`jupyterhub` itself (not `gpulease up`) as a child process: with stock KubeSpawner
    (HUB_CONFIG), or a `template` of its own with the same placeholders."""

    def __init__(self, folder: Path, kubeconfig: Path, template: str = HUB_CONFIG,
                 **config: object):
        self.folder = folder
        self.port = free_port()
        self.token = uuid.uuid4().hex
        folder.joinpath("jupyterhub_config.py").write_text(template.format(
            port=self.port, hub_port=free_port(), proxy_api=free_port(), chp=str(CHP),
            folder=folder, token=self.token, **config))
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.log = open(folder / "hub.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(folder / "jupyterhub_config.py")],
            cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.tail()
            try:
                if requests.get(f"{self.url}/hub/api", timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise TimeoutError(self.tail())

    def api(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, f"{self.url}/hub/api{path}", timeout=30,
                                headers={"Authorization": f"token {self.token}"}, **kw)

    def tail(self) -> str:
        return (self.folder / "hub.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_process(self.proc, grace=30)
        self.log.close()


@pytest.fixture
def stock_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
              tmp_path: Path) -> Iterator[tuple[StockHub, Path]]:
    require_chp()
    gpu_nodes(GpuNode("gpu", mig={"1g.18gb": 7}))
    storage_class, home = home_volume(kube, control_plane, namespace)
    hub = StockHub(tmp_path, hub_kubeconfig(kube, control_plane, namespace, tmp_path),
                   namespace=namespace, image=SINGLEUSER_IMAGE, uid=POD_UID, pool=POOL_LABEL,
                   storage_class=storage_class)
    yield hub, home
    hub.stop()
    kube.delete(f"/api/v1/persistentvolumes/{namespace}-home")


def _server(hub: StockHub) -> dict:
    return hub.api("GET", "/users/alice").json()["servers"].get("", {})


def wait_ready(hub: StockHub, timeout: float = 120) -> None:
    """Until the hub says alice's default server is ready."""
    deadline = time.monotonic() + timeout
    while not _server(hub).get("ready"):
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.5)


def stop_keeping_home(hub: StockHub, kube: Kube, namespace: str) -> None:
    """Stop alice's server: the hub forgets it, its pod is deleted, her claim stays Bound."""
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    deadline = time.monotonic() + 60
    while _server(hub):
        assert time.monotonic() < deadline, hub.tail()
        time.sleep(0.5)

    def pod_gone() -> bool:
        try:
            kube.get(pods_path(namespace, "jupyter-alice"))
        except KubeError as e:
            return e.status == 404
        return False
    kube.wait_for("the pod deleted", pod_gone, timeout=30)
    claim = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/claim-alice")
    assert claim["status"]["phase"] == "Bound"  # the user's home stays


def test_stock_kubespawner_runs_a_server_on_the_cluster(stock_hub, kube: Kube, namespace: str):
    hub, home = stock_hub
    assert hub.api("POST", "/users/alice").status_code == 201
    assert hub.api("POST", "/users/alice/server").status_code in (201, 202)
    wait_ready(hub)

    pod = kube.get(pods_path(namespace, "jupyter-alice"))
    assert pod["spec"]["nodeName"] == f"{namespace}-gpu"  # bound by kube-scheduler
    scheduled = [e for e in kube.get(f"/api/v1/namespaces/{namespace}/events",
                                     fieldSelector="involvedObject.name=jupyter-alice")["items"]
                 if e["reason"] == "Scheduled"]
    assert scheduled and scheduled[0]["reportingComponent"] == "default-scheduler"
    pod_ip = pod["status"]["podIP"]
    assert pod_ip.startswith("127.1.")
    routes = hub.api("GET", "/proxy").json()
    assert routes["/user/alice/"]["target"] == f"http://{pod_ip}:8888"  # the pod's own address

    token = hub.api("POST", "/users/alice/tokens", json={"expires_in": 600}).json()["token"]
    out = run_in_kernel(hub.url, "/user/alice/", token, (
        "import os\n"
        "open(os.path.expanduser('~/kept.txt'), 'w').write('still here')\n"
        "print(os.getuid(), os.environ['NVIDIA_VISIBLE_DEVICES'], 6 * 7)"))
    uid, devices, answer = out.split()
    assert answer == "42"
    assert int(uid) == (POD_UID if os.geteuid() == 0 else os.geteuid())
    assert devices.startswith("MIG-") and "," not in devices  # one slice, a concrete ID

    stop_keeping_home(hub, kube, namespace)
    assert (home / "kept.txt").read_text() == "still here"
