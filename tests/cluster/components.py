"""What each control-plane component is started with: plain functions over a Layout.

The flags are those a small real cluster runs with (kubeadm's and kwokctl's
choices where they differ from the defaults), on loopback ports of this run:
etcd; kube-apiserver with TLS, client-certificate authentication, Node and
RBAC authorization, service-account signing (TokenRequest) and the default
admission plugins, PodSecurity among them, plus NodeRestriction;
kube-controller-manager with each controller on its own service account;
the default kube-scheduler from a KubeSchedulerConfiguration; kwok with node
stages only, so that pod status has one writer, the kubelet emulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service: first address of the range
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# kwokctl's convention: the Nodes kwok keeps Ready carry this annotation.
EMULATED_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# Nodes kwok keeps Ready but whose pods nothing runs (not the kubelet emulator's):
# for scheduling tests and benchmarks, where a pod need only be bound.
BIND_ONLY_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "bind-only")
STARTUP_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "kwok", "kubelet-emulator")


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


@dataclass(frozen=True)
class Layout:
    """Where one run's control plane keeps its files, and its ports."""

    root: Path
    bin: Path
    ports: Ports

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def kubeconfig(self, who: str) -> Path:
        return self.root / f"{who}.kubeconfig"

    def tool(self, name: str) -> str:
        return str(self.bin / name)


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict:
    """A kubeconfig for one client-certificate identity."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "gpulease-test",
        "clusters": [{"name": "gpulease-test",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user,
                   "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "gpulease-test",
                      "context": {"cluster": "gpulease-test", "user": user}}],
    }


def etcd_argv(layout: Layout) -> list[str]:
    client = f"http://127.0.0.1:{layout.ports.etcd_client}"
    peer = f"http://127.0.0.1:{layout.ports.etcd_peer}"
    return [layout.tool("etcd"), "--name=gpulease-test", f"--data-dir={layout.root / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gpulease-test={peer}",
            # A test cluster's data is thrown away: fsync would only cost time.
            "--unsafe-no-fsync", "--log-level=warn", "--listen-metrics-urls="]


def apiserver_argv(layout: Layout) -> list[str]:
    pki = layout.pki
    return [layout.tool("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{layout.ports.etcd_client}",
            "--bind-address=127.0.0.1",
            # Without it the API server looks for a default route, and the
            # sandboxes have none.
            "--advertise-address=127.0.0.1",
            f"--secure-port={layout.ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",  # so that PodSecurity is what refuses
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            # Front-proxy (aggregation) authentication, as kubeadm sets it up;
            # without it every component logs a missing CA bundle forever.
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--anonymous-auth=false",
            "--profiling=false",
            "--v=1"]


def controller_manager_argv(layout: Layout) -> list[str]:
    config = layout.kubeconfig("controller-manager")
    return [layout.tool("kube-controller-manager"),
            f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={layout.ports.controller_manager}",
            f"--root-ca-file={layout.pki / 'ca.crt'}",
            f"--service-account-private-key-file={layout.pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1"]


def scheduler_config(layout: Layout) -> dict:
    """The default scheduler profile, on this run's kubeconfig, without leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(layout.kubeconfig("scheduler"))},
        "leaderElection": {"leaderElect": False},
    }


def scheduler_argv(layout: Layout) -> list[str]:
    config = layout.kubeconfig("scheduler")
    return [layout.tool("kube-scheduler"),
            f"--config={layout.root / 'scheduler.yaml'}",
            f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={layout.ports.scheduler}",
            "--v=1"]


def kwok_stages() -> list[dict]:
    """Node stages only: kwok makes emulated Nodes Ready and renews their leases."""
    ready = ('.status.conditions.[] | select( .type == "Ready" ) | .status')
    conditions = (
        "{{ $now := Now }}\n"
        "conditions:\n"
        "{{ range NodeConditions }}\n"
        "- lastHeartbeatTime: {{ $now | Quote }}\n"
        "  lastTransitionTime: {{ or $.metadata.creationTimestamp $now | Quote }}\n"
        "  message: {{ .message | Quote }}\n"
        "  reason: {{ .reason | Quote }}\n"
        "  status: {{ .status | Quote }}\n"
        "  type: {{ .type | Quote }}\n"
        "{{ end }}\n")
    initialize = conditions + (
        "addresses:\n"
        "- {address: {{ NodeIP | Quote }}, type: InternalIP}\n"
        "- {address: {{ NodeName | Quote }}, type: Hostname}\n"
        # The Node's declared capacity (GPUs, MIG slices) is kept as it is.
        "allocatable:\n{{ YAML .status.allocatable 1 }}\n"
        "capacity:\n{{ YAML .status.capacity 1 }}\n"
        "nodeInfo:\n"
        "  architecture: amd64\n"
        "  operatingSystem: linux\n"
        "  kubeletVersion: {{ printf \"kwok-%s\" Version }}\n"
        "  containerRuntimeVersion: gpulease-kubelet-emulator\n"
        "phase: Running\n")
    ref = {"apiGroup": "v1", "kind": "Node"}
    return [
        {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
         "metadata": {"name": "node-initialize"},
         "spec": {"resourceRef": ref,
                  "selector": {"matchExpressions": [
                      {"key": ready, "operator": "NotIn", "values": ["True"]}]},
                  "next": {"statusTemplate": initialize}}},
        {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
         "metadata": {"name": "node-heartbeat-with-lease"},
         "spec": {"resourceRef": ref,
                  "selector": {"matchExpressions": [
                      {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                      {"key": ready, "operator": "In", "values": ["True"]}]},
                  # Leases carry the heartbeat; the status is refreshed now and then.
                  "delay": {"durationMilliseconds": 600000,
                            "jitterDurationMilliseconds": 610000},
                  "next": {"statusTemplate": conditions}}},
    ]


def kwok_argv(layout: Layout) -> list[str]:
    key, value = EMULATED_NODE_ANNOTATION
    _, bind_only = BIND_ONLY_NODE_ANNOTATION
    return [layout.tool("kwok"),
            f"--kubeconfig={layout.kubeconfig('kwok')}",
            f"--config={layout.root / 'kwok.yaml'}",
            f"--manage-nodes-with-annotation-selector={key} in ({value},{bind_only})",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{layout.ports.kwok}"]


def emulator_argv(layout: Layout, python: str) -> list[str]:
    return [python, "-m", "tests.cluster.kubelet_emulator",
            f"--kubeconfig={layout.kubeconfig('kubelet-emulator')}",
            f"--images={layout.root / 'images.json'}",
            f"--state={layout.root / 'emulator'}"]
