"""`gpulease up` in the cluster shape, without a cluster: its configuration and refusals.

The shape end to end, on the real control plane: tests/cluster/test_gpulease_up_cluster.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from traitlets.config import Config

from gpulease.host.state import StateDir, StateError
from gpulease.hub.config.cluster_shape import resolve_namespace
from gpulease.hub.config.hub_config import (
    SERVICE_NAME,
    HubSettings,
    hub_config,
    parse_service_address,
)
from tests.integration.host.test_up_command import run_up


def settings(tmp_path: Path, **kw) -> HubSettings:
    return HubSettings(
        state=StateDir(tmp_path), db_url="sqlite:///x", inventory_file="", catalog_file="",
        node_name="box", admin_name="root-admin", service_port=9999, cli_token="t0k",
        proxy_token="p", chp_command=None, public_url="http://hub.example:8000/", **kw)


def service_env(c: Config) -> dict:
    (service,) = [s for s in c.JupyterHub.services if s["name"] == SERVICE_NAME]
    return service["environment"]


def test_cluster_shape_runs_gpu_kube_spawner_with_gpuleases_options(tmp_path):
    c = hub_config(settings(tmp_path, shape="cluster", cluster_namespace="gpu-users",
                            kubeconfig="/etc/hub.kubeconfig", queue_max_wait_s=600,
                            queue_max_length=40, queue_places_per_user=2,
                            cpu_only_cpu_per_user="8"))
    assert c.JupyterHub.spawner_class == "gpulease.spawners.kube.GPUKubeSpawner"
    kube = c.GPUKubeSpawner
    assert kube.db_url == "sqlite:///x" and kube.namespace == "gpu-users"
    assert (kube.queue_max_wait, kube.queue_max_length, kube.queue_places_per_user,
            kube.cpu_only_cpu_per_user) == (600.0, 40, 2, "8")
    assert kube.start_timeout == 660 and c.JupyterHub.concurrent_spawn_limit == 140
    # the service at its own address (service_address; the chart's is the hub's Service),
    # never through the proxy, which routes it by its subdomain
    assert kube.environment["GPULEASE_SERVICE_URL"] == "http://127.0.0.1:9999/services/gpulease/"
    # nothing of the embedded box's own
    assert "state_dir" not in kube and "unix_accounts" not in kube
    assert "LocalGPUSpawner" not in c
    assert c.JupyterHub.cleanup_servers is False  # pods outlive a hub restart
    env = service_env(c)
    assert env["GPULEASE_CLUSTER_NAMESPACE"] == "gpu-users"
    assert env["KUBECONFIG"] == "/etc/hub.kubeconfig"


def test_embedded_shape_has_no_cluster_namespace_nor_kubeconfig(tmp_path):
    s = settings(tmp_path, kubeconfig="/etc/hub.kubeconfig", cluster_namespace="ignored")
    c = hub_config(s)
    assert c.JupyterHub.spawner_class.endswith("LocalGPUSpawner")
    assert "GPUKubeSpawner" not in c and c.JupyterHub.cleanup_servers is True
    env = service_env(c)
    assert env["GPULEASE_CLUSTER_NAMESPACE"] == "" and "KUBECONFIG" not in env
    # and without a kubeconfig the cluster shape passes none (in-cluster credentials)
    env = service_env(hub_config(replace(s, shape="cluster", kubeconfig="")))
    assert "KUBECONFIG" not in env and env["GPULEASE_CLUSTER_NAMESPACE"] == "ignored"


def test_a_hub_pods_service_gets_the_in_cluster_variables(tmp_path, monkeypatch):
    # In a hub pod the service's client finds the API server by these two (JupyterHub
    # passes a service only its own environment).
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    env = service_env(hub_config(settings(tmp_path, shape="cluster", kubeconfig="")))
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.0.0.1", "443")


def test_the_namespace_is_the_configured_one_else_the_hub_pods_else_default(tmp_path):
    absent = tmp_path / "absent"
    assert resolve_namespace("gpu-users", Config(), absent) == "gpu-users"
    assert resolve_namespace("", Config(), absent) == "default"
    mounted = tmp_path / "namespace"
    mounted.write_text("jhub\n")
    assert resolve_namespace("", Config(), mounted) == "jhub"


def test_a_spawner_namespace_of_the_admins_own_that_differs_is_refused(tmp_path):
    theirs = Config()
    theirs.GPUKubeSpawner.namespace = "other"
    with pytest.raises(StateError, match="cluster_namespace instead"):
        resolve_namespace("gpu-users", theirs, tmp_path / "absent")
    theirs.GPUKubeSpawner.namespace = "gpu-users"  # the same: fine
    assert resolve_namespace("gpu-users", theirs, tmp_path / "absent") == "gpu-users"


def test_help_all_shows_the_shape_and_gpu_kube_spawner():
    out = run_up("--help-all").stdout
    for option in ("--GPULeaseHub.shape", "--GPULeaseHub.cluster_namespace",
                   "--GPUKubeSpawner.mig_strategy", "--GPUKubeSpawner.packing_scheduler"):
        assert option in out, option


# kubespawner made unimportable in this one process, as if `gpulease[cluster]` were not
# installed (a stand-in: uninstalling it here would break every other test).
WITHOUT_KUBESPAWNER = """
import sys
class NoKubespawner:
    def find_spec(self, name, path=None, target=None):
        if name == "kubespawner" or name.startswith("kubespawner."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoKubespawner())
