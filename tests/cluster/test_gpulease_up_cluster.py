"""`gpulease up` in the cluster shape, end to end on the test control plane.

A real `gpulease up --GPULeaseHub.shape=cluster` (tests/support/hubproc.py: the real
proxy, the gpulease service and culler) whose kubeconfig is a ServiceAccount
token holding Zero to JupyterHub's hub Role in the users' namespace and the
inventory's ClusterRole; the Kubernetes details (node selector, storage) are
the admin's own config file, as docs/cluster.md says. Pods are scheduled by
the real kube-scheduler onto emulated H200 nodes and run by the kubelet
emulator. Shown through gpulease's own APIs: a MIG-slice start and its pod,
its billing session while it runs and its charge once stopped, a refusal for
want of credit (no pod made), a stop when credit runs out, suspend and
resume, and hub restarts: one keeps the pod and its session, and a pod
deleted while the hub is down is closed as `hub_lost`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from gpulease.spawners.kube.cluster_watch import CLUSTER_RULES
from gpulease.store.db import open_database, sqlite_url
from gpulease.store.ledger import Ledger
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.rbac import grant_cluster
from tests.cluster.test_kubespawner import HUB_RULES, home_volume, hub_kubeconfig
from tests.support.hubproc import HubProcess

PW = "admin-secret-pw"
HEARTBEAT = 1.0
SLICE = "nvidia.com/mig-1g.18gb"
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "H200 slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["pytorch"], "price_per_hour": "36", "min_run": "1s"},
    # a credit a second: a few credits run out within seconds
    {"slug": "pricey-slice", "display_name": "A slice at a credit a second",
     "gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 1, "memory": "2Gi",
     "images": ["pytorch"], "price_per_hour": "3600", "min_run": "1s"},
]}
# The cluster's proxy is reachable beyond a loopback, so `up` in the cluster shape needs a
# domain for the users' servers (gpulease.hub.web.origins): here the test box's own,
# USER.localhost:PORT, which browsers and the tests' clients reach on loopback.
SUBDOMAIN_HOST = "--subdomain-host=http://localhost:{port}"
# The admin's own config: what only they know of their cluster (KubeSpawner's options).
ADMIN_CONFIG = """
c.GPUKubeSpawner.node_selector = {{{pool!r}: {namespace!r}}}
c.GPUKubeSpawner.storage_class = {storage_class!r}
c.GPUKubeSpawner.storage_capacity = "1Gi"
c.GPUKubeSpawner.storage_access_modes = ["ReadWriteOnce"]
c.GPUKubeSpawner.http_timeout = 90
"""


@contextmanager
def cluster_hub_at(control_plane: ControlPlane, kube: Kube, namespace: str, folder: Path,
                   pool: str = "", extra_args: tuple[str, ...] = (),
                   profiles: dict | None = None, config: str = "",
                   extra_rules: Sequence[dict] = (), extra_cluster_rules: Sequence[dict] = ()
                   ) -> Iterator[HubProcess]:
    """`gpulease up --GPULeaseHub.shape=cluster` with its pods in `namespace`, on the nodes
    labelled `POOL_LABEL=pool` (default: the namespace's own, as gpu_nodes labels them), a
    home volume, the token of a ServiceAccount with z2jh's hub Role and CLUSTER_RULES, and
    `profiles` (default PROFILES); `config` is added to the admin's config file, `extra_args`
    go to `gpulease up`; users' servers at USER.localhost:PORT (SUBDOMAIN_HOST);
    `extra_rules` and `extra_cluster_rules` are added to the Role and ClusterRole (DRA's).
    Also used by bench/kube_spawn.py."""
    storage_class, _home = home_volume(kube, control_plane, namespace)
    kubeconfig = hub_kubeconfig(kube, control_plane, namespace, folder,
                                rules=HUB_RULES + list(extra_rules))
    # the inventory's and admission's
    grant_cluster(kube, namespace, "hub", CLUSTER_RULES + list(extra_cluster_rules))
    profiles_file = folder / "profiles.yaml"
    profiles_file.write_text(yaml.safe_dump(profiles or PROFILES))
    config_file = folder / "admin_config.py"
    config_file.write_text(ADMIN_CONFIG.format(pool=POOL_LABEL, namespace=pool or namespace,
                                               storage_class=storage_class) + config)
    hub = HubProcess(state=folder / "state", admin_password=PW,
                     env={"KUBECONFIG": str(kubeconfig)}, extra_args=[
                         "--GPULeaseHub.shape=cluster", SUBDOMAIN_HOST,
                         f"--GPULeaseHub.cluster_namespace={namespace}",
                         f"--config={config_file}", f"--profiles={profiles_file}", *extra_args])
    try:
        hub.start(timeout=120)
        yield hub
    finally:
        hub.close()
        kube.delete(f"/api/v1/persistentvolumes/{namespace}-home")


@pytest.fixture
def cluster_hub(control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes,
                tmp_path: Path) -> Iterator[HubProcess]:
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    with cluster_hub_at(control_plane, kube, namespace, tmp_path, extra_args=(
            f"--GPULeaseHub.heartbeat_interval={HEARTBEAT}", "--Spawner.poll_interval=1")) as hub:
        yield hub


def sessions_of(hub: HubProcess, token: str) -> list[dict]:
    r = hub.service("GET", "api/usage", token)
    assert r.status_code == 200, r.text
    return r.json()["sessions"]


def pod_of(kube: Kube, namespace: str, user: str) -> dict | None:
    try:
        return kube.get(pods_path(namespace, f"jupyter-{user}"))
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def start(hub: HubProcess, user: str, token: str, profile: str | None):
    body = None if profile is None else {"user_options": {"profile": profile}}
    return hub.api("POST", f"users/{user}/server", token, body)


def wait_for(what: str, check, timeout: float = 60, hub: HubProcess | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{what}:\n{hub.log()[-4000:] if hub else ''}")


def test_gpulease_up_runs_bills_refuses_and_suspends_pods(cluster_hub: HubProcess, kube: Kube,
                                                          namespace: str):
    hub = cluster_hub
    log = hub.log()
    assert f"servers in namespace {namespace}" in log and "GPUKubeSpawner" in log
    assert not (hub.state / "homes").exists()  # the embedded box's homes: not made here
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")

    # A MIG-slice start through the hub's API with gpulease's options: its pod has the slice.
    r = start(hub, "alice", alice, "slice")
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", alice, timeout=120)
    pod = pod_of(kube, namespace, "alice")
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"][SLICE] == "1"
    assert pod["spec"]["nodeName"] == f"{namespace}-h200"
    (session,) = sessions_of(hub, alice)
    assert session["ended"] is None and session["profile"] == "slice"

    time.sleep(2 * HEARTBEAT)
    assert hub.api("DELETE", "users/alice/server", alice).status_code in (202, 204)
    hub.wait_server_stopped("alice", alice)
    wait_for("alice's pod deleted", lambda: pod_of(kube, namespace, "alice") is None)
    (session,) = sessions_of(hub, alice)
    assert session["end_reason"] == "user" and session["billed_seconds"] >= 2, session
    engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    try:
        (charge,) = [e for e in Ledger(engine).entries("user:alice") if e["kind"] == "charge"]
    finally:
        engine.dispose()
    assert charge["amount_ucr"] < 0 and abs(charge["amount_ucr"] / 1e6 + float(session["cost"])) \
        < 1e-6, (charge, session)
    balance = hub.service("GET", "api/balance", alice).json()
    assert abs(100 - float(balance["balance"]) - float(session["cost"])) < 1e-6, balance

    # No credit: refused with gpulease's message, and no pod is made.
    bob = hub.add_user(admin, "bob", None)
    r = start(hub, "bob", bob, "slice")
    assert r.status_code == 402, r.text
    assert "Not enough credit on user:bob" in r.json()["message"]
    assert pod_of(kube, namespace, "bob") is None

    # Credit running out stops the server (the heartbeat's stop deletes the pod). One home
    # volume per test: alice again, her balance brought down to `credit`.
    credit = 3
    left = float(hub.service("GET", "api/balance", alice).json()["balance"])
    r = hub.service("POST", "api/adjustments", admin, {
        "account": "user:alice", "amount": f"{credit - left:.6f}", "note": "test: nearly out"})
    assert r.status_code == 201, r.text
    assert start(hub, "alice", alice, "pricey-slice").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=120)
    ready = time.monotonic()
    hub.wait_server_stopped("alice", alice, timeout=60)
    assert time.monotonic() - ready <= credit + 6 * HEARTBEAT + 5, hub.log()[-3000:]
    wait_for("alice's pod deleted", lambda: pod_of(kube, namespace, "alice") is None)
    session = sessions_of(hub, alice)[-1]  # oldest first
    assert session["end_reason"] == "out_of_credit" and session["profile"] == "pricey-slice"
    hub.grant(admin, "user:alice", "100")

    # Suspend (the culler's way: api/stop, reason idle): the pod goes, the home claim stays,
    # billing stops; resume (an empty-body start) runs the same profile again.
    assert start(hub, "alice", alice, "slice").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=120)
    r = hub.service("POST", "api/stop", admin, {"user": "alice", "server": "", "reason": "idle"})
    assert r.status_code == 202, r.text
    hub.wait_server_stopped("alice", alice)
    wait_for("alice's pod deleted", lambda: pod_of(kube, namespace, "alice") is None)
    claim = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/claim-alice")
    assert claim["status"]["phase"] == "Bound"
    suspended = sessions_of(hub, alice)[-1]  # oldest first
    assert suspended["end_reason"] == "idle" and suspended["ended"] is not None
    servers = hub.service("GET", "api/me/servers", alice).json()["servers"]
    (mine,) = [s for s in servers if s["name"] == ""]
    assert mine["state"] == "suspended", mine
    time.sleep(2 * HEARTBEAT)
    assert sessions_of(hub, alice)[-1]["billed_ms"] == suspended["billed_ms"]  # billing stopped

    r = start(hub, "alice", alice, None)
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("alice", alice, timeout=120)
    (container,) = pod_of(kube, namespace, "alice")["spec"]["containers"]
    assert container["resources"]["limits"][SLICE] == "1"
    usage = sessions_of(hub, alice)
    assert [s["profile"] for s in usage] == ["slice", "pricey-slice", "slice", "slice"]
    assert usage[-1]["ended"] is None


def test_a_hub_restart_keeps_the_pod_and_its_session_and_closes_a_lost_one(
        cluster_hub: HubProcess, kube: Kube, namespace: str):
    hub = cluster_hub
    admin = hub.token_for("admin", PW)
    alice = hub.add_user(admin, "alice", "100")
    assert start(hub, "alice", alice, "slice").status_code in (201, 202)
    hub.wait_server_ready("alice", alice, timeout=120)
    pod = pod_of(kube, namespace, "alice")
    (before,) = sessions_of(hub, alice)

    # Ctrl-C: the hub stops, the pod runs on (cleanup_servers is off in this shape), and
    # the restarted hub carries on the same pod and the same billing session.
    assert hub.interrupt() == 0
    assert pod_of(kube, namespace, "alice")["metadata"]["uid"] == pod["metadata"]["uid"]
    hub.start(timeout=120)
    alice = hub.token_for("alice", "alice-pw-12345")
    assert hub.wait_server_ready("alice", alice, timeout=10)
    assert pod_of(kube, namespace, "alice")["metadata"]["uid"] == pod["metadata"]["uid"]
    time.sleep(2 * HEARTBEAT)
    (after,) = sessions_of(hub, alice)
    assert after["started"] == before["started"] and after["ended"] is None
    assert after["billed_seconds"] > before["billed_seconds"]

    # The pod deleted while the hub is down: at restart its session is closed as hub_lost
    # (at its last confirmation) and the hub forgets the server.
    hub.kill()
    kube.delete(pods_path(namespace, "jupyter-alice"))
    wait_for("alice's pod deleted", lambda: pod_of(kube, namespace, "alice") is None)
    hub.start(timeout=120)
    alice = hub.token_for("alice", "alice-pw-12345")
    hub.wait_server_stopped("alice", alice, timeout=30)
    (lost,) = sessions_of(hub, alice)
    assert lost["started"] == before["started"] and lost["end_reason"] == "hub_lost", lost
    assert "closed as hub_lost" in hub.log()
