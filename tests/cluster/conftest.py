"""Fixtures for the cluster tests: one real control plane per test run, a namespace per test.

The control plane (tests/cluster/controlplane.py) is shared by every test and
every pytest-xdist worker of a run. Without its binaries (`make cluster-tools`,
which needs Go) the cluster tests skip, naming what is missing; under CI=true
they fail. When a test fails, its namespace's events and the end of the
kubelet emulator's log are added to the report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpulease.core.model.profiles import SAMPLE_PROFILES
from gpulease.images import shipped_catalog
from gpulease.spawners.kube.scheduler_config import profiles_mig
from tests.cluster.controlplane import TOOLS, attach, detach, missing_tools
from tests.cluster.faults import FaultProxy
from tests.cluster.kube import Kube, KubeError
from tests.cluster.nodes import GpuNode, node_object
from tests.cluster.packing_scheduler import PackingScheduler, running_packing_scheduler
from tests.support.isolation_env import hub_python

IN_CI = os.environ.get("CI", "").lower() == "true"
POOL_LABEL = "gpulease.test/pool"
# The image that stands for gpulease's single-user image in these tests.
SINGLEUSER_IMAGE = "gpulease/singleuser:test"
POD_UID = 1000  # jovyan's uid in the Jupyter images


@dataclass
class ControlPlane:
    state: dict

    @property
    def root(self) -> Path:
        return Path(self.state["root"])

    @property
    def kubeconfig(self) -> str:
        return self.state["kubeconfig"]

    def admin(self) -> Kube:
        return Kube(self.state["server"], Path(self.state["ca"]),
                    self.root / "pki" / "admin.crt", self.root / "pki" / "admin.key")

    def as_token(self, token: str) -> Kube:
        return Kube(self.state["server"], Path(self.state["ca"]), token=token)

    def map_image(self, image: str, prefix: str, user: int = POD_UID) -> None:
        """Give the kubelet emulator a local stand-in for `image` (read at each pod start)."""
        path = Path(self.state["images"])
        images = json.loads(path.read_text())
        images[image] = {"prefix": prefix, "user": user}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(images, indent=1))
        tmp.rename(path)

    def log(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"


def _run_dir() -> Path:
    # xdist workers share PYTEST_XDIST_TESTRUNUID; a plain run has its own pid.
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    return Path(tempfile.gettempdir()) / f"gpulease-cluster-{run[:12]}"


# Package scope: the control plane goes once tests/cluster/ is done, not at
# the end of the whole run (it would idle beside the other tests).
@pytest.fixture(scope="package")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    missing = missing_tools()
    if missing:
        why = (f"the cluster tests need {', '.join(missing)} in {TOOLS}: run `make cluster-tools` "
               "(it builds them from Go modules; needs Go 1.26)")
        if IN_CI:
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    root = _run_dir()
    try:
        state = attach(root)
    except Exception:
        detach(root)
        raise

    def leave() -> None:
        # The last one out throws the run's folder away, unless a test failed:
        # then its logs stay, for a post-mortem.
        if detach(root) and request.session.testsfailed == 0:
            shutil.rmtree(root, ignore_errors=True)
        elif request.session.testsfailed:
            print(f"\ncontrol plane logs kept in {root}/logs")
    request.addfinalizer(leave)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(
            f"\ncontrol plane: Kubernetes {state['version']}, etcd {state['etcd']}, kwok "
            f"{state['kwok']}, ready in {state['ready_s']} s ({state['root']})")
    plane = ControlPlane(state)
    # gpulease's own environment (one every account can run) stands for the
    # test image and for each catalog image without a local_env of its own.
    python, _why = hub_python()
    ours = str(Path(python).parent.parent)
    plane.map_image(SINGLEUSER_IMAGE, ours)
    for entry in shipped_catalog().images:
        plane.map_image(entry.image, entry.local_env or ours)
    yield plane


@pytest.fixture(scope="module")
def packing_scheduler(control_plane: ControlPlane) -> Iterator[PackingScheduler]:
    """gpulease's packing kube-scheduler for the sample profiles (every MIG profile there),
    leader election on, as its own ServiceAccount (tests/cluster/packing_scheduler.py).
    Module scope: it runs for the tests of one module, not beside all the others."""
    samples = SAMPLE_PROFILES
    profiles = yaml.safe_load(samples.read_text())["profiles"]
    with running_packing_scheduler(control_plane.state, control_plane.admin(),
                                   profiles_mig(profiles),
                                   control_plane.root / "packing-scheduler") as scheduler:
        yield scheduler


@pytest.fixture
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.admin()


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].rstrip("-")


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    """The fault proxy in front of the API server (tests/cluster/faults.py)."""
    pki = control_plane.root / "pki"
    p = FaultProxy(control_plane.state["server"], control_plane.state["ca"],
                   str(pki / "apiserver.crt"), str(pki / "apiserver.key")).start()
    yield p
    p.stop()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube) -> Iterator[str]:
    """A namespace of this test's own, deleted after it (with whatever it holds)."""
    name = f"t-{_slug(request.node.name)[:44]}-{uuid.uuid4().hex[:6]}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # Pods are admitted only once the service-account controller made `default`.
    kube.wait_for(f"the default ServiceAccount of {name}",
                  lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"))
    request.node.gpulease_namespace = name
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def gpu_nodes(namespace: str, kube: Kube):
    """make(GpuNode(...), ...): Nodes of this test's own pool, Ready; deleted after the test.

    Each is labelled `gpulease.test/pool=<namespace>`; pods pick the pool with
    a nodeSelector, so tests sharing the cluster never see each other's nodes.
    """
    made: list[str] = []

    def make(*specs: GpuNode) -> list[dict]:
        nodes = []
        for spec in specs:
            obj = node_object(GpuNode(**{**spec.__dict__, "name": f"{namespace}-{spec.name}"}))
            obj["metadata"]["labels"][POOL_LABEL] = namespace
            kube.create("/api/v1/nodes", obj)
            made.append(obj["metadata"]["name"])
            nodes.append(obj)
        for obj in nodes:
            name = obj["metadata"]["name"]
            kube.wait_for(f"node {name} Ready (kwok)", lambda n=name: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in kube.get(f"/api/v1/nodes/{n}")["status"].get("conditions", [])))
        return [kube.get(f"/api/v1/nodes/{o['metadata']['name']}") for o in nodes]

    yield make
    for name in made:
        kube.delete(f"/api/v1/nodes/{name}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    namespace = getattr(item, "gpulease_namespace", "")
    if report.failed and namespace and "control_plane" in item.fixturenames:
        plane: ControlPlane = item.funcargs.get("control_plane")  # type: ignore[attr-defined]
        try:
            events = plane.admin().get(f"/api/v1/namespaces/{namespace}/events")["items"]
            lines = [f"{e.get('lastTimestamp')} {e['involvedObject']['kind']}/"
                     f"{e['involvedObject']['name']} {e['reason']}: {e.get('message', '')}"
                     for e in events]
        except (KubeError, OSError) as e:
            lines = [f"(events not read: {e})"]
        report.sections.append((f"events in {namespace}", "\n".join(lines) or "(none)"))
        try:
            tail = plane.log("kubelet-emulator").read_text().splitlines()[-40:]
        except OSError:
            tail = []
        report.sections.append(("kubelet emulator log (end)", "\n".join(tail)))
        scheduler = item.funcargs.get("packing_scheduler")  # type: ignore[attr-defined]
        if isinstance(scheduler, PackingScheduler):
            report.sections.append(("packing scheduler log (end)", scheduler.tail()))
