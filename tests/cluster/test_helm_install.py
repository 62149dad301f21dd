"""The Helm chart installed into the suite's real control plane (monitoring off: the
Prometheus operator's resource definitions are not installed there).

- `helm install` of the defaults and each values file in helm/gpulease/ci/: the API
  server validates every object; the users' namespace enforces PodSecurity
  `restricted`, which admits GPUKubeSpawner's pod spec and refuses a privileged pod;
  `helm upgrade` keeps the generated secrets; a wrong value is refused at install.
- The rendered hub configuration is the real one: a hub started here from the
  installed ConfigMap and Secret (addresses mapped to this host) spawns a MIG-slice
  server on the control plane with the token of the chart's own ServiceAccount.
- The rendered scheduler configuration, loaded by a real kube-scheduler running as
  the chart's scheduler ServiceAccount, takes its Lease and packs pods.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes_asyncio.config import kube_config

from gpulease.core.model.profiles import GpuSpec
from gpulease.site_urls import loopback_session
from gpulease.spawners.kube.rbac import hub_role_rules
from tests.cluster.conftest import POOL_LABEL, ControlPlane
from tests.cluster.kube import Kube, KubeError, pods_path
from tests.cluster.nodes import GpuNode
from tests.cluster.packing_scheduler import SchedulerProcess, token_kubeconfig
from tests.cluster.test_kubespawner import home_volume
from tests.cluster.test_packing_scheduler import place, pod, pool
from tests.cluster.test_pod_spec_cluster import _manifest
from tests.support.helm import CHART, VALUES_FILES, helm, values_args, values_of
from tests.support.hubproc import HubProcess, free_port
from tests.support.oidc_provider import (
    CLIENT_ID,
    CLIENT_SECRET,
    OIDCProvider,
    sign_in,
    signed_in_session,
    xsrf_headers,
)

CASES = [None, *VALUES_FILES]
IDS = ["defaults", *(p.stem for p in VALUES_FILES)]


@contextmanager
def installed(plane: ControlPlane, kube: Kube, namespace: str, values: Path | None,
              *sets: str) -> Iterator[str]:
    """The chart installed as a release of its own into `namespace`; uninstalled after,
    with its users' namespace. Yields the release name."""
    release = f"g{uuid.uuid4().hex[:6]}"
    users = f"{release}-users"
    env = {"KUBECONFIG": plane.kubeconfig}
    helm("install", release, str(CHART), "-n", namespace, *values_args(values, sets),
         f"--set=singleuser.namespace={users}", "--set=scheduler.name=" + release + "-sched",
         env=env)
    try:
        yield release
    finally:
        helm("uninstall", release, "-n", namespace, "--wait", "--timeout=60s", env=env,
             check=False)
        for path in (f"/api/v1/namespaces/{users}",
                     f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{release}-hub"):
            try:
                kube.delete(path)
            except KubeError:
                pass


def secret_data(kube: Kube, namespace: str, release: str, part: str = "hub"
                ) -> dict[str, str]:
    secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{release}-{part}")
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def account_token(kube: Kube, namespace: str, account: str) -> str:
    return kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}})["status"]["token"]


