"""The culler's CPU source (idle-culler/pod_metrics.py) on the real API server, which runs
no metrics server: configured from $KUBECONFIG as a ServiceAccount holding only the culler's
Role (CULLER_RULES), a pod's CPU is unknown and says there is no metrics server, never 0;
without that Role the answer is a refusal, named as such."""

from __future__ import annotations

import asyncio
from pathlib import Path

# Imported before the test sets $KUBECONFIG, as in a long run: the culler must read it
# when it connects, not when kubernetes_asyncio is first imported.
import kubernetes_asyncio.config  # noqa: F401
import pytest
import yaml

from gpulease.idle_culler.pod_metrics import (
    CULLER_RULES,
    NO_METRICS_SERVER,
    PodMetricsCpuSource,
)
from tests.cluster.conftest import ControlPlane
from tests.cluster.kube import Kube
from tests.cluster.rbac import grant, service_account_token


def token_kubeconfig(plane: ControlPlane, token: str, namespace: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "culler",
        "clusters": [{"name": "test", "cluster": {"server": plane.state["server"],
                                                  "certificate-authority": plane.state["ca"]}}],
        "users": [{"name": "culler", "user": {"token": token}}],
        "contexts": [{"name": "culler", "context": {"cluster": "test", "user": "culler",
                                                    "namespace": namespace}}]}))
    return path


@pytest.mark.parametrize("granted", [True, False], ids=["culler-role", "no-role"])
async def test_without_a_metrics_server_a_pods_cpu_is_unknown_never_idle(
        control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, granted: bool):
    token = service_account_token(kube, namespace, "culler")
    if granted:
        grant(kube, namespace, "culler", rules=CULLER_RULES)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(token_kubeconfig(control_plane, token, namespace,
                                                          tmp_path / "culler.kubeconfig")))
    state = {"pod_name": "jupyter-ada", "namespace": namespace, "dns_name": "x",
             "kubespawner_version": "7.0.0"}
    source = PodMetricsCpuSource(cache_s=0)  # the default client: $KUBECONFIG
    try:
        if granted:
            # The Role applies within the authorizer's cache; until then, refusals.
            for _ in range(100):
                reading = await source.read(("ada", ""), state)
                if "forbidden" not in reading.error:
                    break
                await asyncio.sleep(0.2)
            assert reading.percent is None
            assert reading.error == NO_METRICS_SERVER
        else:
            reading = await source.read(("ada", ""), state)
            assert reading.percent is None
            assert reading.error.startswith(
                f"forbidden to list pods.metrics.k8s.io in namespace {namespace}"), reading
    finally:
        await source.close()
