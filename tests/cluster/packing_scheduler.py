"""gpulease's packing kube-scheduler as a real process beside the test control plane's own.

The control plane's kube-scheduler binary, run with the configuration gpulease
generates (spawners/kube/scheduler_config.py `scheduler_configuration`), leader
election on, as a ServiceAccount holding exactly the objects the Helm chart
deploys for it (spawners/kube/rbac.py `scheduler_rbac_objects`), with a token
from the real TokenRequest API. Its own --secure-port on loopback; ready when
its /healthz answers and it holds its Lease (a scheduler that is not the leader
binds nothing).

    with running_packing_scheduler(plane.state, kube, ["1g.18gb"], workdir) as scheduler:
        ... pods with spec.schedulerName = scheduler.name ...

Used by tests/cluster/test_packing_scheduler.py and bench/placement_real.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpulease.spawners.kube.rbac import scheduler_rbac_objects
from gpulease.spawners.kube.scheduler_config import (
    DEFAULT_SCHEDULER_NAME,
    SchedulerSettings,
    scheduler_configuration,
)
from tests.cluster.controlplane import ControlPlaneError, _free_ports, _healthy, _tail
from tests.cluster.kube import Kube, KubeError
from tests.support.processes import stop_process

RBAC = "/apis/rbac.authorization.k8s.io/v1"
READY_S = 60


def object_path(obj: dict) -> str:
    """The collection an RBAC object or ServiceAccount is created in."""
    kind, namespace = obj["kind"], obj["metadata"].get("namespace", "")
    plural = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
              "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}[kind]
    base = "/api/v1" if kind == "ServiceAccount" else RBAC
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def token_kubeconfig(server: str, ca: str, token: str, user: str) -> dict:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "gpulease-test",
            "clusters": [{"name": "gpulease-test",
                          "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "gpulease-test",
                          "context": {"cluster": "gpulease-test", "user": user}}]}


@dataclass
class SchedulerProcess:
    """One kube-scheduler with a given configuration (its clientConnection a kubeconfig)."""

    name: str  # the schedulerName pods ask for
    config: dict
    workdir: Path
    binary: Path
    proc: subprocess.Popen | None = None
    port: int = 0
    verbosity: int = 1
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.workdir / f"{self.name}.log"

    def start(self, ready: Callable[[], bool] = lambda: True, timeout: float = READY_S) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / f"{self.name}.yaml"
        config_file.write_text(yaml.safe_dump(self.config))
        kubeconfig = self.config["clientConnection"]["kubeconfig"]
        (self.port,) = _free_ports(1)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), f"--config={config_file}",
                 f"--authentication-kubeconfig={kubeconfig}",
                 f"--authorization-kubeconfig={kubeconfig}",
                 "--bind-address=127.0.0.1", f"--secure-port={self.port}", f"--v={self.verbosity}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ControlPlaneError(f"kube-scheduler {self.name} exited with "
                                        f"{self.proc.returncode}; its log:\n{self.tail()}")
            with contextlib.suppress(Exception):  # not answering yet
                if _healthy(self.port) and ready():
                    return
            time.sleep(0.1)
        self.stop()
        raise ControlPlaneError(f"kube-scheduler {self.name} not ready within {timeout:g} s; "
                                f"its log:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)


@dataclass
class PackingScheduler(SchedulerProcess):
    namespace: str = ""  # its ServiceAccount's and its Lease's

    def lease(self, kube: Kube) -> dict:
        return kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/"
                        f"{self.name}")

    def leader(self, kube: Kube) -> str:
        """The Lease's holderIdentity ("" while nobody holds it)."""
        try:
            return self.lease(kube)["spec"].get("holderIdentity", "")
        except KubeError as e:
            if e.status == 404:
                return ""
            raise


def scheduler_identity(kube: Kube, state: dict, namespace: str, scheduler_name: str,
                       workdir: Path) -> tuple[Path, list[dict]]:
    """Apply scheduler_rbac_objects for it; a kubeconfig holding its ServiceAccount's token."""
    objects = scheduler_rbac_objects(namespace, scheduler_name, lease_namespace=namespace)
    for obj in objects:
        kube.create(object_path(obj), obj)
    account = objects[0]["metadata"]["name"]
    token = kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 4 * 3600}})["status"]["token"]
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{scheduler_name}.kubeconfig"
    path.write_text(yaml.safe_dump(token_kubeconfig(state["server"], state["ca"], token, account)))
    path.chmod(0o600)
    return path, objects


@contextlib.contextmanager
def running_packing_scheduler(state: dict, kube: Kube, mig_profiles: Iterable[str | None],
                      workdir: Path, *,
                      edit: Callable[[dict], None] | None = None) -> Iterator[PackingScheduler]:
    """gpulease's packing scheduler for these MIG profiles, running until the block ends.

    `state`: the control plane's state.json. Its name is unique to this run
    (several test runs, or workers, may share a control plane); its
    ServiceAccount and Lease are in a namespace of its own, deleted after it.
    `edit` changes the generated configuration before it runs (a test's
    variant). On a failure inside the block its log's end is printed."""
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"{DEFAULT_SCHEDULER_NAME}-{suffix}", f"gpulease-scheduler-{suffix}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    objects: list[dict] = []
    scheduler = None
    try:
        kubeconfig, objects = scheduler_identity(kube, state, namespace, name, workdir)
        config = scheduler_configuration(mig_profiles, SchedulerSettings(
            scheduler_name=name, lease_namespace=namespace, kubeconfig=str(kubeconfig)))
        if edit:
            edit(config)
        scheduler = PackingScheduler(name, config, workdir, Path(state["bin"]) / "kube-scheduler",
                                     namespace=namespace)
        scheduler.start(ready=lambda: bool(scheduler.leader(kube)))
        try:
            yield scheduler
        except BaseException:
            print(f"\nthe end of kube-scheduler {name}'s log ({scheduler.log}):\n"
                  f"{scheduler.tail()}")
            raise
    finally:
        if scheduler:
            scheduler.stop()
        for obj in objects:
            if obj["metadata"].get("namespace") != namespace:  # the namespace takes the rest
                kube.delete(f"{object_path(obj)}/{obj['metadata']['name']}")
        kube.delete(f"/api/v1/namespaces/{namespace}")