def rendered_hub(plane: ControlPlane, kube: Kube, namespace: str, release: str,
                 tmp_path: Path, env: dict[str, str] | None = None,
                 port: int = 0) -> tuple[HubProcess, dict[str, str]]:
    """A hub (not started) from the release's ConfigMap and Secrets, as its pod runs it,
    with the Services' names mapped to this host and the proxy started here; its users'
    servers at USER.localhost:PORT instead of the release's domain."""
    config = tmp_path / "etc-gpulease"  # the ConfigMap's files, as the pod mounts them
    config.mkdir()
    for name, text in kube.get(f"/api/v1/namespaces/{namespace}/configmaps/"
                               f"{release}-hub")["data"].items():
        (config / name).write_text(text)
    secrets = secret_data(kube, namespace, release)
    config_secret = tmp_path / "etc-gpulease-secret"  # hub.config, from its Secret
    config_secret.mkdir()
    for name, text in secret_data(kube, namespace, release, "hub-config").items():
        (config_secret / name).write_text(text)
    kubeconfig = tmp_path / "hub.kubeconfig"  # the chart's ServiceAccount's token
    kubeconfig.write_text(yaml.safe_dump(token_kubeconfig(
        plane.state["server"], plane.state["ca"],
        account_token(kube, namespace, f"{release}-hub"), "hub")))
    hub = HubProcess(state=tmp_path / "state", admin_password=secrets["admin-password"])
    hub.port, hub.hub_port, hub.api_port, service = (free_port() for _ in range(4))
    hub.port = port or hub.port
    hub.env = {"KUBECONFIG": str(kubeconfig), "GPULEASE_CHART_CONFIG": str(config),
               "GPULEASE_CHART_SECRET": str(config_secret),
               "JPY_COOKIE_SECRET": secrets["cookie-secret"],
               "JUPYTERHUB_CRYPT_KEY": secrets["crypt-key"],
               "CONFIGPROXY_AUTH_TOKEN": secrets["proxy-token"], **(env or {})}
    hub.extra_args = [
        f"--config={config / 'gpulease_config.py'}",
        "--ConfigurableHTTPProxy.should_start=True",
        f"--JupyterHub.hub_bind_url=http://127.0.0.1:{hub.hub_port}",
        f"--JupyterHub.hub_connect_url=http://127.0.0.1:{hub.hub_port}",
        # the servers' pods (here on loopback) reach the service at this address
        f"--GPULeaseHub.service_address=127.0.0.1:{service}",
        # served here, not at the release's domain (the chart's JupyterHub.subdomain_host)
        f"--subdomain-host=http://localhost:{hub.port}",
        f"--JupyterHub.public_url=http://localhost:{hub.port}/"]
    return hub, secrets


def as_a_browser_keeps_it(session: requests.Session) -> requests.Session:
    """Under a subdomain host JupyterHub sets its session id cookie for the hub's domain
    (`Domain=localhost`, which its users' subdomains share) and ties the xsrf token to it.
    A browser sends it back to localhost; Python's cookie jar files it under `.localhost`
    and, matching a dotless host as `localhost.local`, never does, so the hub would refuse
    the session's POSTs (XSRF). Kept for the host itself, as a browser has it."""
    for cookie in list(session.cookies):
        if cookie.domain == ".localhost":
            session.cookies.set(cookie.name, cookie.value, path=cookie.path)
    return session