from gpulease.hub.cli import main
sys.argv = ["gpulease", "up", *sys.argv[1:]]
main()
"""


def test_cluster_shape_without_kubespawner_stops_with_how_to_install(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_KUBESPAWNER, f"--state={tmp_path / 's'}",
         "--GPULeaseHub.shape=cluster", "--subdomain-host=https://gpu.example.org"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GPULEASE_ADMIN_PASSWORD": "x" * 12})
    assert r.returncode != 0
    assert "needs kubespawner" in r.stderr and "[cluster]" in r.stderr, r.stderr


def test_cluster_shape_without_a_domain_for_the_servers_stops_naming_it(tmp_path):
    """The cluster's proxy is always reachable beyond a loopback: each user's servers need
    a domain of their own (--subdomain-host; the Helm chart's hub.subdomainHost or Ingress
    host), asked for before anything else is checked or started."""
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_KUBESPAWNER, f"--state={tmp_path / 's'}",
         "--GPULeaseHub.shape=cluster"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GPULEASE_ADMIN_PASSWORD": "x" * 12})
    assert r.returncode != 0
    assert "--subdomain-host" in r.stderr and "allow_shared_origin" in r.stderr, r.stderr


def test_with_the_proxy_in_its_own_pod_the_service_listens_on_every_address(tmp_path):
    """The Helm chart's proxy runs in a pod of its own: it and the servers' pods reach the
    gpulease service at the hub's Service (GPULeaseHub.service_address); the servers not
    through the proxy, which routes the service by its subdomain (gpulease--service.<host>,
    a name a pod cannot resolve)."""
    hub_service = "gpulease-hub.gpulease.svc"  # the chart's: resolved from another namespace
    pod_shape = settings(tmp_path, shape="cluster", cluster_namespace="gpu-users",
                         service_host=hub_service, service_listen="")
    c = hub_config(pod_shape)
    (service,) = [s for s in c.JupyterHub.services if s["name"] == SERVICE_NAME]
    assert service["url"] == f"http://{hub_service}:9999"
    assert service_env(c)["GPULEASE_SERVICE_LISTEN"] == ""
    assert (c.GPUKubeSpawner.environment["GPULEASE_SERVICE_URL"]
            == f"http://{hub_service}:9999/services/gpulease/")
    # under a base URL the service's prefix carries it
    based = hub_config(replace(pod_shape, public_url="https://gpu.example.org/gpu/",
                               subdomain_host="https://gpu.example.org"))
    assert (based.GPUKubeSpawner.environment["GPULEASE_SERVICE_URL"]
            == f"http://{hub_service}:9999/gpu/services/gpulease/")
    embedded = hub_config(settings(tmp_path))
    assert service_env(embedded)["GPULEASE_SERVICE_LISTEN"] == "127.0.0.1"


@pytest.mark.parametrize("address", ["gpulease-hub", "gpulease-hub:", ":8090", "hub:99999",
                                     "hub:http"])
def test_a_service_address_without_host_and_port_is_refused_naming_the_form(address):
    with pytest.raises(ValueError, match=r"expected host:port.*1-65535"):
        parse_service_address(address)
    assert parse_service_address("gpulease-hub:8090") == ("gpulease-hub", 8090)
    assert parse_service_address("") == ("127.0.0.1", 0)