@pytest.fixture(autouse=True)
def _kubeconfig(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", control_plane.kubeconfig)


@pytest.mark.parametrize("values", CASES, ids=IDS)
async def test_install_is_admitted_and_upgrade_keeps_the_secrets(
        control_plane: ControlPlane, kube: Kube, namespace: str, values: Path | None):
    with installed(control_plane, kube, namespace, values) as release:
        users = f"{release}-users"
        labels = kube.get(f"/api/v1/namespaces/{users}")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        deployments = {d["metadata"]["name"] for d in
                       kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]}
        assert {f"{release}-hub", f"{release}-proxy"} <= deployments
        role = kube.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{users}/roles/"
                        f"{release}-hub")
        # the hub's Role as rbac.py writes it (DRA's rule too where the values choose DRA)
        dra = values_of(values)["gpu"]["allocation"] == "dra"
        assert role["rules"] == hub_role_rules(dra)
        assert {r["resources"][0] for r in role["rules"]} == {
            "pods", "persistentvolumeclaims", "events", *(["resourceclaimtemplates"] * dra)}

        # PodSecurity restricted there: GPUKubeSpawner's pod is admitted, a privileged one not
        body = await _manifest(GpuSpec("H200", "1g.18gb"), users, "jupyter-alice")
        kube.create(pods_path(users) + "?dryRun=All", body)
        body["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        with pytest.raises(KubeError) as refused:
            kube.create(pods_path(users) + "?dryRun=All", body)
        assert refused.value.status == 403 and "violates PodSecurity" in str(refused.value)

        before = secret_data(kube, namespace, release)
        helm("upgrade", release, str(CHART), "-n", namespace, *values_args(values),
             f"--set=singleuser.namespace={users}", f"--set=scheduler.name={release}-sched",
             env={"KUBECONFIG": control_plane.kubeconfig})
        assert secret_data(kube, namespace, release) == before  # kept, not generated again


def test_a_wrong_value_is_refused_at_install_naming_it(control_plane: ControlPlane,
                                                       namespace: str):
    run = helm("install", "wrong", str(CHART), "-n", namespace, "--set=hub.db.type=mysql",
               env={"KUBECONFIG": control_plane.kubeconfig}, check=False)
    assert run.returncode != 0
    assert "at '/hub/db/type': value must be one of 'sqlite', 'postgresql'" in run.stderr
    assert "wrong" not in helm("list", "-n", namespace, "-q",
                               env={"KUBECONFIG": control_plane.kubeconfig}).stdout


def test_a_hub_from_the_rendered_configuration_spawns_a_slice_server(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    gpu_nodes(GpuNode("h200", mig={"1g.18gb": 7}))
    storage_class, _home = home_volume(kube, control_plane, namespace)
    with installed(control_plane, kube, namespace, None, "scheduler.enabled=false",
                   "prePuller.enabled=false", "singleuser.storage.capacity=1Gi",
                   f"singleuser.storage.storageClass={storage_class}",
                   f"singleuser.nodeSelector.{POOL_LABEL.replace('.', chr(92) + '.')}="
                   f"{namespace}") as release:
        users = f"{release}-users"
        chart = json.loads(kube.get(f"/api/v1/namespaces/{namespace}/configmaps/"
                                    f"{release}-hub")["data"]["chart.json"])
        assert chart["subdomainHost"] == "https://gpu.example.org"  # A_DOMAIN, as installed
        hub, secrets = rendered_hub(control_plane, kube, namespace, release, tmp_path)
        service = next(a.split("=", 1)[1] for a in hub.extra_args
                       if a.startswith("--GPULeaseHub.service_address="))
        hub.start(timeout=120)
        try:
            admin = hub.token_for("admin", secrets["admin-password"])
            token = hub.add_user(admin, "alice")
            r = hub.api("POST", "users/alice/server", token,
                        {"user_options": {"profile": "h200-1g"}})
            assert r.status_code in (201, 202), r.text + hub.log()[-3000:]
            hub.wait_server_ready("alice", token, timeout=120)
            server_pod = kube.get(pods_path(users, "jupyter-alice"))
            limits = server_pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits["nvidia.com/mig-1g.18gb"] == "1"
            assert server_pod["spec"]["nodeName"] == f"{namespace}-h200"
            assert server_pod["spec"]["automountServiceAccountToken"] is False
            # its own origin (USER.<domain>, the chart's subdomain host mapped here), and the
            # gpulease service reached at the hub's address, not through the proxy
            assert hub.urls.subdomain_host == f"http://localhost:{hub.port}"
            env = {e["name"]: e.get("value") for e in server_pod["spec"]["containers"][0]["env"]}
            assert env["GPULEASE_SERVICE_URL"] == f"http://{service}/services/gpulease/"
            status = loopback_session().get(hub.server_url("alice", path="api/status"),
                                            headers={"Authorization": f"token {token}"},
                                            timeout=30)
            assert status.status_code == 200, status.text
            sessions = hub.service("GET", "api/usage", token).json()["sessions"]
            assert [s["profile"] for s in sessions] == ["h200-1g"]
            assert hub.api("DELETE", "users/alice/server", token).status_code in (202, 204)
            hub.wait_server_stopped("alice", token)
        finally:
            hub.close()
            kube.delete(f"/api/v1/persistentvolumes/{namespace}-home")


def test_the_rendered_scheduler_configuration_packs_pods_as_the_charts_account(
        control_plane: ControlPlane, kube: Kube, namespace: str, gpu_nodes, tmp_path: Path):
    nodes = pool(kube, gpu_nodes, "pack-", 3, gpus=8)
    with installed(control_plane, kube, namespace, None, "prePuller.enabled=false") as release:
        name = f"{release}-sched"
        rendered = yaml.safe_load(kube.get(f"/api/v1/namespaces/{namespace}/configmaps/"
                                           f"{release}-scheduler")["data"]["config.yaml"])
        kubeconfig = tmp_path / "scheduler.kubeconfig"  # the chart's scheduler account
        kubeconfig.write_text(yaml.safe_dump(token_kubeconfig(
            control_plane.state["server"], control_plane.state["ca"],
            account_token(kube, namespace, f"{release}-scheduler"), "scheduler")))
        rendered["clientConnection"] = {"kubeconfig": str(kubeconfig)}  # its path mapped
        scheduler = SchedulerProcess(name, rendered, tmp_path,
                                     Path(control_plane.state["bin"]) / "kube-scheduler")

        def leader() -> str:
            try:
                return kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
                                f"{name}")["spec"].get("holderIdentity", "")
            except KubeError:
                return ""
        scheduler.start(ready=lambda: bool(leader()))
        try:
            used = {place(kube, namespace, pod(f"one-{n}", nodes, {"nvidia.com/gpu": 1},
                                               scheduler=name, cpu="1", memory="8Gi"))
                    for n in range(5)}
            assert len(used) == 1, used  # packed onto one node, two stay whole
            assert json.dumps(rendered).count("MostAllocated") == 1
        except BaseException:
            print(scheduler.tail())
            raise
        finally:
            scheduler.stop()


def test_a_hub_from_the_rendered_oidc_configuration_signs_in_through_the_provider(
        control_plane: ControlPlane, kube: Kube, namespace: str, tmp_path: Path):
    """helm/gpulease/ci/oidc-sign-in.yaml, its issuer and callback pointed at this host: the
    hub it renders signs researchers in through the suite's OpenID Connect provider, and
    the provider's groups decide who may enter and rent the vision group's profile."""
    port = free_port()
    callback = f"http://localhost:{port}/hub/oauth_callback"
    provider = OIDCProvider(tmp_path / "provider", [callback]).start()
    provider.set_account("s-ada", login="ada", password="ada-pw", email="Ada.L@uni.example",
                         groups=["researchers", "vision"])
    provider.set_account("s-ben", login="ben", password="ben-pw", preferred_username="ben",
                         groups=["researchers"])
    provider.set_account("s-eve", login="eve", password="eve-pw", groups=["visitors"])
    kube.create(f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpulease-oidc-client"},
        "stringData": {"client-secret": CLIENT_SECRET}})
    values = next(p for p in VALUES_FILES if p.stem == "oidc-sign-in")
    try:
        with installed(control_plane, kube, namespace, values, "scheduler.enabled=false",
                       "prePuller.enabled=false", f"auth.oidc.issuer={provider.issuer}",
                       f"auth.clientId={CLIENT_ID}", f"auth.callbackUrl={callback}") as release:
            client = kube.get(f"/api/v1/namespaces/{namespace}/secrets/gpulease-oidc-client")
            hub, _ = rendered_hub(control_plane, kube, namespace, release, tmp_path, env={
                "GPULEASE_OAUTH_CLIENT_SECRET":
                    base64.b64decode(client["data"]["client-secret"]).decode()}, port=port)
            hub.start(timeout=120)  # served here over http, not at the Ingress's https host
            try:
                ada = signed_in_session(hub.url, "ada", "ada-pw")
                me = ada.get(f"{hub.url}/hub/api/user", timeout=10).json()
                assert me["name"] == "ada-l" and set(me["groups"]) == {"researchers", "vision"}
                ben = as_a_browser_keeps_it(signed_in_session(hub.url, "ben", "ben-pw"))
                r = ben.post(f"{hub.url}/hub/api/users/ben/servers/big",
                             headers=xsrf_headers(ben), timeout=60,
                             json={"user_options": {"profile": "h200-full"}})
                assert r.status_code == 403 and "h200-full" in r.json()["message"], r.text
                assert sign_in(hub.url, "eve", "eve-pw").status_code == 403
            finally:
                hub.close()
    finally:
        provider.stop()
