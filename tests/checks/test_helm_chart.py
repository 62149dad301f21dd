"""The Helm chart, rendered: `helm lint` and `helm template` over the default values and
the realistic values files in helm/gpulease/ci/, and what the rendered objects say.

What is written once in Python is compared with what the chart renders: the hub's
Role and ClusterRole (spawners/kube/rbac.py), the packing scheduler's configuration
(spawners/kube/scheduler_config.py) and rights. The rendered hub configuration is run as
the hub runs it. Core manifests are validated offline with kubernetes-validate
--strict for the two newest Kubernetes versions it ships. Installing the chart into
the real control plane is tests/cluster/test_helm_install.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from traitlets.config import Config

from gpulease.core.model.catalog import load_catalog
from gpulease.core.model.profiles import load_profiles_file
from gpulease.images import CATALOG_PATH, shipped_catalog
from gpulease.spawners.kube.rbac import (
    SCHEDULER_CLUSTER_ROLES,
    hub_cluster_role_rules,
    hub_role_rules,
    scheduler_lease_rules,
)
from gpulease.spawners.kube.scheduler_config import (
    SchedulerSettings,
    profiles_mig,
    scheduler_configuration,
)
from tests.support.helm import (
    A_DOMAIN,
    CHART,
    NAMESPACE,
    RELEASE,
    VALUES_FILES,
    find,
    helm,
    one,
    render,
    values_args,
    values_of,
)

CASES = [None, *VALUES_FILES]
IDS = ["defaults", *(p.stem for p in VALUES_FILES)]
HUB = f"{RELEASE}-hub"
KUBERNETES_VERSIONS = ("1.37.0", "1.36.0")  # the two newest kubernetes-validate ships
CUSTOM_KINDS = {"PrometheusRule", "ServiceMonitor"}


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request) -> tuple[Path | None, list[dict]]:
    return request.param, render(request.param)


def users_namespace(values: dict) -> str:
    return values["singleuser"]["namespace"] or f"{RELEASE}-users"


def containers(objects: list[dict]) -> list[tuple[str, dict, dict]]:
    """(workload name, pod spec, container) of every container the chart runs."""
    out = []
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            spec = o["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                out.append((o["metadata"]["name"], spec, c))
    return out


def test_helm_lint_passes_strictly(case):
    values, _objects = case
    helm("lint", "--strict", str(CHART), *values_args(values))


def test_the_hubs_rights_are_the_ones_spawners_kube_rbac_proves(case):
    values, objects = case
    role = one(objects, "Role", HUB)
    assert role["metadata"]["namespace"] == users_namespace(values_of(values))
    dra = values_of(values)["gpu"]["allocation"] == "dra"  # DRA's rules only then
    assert role["rules"] == hub_role_rules(dra)
    (cluster_role,) = [r for r in find(objects, "ClusterRole")
                       if r["metadata"]["name"].startswith(HUB)]
    assert cluster_role["rules"] == hub_cluster_role_rules(dra)
    subject = [{"kind": "ServiceAccount", "name": HUB, "namespace": NAMESPACE}]
    assert one(objects, "RoleBinding", HUB)["subjects"] == subject
    (binding,) = [b for b in find(objects, "ClusterRoleBinding")
                  if b["roleRef"]["name"] == cluster_role["metadata"]["name"]]
    assert binding["subjects"] == subject
    # nothing else is granted to the hub, nor any wildcard to anyone
    granted = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
               and any(s["name"] == HUB for s in o["subjects"])]
    assert len(granted) == 2
    for rules in (o.get("rules", []) for o in objects if o["kind"] in ("Role", "ClusterRole")):
        assert not any("*" in r.get(k, []) for r in rules for k in ("verbs", "resources"))


def test_the_scheduler_config_is_the_one_gpulease_generates_for_the_profiles(case):
    values, objects = case
    v = values_of(values)
    if not v["scheduler"]["enabled"]:
        assert not find(objects, "ConfigMap", f"{RELEASE}-scheduler")
        hub_config = one(objects, "ConfigMap", HUB)["data"]
        assert json.loads(hub_config["chart.json"])["schedulerName"] == ""
        return
    rendered = yaml.safe_load(one(objects, "ConfigMap", f"{RELEASE}-scheduler")["data"]
                              ["config.yaml"])
    settings = SchedulerSettings(scheduler_name=v["scheduler"]["name"],
                                 mig_strategy=v["gpu"]["migStrategy"],
                                 lease_namespace=NAMESPACE)
    assert rendered == scheduler_configuration(profiles_mig(v["profiles"]), settings)
    # its rights: the bootstrap roles and its own Lease, by name
    account = {"kind": "ServiceAccount", "name": f"{RELEASE}-scheduler", "namespace": NAMESPACE}
    bound = {b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding")
             if account in b["subjects"]}
    assert bound == set(SCHEDULER_CLUSTER_ROLES)
    (lease,) = [r for r in find(objects, "Role") if r["metadata"]["name"].endswith("-lease")]
    assert lease["rules"] == scheduler_lease_rules(v["scheduler"]["name"])
    deployment = one(objects, "Deployment", f"{RELEASE}-scheduler")
    assert deployment["spec"]["replicas"] >= 2  # leader election: one binds at a time


def test_the_users_namespace_enforces_podsecurity_restricted(case):
    values, objects = case
    (namespace,) = find(objects, "Namespace")
    assert namespace["metadata"]["name"] == users_namespace(values_of(values))
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_servers_network_policy_blocks_metadata_and_allows_cluster_dns_and_the_hub(case):
    values, objects = case
    policies = find(objects, "NetworkPolicy")
    if not values_of(values)["singleuser"]["networkPolicy"]["enabled"]:
        assert policies == []
        return
    spec = one(objects, "NetworkPolicy", f"{RELEASE}-singleuser")["spec"]
    assert spec["podSelector"] == {"matchLabels": {"component": "singleuser-server"}}
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    egress = spec["egress"]
    assert all("to" in r for r in egress)  # no port is open to every address
    # DNS (port 53) only to the cluster's DNS service's pods, never to any address
    dns = [r for r in egress if any(p["port"] == 53 for p in r.get("ports", []))]
    assert dns == [{"to": [{"namespaceSelector": {"matchLabels": {
                                "kubernetes.io/metadata.name": "kube-system"}},
                            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]
    # the hub's API and the gpulease service (a server's notices and kernel state, at the
    # hub's Service since the proxy routes the service by its subdomain); not the proxy
    ports = {(p["port"], r["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"])
             for r in egress if "ports" in r and r not in dns for p in r["ports"]}
    assert ports == {(8081, "hub"), (values_of(values)["hub"]["servicePort"], "hub")}
    (internet,) = [r for r in egress if "to" in r and "ports" not in r]
    blocks = {b["ipBlock"]["cidr"]: b["ipBlock"].get("except", []) for b in internet["to"]}
    assert "169.254.169.254/32" in blocks["0.0.0.0/0"]
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"} <= set(blocks["0.0.0.0/0"])
    assert "fd00::/8" in blocks["::/0"]


def test_the_cluster_dns_service_is_a_value():
    objects = render(None, "singleuser.networkPolicy.dns.namespace=dns-system",
                     "singleuser.networkPolicy.dns.podLabels.app=coredns",
                     "singleuser.networkPolicy.dns.port=5353")
    egress = one(objects, "NetworkPolicy", f"{RELEASE}-singleuser")["spec"]["egress"]
    (dns,) = [r for r in egress if any(p["port"] == 5353 for p in r.get("ports", []))]
    (to,) = dns["to"]
    assert to["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "dns-system"}
    assert to["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns", "app": "coredns"}


def test_every_container_runs_as_podsecurity_restricted_asks(case):
    _values, objects = case
    found = containers(objects)
    assert found
    for workload, pod, container in found:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, workload
        assert security["capabilities"]["drop"] == ["ALL"], workload
        assert security["runAsNonRoot"] is True, workload
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", workload
        assert "requests" in container["resources"], (workload, container["name"])
        assert not container["image"].endswith(":latest"), container["image"]


def test_the_rendered_hub_configuration_is_the_one_the_hub_runs(case, tmp_path, monkeypatch):
    """The ConfigMap's gpulease_config.py, run as `gpulease up --config` runs it."""
    values, objects = case
    v = values_of(values)
    data = one(objects, "ConfigMap", HUB)["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    secret = tmp_path / "secret"  # hub.config and hub.extraConfig, from their Secret
    secret.mkdir()
    for name, text in secret_files(objects, f"{HUB}-config").items():
        (secret / name).write_text(text)
    monkeypatch.setenv("GPULEASE_CHART_CONFIG", str(tmp_path))
    monkeypatch.setenv("GPULEASE_CHART_SECRET", str(secret))
    monkeypatch.setenv("CONFIGPROXY_AUTH_TOKEN", "proxy-token")
    monkeypatch.setenv("GPULEASE_OAUTH_CLIENT_SECRET", "the-client-secret")
    monkeypatch.setenv("GPULEASE_DB_URL", "postgresql://db/gpulease"
                       if v["hub"]["db"]["type"] == "postgresql" else "")
    c = Config()
    exec(compile(data["gpulease_config.py"], "gpulease_config.py", "exec"),
         {"get_config": lambda: c})
    assert c.GPULeaseHub.shape == "cluster"
    assert c.GPULeaseHub.cluster_namespace == users_namespace(v)
    # the hub's Service by a name the servers' pods resolve from their own namespace
    assert c.GPULeaseHub.service_address == f"{HUB}.{NAMESPACE}.svc:{v['hub']['servicePort']}"
    assert "servers_proxy_url" not in c.GPULeaseHub  # servers reach the service directly
    assert c.ConfigurableHTTPProxy.should_start is False
    assert c.ConfigurableHTTPProxy.api_url == f"http://{RELEASE}-proxy-api:8001"
    assert c.JupyterHub.hub_connect_url == f"http://{HUB}.{NAMESPACE}.svc:8081"
    # each user's servers on an origin of their own (the subdomain host), unless shared
    ingress = v["ingress"]
    scheme = "https" if ingress.get("tlsSecret") else "http"
    expected = v["hub"]["subdomainHost"] or (
        "" if v["hub"]["allowSharedOrigin"] else f"{scheme}://{ingress['hosts'][0]}")
    assert c.JupyterHub.subdomain_host == expected
    assert c.GPULeaseHub.allow_shared_origin is v["hub"]["allowSharedOrigin"]
    proxy = one(objects, "Deployment", f"{RELEASE}-proxy")["spec"]["template"]["spec"]
    assert ("--host-routing" in proxy["containers"][0]["command"]) is bool(expected)
    assert c.JupyterHub.base_url == v["hub"]["baseUrl"]
    assert c.GPUKubeSpawner.mig_strategy == v["gpu"]["migStrategy"]
    assert c.GPUKubeSpawner.packing_scheduler == (v["scheduler"]["name"]
                                                  if v["scheduler"]["enabled"] else "")
    assert c.GPUKubeSpawner.storage_capacity == v["singleuser"]["storage"]["capacity"]
    # the tiers' PriorityClasses: the ones the chart makes, named to the spawner
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PriorityClass"}
    spot = {**values_of(None)["spot"], **v.get("spot", {})}
    if spot["priorityClasses"]["create"]:
        on_demand = classes[c.GPUKubeSpawner.on_demand_priority_class]
        spot_class = classes[c.GPUKubeSpawner.spot_priority_class]
        cpu_only = classes[c.GPUKubeSpawner.cpu_only_priority_class]
        assert on_demand["value"] > spot_class["value"]
        assert spot_class["preemptionPolicy"] == cpu_only["preemptionPolicy"] == "Never"
        assert cpu_only["value"] == on_demand["value"]
        # no researcher's start can preempt the hub, the proxy or the packing scheduler
        for o in objects:
            if o["kind"] == "Deployment":
                name = o["spec"]["template"]["spec"].get("priorityClassName")
                assert name in classes and classes[name]["value"] > on_demand["value"], \
                    o["metadata"]["name"]
    else:
        assert not classes and c.GPUKubeSpawner.spot_priority_class == ""
    assert c.GPULeaseHub.spot_grace_period == spot["gracePeriodSeconds"]
    assert c.LocalAccountsAuthenticator.trusted_proxies == v["hub"]["trustedProxies"]
    # the proxy pod is known by its headless Service's name (the login throttle)
    assert c.LocalAccountsAuthenticator.proxy_hosts == [f"{RELEASE}-proxy-api"]
    assert one(objects, "Service", f"{RELEASE}-proxy-api")["spec"]["clusterIP"] == "None"
    if v["hub"]["db"]["type"] == "postgresql":
        assert c.JupyterHub.db_url == c.GPULeaseHub.billing_db_url == "postgresql://db/gpulease"
    else:
        assert "db_url" not in c.JupyterHub
    auth = {**values_of(None)["auth"], **v.get("auth", {})}
    assert c.GPULeaseHub.admin_groups == auth["adminGroups"]
    assert c.GPULeaseHub.auditor_groups == auth["auditorGroups"]
    if auth["type"] == "local":
        assert "authenticator_class" not in c.JupyterHub
    else:  # the provider's settings, the client secret from its Secret (the environment)
        assert c.JupyterHub.authenticator_class == f"gpulease-{auth['type']}"
        signin = c.GPULeaseOIDCAuthenticator if auth["type"] == "oidc" else \
            c.GPULeaseGitHubAuthenticator
        assert signin.client_id == auth["clientId"]
        assert signin.client_secret == "the-client-secret"
        host = v["ingress"]["hosts"][0]
        assert signin.oauth_callback_url == (auth["callbackUrl"] or
                                             f"https://{host}{v['hub']['baseUrl']}hub/oauth_callback")
        assert c.JupyterHub.public_url == f"https://{host}{v['hub']['baseUrl']}"
        assert signin.allowed_groups == set(auth["allowedGroups"])
        if auth["type"] == "oidc":
            assert signin.oidc_issuer == auth["oidc"]["issuer"]
        env = one(objects, "Deployment", HUB)["spec"]["template"]["spec"]["containers"][0]["env"]
        ref = next(e for e in env if e["name"] == "GPULEASE_OAUTH_CLIENT_SECRET")
        assert ref["valueFrom"]["secretKeyRef"] == {"name": auth["clientSecret"]["existingSecret"],
                                                    "key": auth["clientSecret"]["key"]}
    for class_name, options in v["hub"]["config"].items():  # passed through
        for option, value in options.items():
            assert c[class_name][option] == value
    # the profiles file is the values' profiles, and gpulease loads it
    catalog_file = c.GPULeaseHub.get("catalog_file")
    assert bool(catalog_file) == bool(v.get("catalog"))
    catalog = load_catalog(catalog_file or CATALOG_PATH)
    profiles = load_profiles_file(tmp_path / "profiles.yaml", catalog)
    assert [p.slug for p in profiles] == [p["slug"] for p in v["profiles"]]


def test_hub_config_and_extra_config_pass_through(tmp_path):
    objects = render(None, "hub.config.GPUKubeSpawner.start_timeout=900",
                     "hub.config.LocalAccountsAuthenticator.max_failures=3",
                     "hub.extraConfig=c.JupyterHub.concurrent_spawn_limit = 42")
    files = secret_files(objects, f"{HUB}-config")  # a Secret: they may hold secrets
    assert files["extra-config.py"].rstrip() == "c.JupyterHub.concurrent_spawn_limit = 42"
    assert json.loads(files["hub-config.json"]) == {
        "GPUKubeSpawner": {"start_timeout": 900},
        "LocalAccountsAuthenticator": {"max_failures": 3}}
    config = tmp_path / "config"
    config.mkdir()
    for name, text in one(objects, "ConfigMap", HUB)["data"].items():
        (config / name).write_text(text)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {"GPULEASE_CHART_CONFIG": str(config), "GPULEASE_CHART_SECRET": str(tmp_path),
           "CONFIGPROXY_AUTH_TOKEN": "t"}
    c = Config()
    old_env = dict(os.environ)
    os.environ.update(env)
    try:
        exec(compile((config / "gpulease_config.py").read_text(), "gpulease_config.py",
                     "exec"), {"get_config": lambda: c})
    finally:
        os.environ.clear()
        os.environ.update(old_env)
    assert c.GPUKubeSpawner.start_timeout == 900
    assert c.LocalAccountsAuthenticator.max_failures == 3
    assert c.JupyterHub.concurrent_spawn_limit == 42  # after everything else


def test_a_provider_without_an_ingress_needs_its_callback_url():
    sets = ("auth.type=github", "auth.clientId=hub", "auth.clientSecret.existingSecret=s")
    run = helm("template", RELEASE, str(CHART), *values_args(None, sets), check=False)
    assert run.returncode != 0
    assert "auth.callbackUrl is needed when no Ingress host says where the hub is" in run.stderr
    objects = render(None, *sets, "auth.callbackUrl=http://10.0.0.5/hub/oauth_callback")
    chart = json.loads(one(objects, "ConfigMap", HUB)["data"]["chart.json"])
    assert chart["auth"]["callbackUrl"] == "http://10.0.0.5/hub/oauth_callback"
    assert "clientSecret" not in chart["auth"]  # only its Secret's name, and not here


def chart_json(objects: list[dict]) -> dict:
    return json.loads(one(objects, "ConfigMap", HUB)["data"]["chart.json"])


def test_ingress_with_tls_routes_the_host_and_its_wildcard_to_the_proxy_at_the_base_url():
    """The hub at gpu.lab.example.org, each user's servers at USER.gpu.lab.example.org:
    the Ingress routes both to the proxy, under the admin's wildcard certificate."""
    values = next(p for p in VALUES_FILES if "ingress" in p.stem)
    objects = render(values)
    (ingress,) = find(objects, "Ingress")
    rules = ingress["spec"]["rules"]
    assert [r["host"] for r in rules] == ["gpu.lab.example.org", "*.gpu.lab.example.org"]
    for rule in rules:
        (path,) = rule["http"]["paths"]
        assert path["path"] == "/gpu/" and path["pathType"] == "Prefix"
        assert path["backend"]["service"]["name"] == f"{RELEASE}-proxy-public"
    assert ingress["spec"]["tls"] == [{
        "secretName": "gpu-lab-tls", "hosts": ["gpu.lab.example.org", "*.gpu.lab.example.org"]}]
    chart = chart_json(objects)
    assert chart["subdomainHost"] == "https://gpu.lab.example.org"
    assert chart["publicUrl"] == "https://gpu.lab.example.org/gpu/"
    assert not find(render(None), "Ingress")

    # without TLS: http, no TLS block; a subdomain host of the admin's own gets the wildcard
    plain = render(None, "ingress.enabled=true", "ingress.hosts[0]=gpu.lab.example.org",
                   "hub.subdomainHost=")
    (ingress,) = find(plain, "Ingress")
    assert "tls" not in ingress["spec"]
    assert chart_json(plain)["subdomainHost"] == "http://gpu.lab.example.org"
    own = render(None, "ingress.enabled=true", "ingress.hosts[0]=hub.lab.example.org",
                 "ingress.tlsSecret=lab-tls", "hub.subdomainHost=https://nb.lab.example.org")
    (ingress,) = find(own, "Ingress")
    assert [r["host"] for r in ingress["spec"]["rules"]] == [
        "hub.lab.example.org", "*.nb.lab.example.org"]
    assert ingress["spec"]["tls"][0]["hosts"] == ["hub.lab.example.org", "*.nb.lab.example.org"]
    assert chart_json(own)["subdomainHost"] == "https://nb.lab.example.org"


def template(*sets: str) -> tuple[int, str]:
    """`helm template` with exactly these values (no A_DOMAIN): its exit status and stderr."""
    run = helm("template", RELEASE, str(CHART), *(f"--set={s}" for s in sets), check=False)
    return run.returncode, run.stderr


def test_an_install_that_cannot_know_the_domain_of_the_users_servers_is_refused():
    """Each user's servers get an origin of their own, USER.<domain>: with no Ingress host
    and no hub.subdomainHost nothing says the domain, and the install is refused naming
    what to set, rather than a hub that crash-loops (gpulease.hub.web.origins refuses to start
    the cluster shape without one)."""
    status, stderr = template()
    assert status != 0
    assert "no domain for the users' servers" in stderr, stderr
    for value in ("ingress.hosts", "ingress.tlsSecret", "hub.subdomainHost",
                  "hub.allowSharedOrigin"):
        assert value in stderr, (value, stderr)
    # an Ingress without hosts is the schema's refusal, before it
    status, stderr = template("ingress.enabled=true")
    assert status != 0 and "at '/ingress/hosts': minItems" in stderr, stderr

    # the opt-out, for a group whose members all trust each other: no subdomains
    shared = render(None, "hub.allowSharedOrigin=true")
    assert chart_json(shared)["subdomainHost"] == ""
    assert chart_json(shared)["allowSharedOrigin"] is True
    proxy = one(shared, "Deployment", f"{RELEASE}-proxy")["spec"]["template"]["spec"]
    assert "--host-routing" not in proxy["containers"][0]["command"]
    # both at once say two different things
    status, stderr = template("hub.subdomainHost=https://gpu.example.org",
                              "hub.allowSharedOrigin=true")
    assert status != 0 and "hub.subdomainHost (https://gpu.example.org) and " \
        "hub.allowSharedOrigin: set one" in stderr, stderr
    # the list of TLS blocks of before: the wildcard certificate's Secret is named now
    status, stderr = template("ingress.enabled=true", "ingress.hosts[0]=gpu.example.org",
                              "ingress.tls[0].secretName=gpu-tls")
    assert status != 0 and "ingress.tls is replaced by ingress.tlsSecret" in stderr, stderr
    # a loopback trial through kubectl port-forward
    trial = render(None, "hub.subdomainHost=http://localhost:8000")
    assert chart_json(trial)["subdomainHost"] == "http://localhost:8000"


def test_secrets_are_generated_in_the_right_form():
    secret = one(render(None), "Secret", HUB)
    import base64

    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert set(data) == {"cookie-secret", "crypt-key", "proxy-token", "admin-password"}
    for hexed in (data["cookie-secret"], data["crypt-key"]):  # 32 bytes, hex
        assert len(hexed) == 64 and int(hexed, 16) >= 0
    assert len(data["proxy-token"]) == 64 and len(data["admin-password"]) >= 16
    again = one(render(None), "Secret", HUB)
    assert again["data"]["cookie-secret"] != secret["data"]["cookie-secret"]  # random


def test_the_image_puller_pulls_each_catalog_image_on_gpu_nodes():
    objects = render(None)
    (puller,) = find(objects, "DaemonSet")
    spec = puller["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    pulled = [c["image"] for c in spec["initContainers"]]
    catalog = {e.name: e.image for e in shipped_catalog().images}
    assert set(pulled) <= set(catalog.values())
    assert set(pulled) >= {catalog[i] for p in values_of(None)["profiles"]
                           for i in p.get("images", [])}
    assert not find(render(None, "prePuller.enabled=false"), "DaemonSet")


def test_the_proxy_has_a_disruption_budget_and_both_services():
    objects = render(None)
    (pdb,) = find(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "proxy"
    names = {s["metadata"]["name"] for s in find(objects, "Service")}
    assert names == {HUB, f"{RELEASE}-proxy-api", f"{RELEASE}-proxy-public"}


@pytest.mark.parametrize(("sets", "says"), [
    (("gpu.migStrategy=half",), "at '/gpu/migStrategy': value must be one of 'mixed', 'single'"),
    (("hub.db.type=postgresql",), "at '/hub/db/postgresql/existingSecret': minLength"),
    (("hub.db.type=mysql",), "at '/hub/db/type': value must be one of 'sqlite', 'postgresql'"),
    (("hub.image.tag=latest",), "at '/hub/image/tag'"),
    (("ingress.enabled=true",), "at '/ingress/hosts': minItems"),
    (("singleuser.networkPolicy.blockedEgress[0]=metadata",), "at '/singleuser/networkPolicy/"
                                                               "blockedEgress/0'"),
    (("singleuser.networkPolicy.dns.namespace=Kube System",), "at '/singleuser/networkPolicy/"
                                                               "dns/namespace'"),
    (("hub.replicas=2",), "at '/hub': additional properties 'replicas' not allowed"),
    (("profiles[0].price_per_hour=1",), "at '/profiles/0/price_per_hour'"),
    (("auth.type=saml",), "at '/auth/type': value must be one of 'local', 'oidc', 'github'"),
    (("auth.type=oidc", "auth.clientId=hub", "auth.clientSecret.existingSecret=s"),
     "at '/auth/oidc/issuer': minLength"),
    (("auth.type=github",), "at '/auth/clientId': minLength"),
    (("auth.callbackUrl=https://gpu.example/callback",), "at '/auth/callbackUrl'"),
    (("hub.subdomainHost=https://gpu.example.org/hub/",), "at '/hub/subdomainHost'"),
    (("hub.subdomainHost=http://10.0.0.5:8000",), "at '/hub/subdomainHost'"),
    (("hub.subdomainHost=gpu.example.org",), "at '/hub/subdomainHost'"),
    (("ingress.enabled=true", "ingress.hosts[0]=*.gpu.example.org"), "at '/ingress/hosts/0'"),
])
def test_a_wrong_value_is_refused_by_the_schema_naming_it(sets, says):
    run = helm("template", RELEASE, str(CHART), *(f"--set={s}" for s in sets), check=False)
    assert run.returncode != 0
    assert "values don't meet the specifications of the schema" in run.stderr, run.stderr
    assert says in run.stderr, run.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_manifests_validate_strictly(case, version):
    _values, objects = case
    for o in objects:
        if o["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{o['kind']}/{o['metadata']['name']} on {version}: "
                                 f"{e.message} at {list(e.path)}") from None


def test_notes_say_how_to_log_in():
    out = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client",
               *values_args(None, ("hub.subdomainHost=http://localhost:8000",))).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "port-forward service/gp-proxy-public 8000:80" in notes
    assert "then http://localhost:8000/" in notes
    values = next(p for p in VALUES_FILES if "ingress" in p.stem)
    out = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run=client",
               *values_args(values)).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "https://gpu.lab.example.org/gpu/" in notes
    assert "wildcard record *.gpu.lab.example.org" in notes and "gpu-lab-tls" in notes
    assert f"get secret {HUB} -o jsonpath='{{.data.admin-password}}'" in notes
    assert os.path.exists(CHART / "values.schema.json")


def secret_files(objects: list[dict], name: str) -> dict[str, str]:
    import base64

    return {k: base64.b64decode(v).decode() for k, v in one(objects, "Secret", name)["data"].items()}


def test_hub_config_and_extra_config_stay_out_of_the_configmap(tmp_path, monkeypatch):
    """hub.config holds an authenticator's client secret and hub.extraConfig may hold a
    token: a ConfigMap is readable by the `view` role, so both go in a Secret."""
    objects = render(None, "hub.config.GenericOAuthenticator.client_secret=s3cr3t-oauth",
                     "hub.extraConfig=c.JupyterHub.api_tokens = {'t0ken-xyz': 'svc'}")
    for o in find(objects, "ConfigMap"):
        text = json.dumps(o["data"])
        assert "s3cr3t-oauth" not in text and "t0ken-xyz" not in text, o["metadata"]["name"]
    files = secret_files(objects, f"{HUB}-config")
    assert json.loads(files["hub-config.json"]) == {
        "GenericOAuthenticator": {"client_secret": "s3cr3t-oauth"}}
    # the hub mounts it, and the rendered configuration reads it
    hub = one(objects, "Deployment", HUB)["spec"]["template"]
    mounts = {m["name"]: m["mountPath"] for m in hub["spec"]["containers"][0]["volumeMounts"]}
    (volume,) = [v for v in hub["spec"]["volumes"] if v["name"] == "config-secret"]
    assert volume["secret"]["secretName"] == f"{HUB}-config"
    assert mounts["config-secret"] == "/etc/gpulease-secret"
    assert "checksum/config-secret" in hub["metadata"]["annotations"]
    config, secret = tmp_path / "config", tmp_path / "secret"
    config.mkdir(), secret.mkdir()
    for name, text in one(objects, "ConfigMap", HUB)["data"].items():
        (config / name).write_text(text)
    for name, text in files.items():
        (secret / name).write_text(text)
    monkeypatch.setenv("GPULEASE_CHART_CONFIG", str(config))
    monkeypatch.setenv("GPULEASE_CHART_SECRET", str(secret))
    monkeypatch.setenv("CONFIGPROXY_AUTH_TOKEN", "proxy-token")
    c = Config()
    text = (config / "gpulease_config.py").read_text()
    exec(compile(text, "gpulease_config.py", "exec"), {"get_config": lambda: c})
    assert c.GenericOAuthenticator.client_secret == "s3cr3t-oauth"
    assert c.JupyterHub.api_tokens == {"t0ken-xyz": "svc"}


@pytest.mark.parametrize(("profile", "says"), [
    ({"gpus": 1}, "at '/profiles/0': additional properties 'gpus' not allowed"),
    ({"display_name": None}, "at '/profiles/0': missing property 'display_name'"),
    ({"cpu": None}, "at '/profiles/0': missing property 'cpu'"),
    ({"memory": "32GB"}, "at '/profiles/0/memory'"),
    ({"cpu": "two"}, "at '/profiles/0/cpu'"),
    ({"enabled": "yes"}, "at '/profiles/0/enabled'"),
])
def test_a_wrong_profile_is_refused_by_the_schema_not_by_a_crashing_hub(profile, says,
                                                                          tmp_path):
    """The hub refuses a bad profiles file at start (CrashLoopBackOff after a 'successful'
    install); the schema must refuse what gpulease.core.model.profiles refuses, at install."""
    good = {"slug": "a", "display_name": "A", "cpu": 1, "memory": "1Gi",
            "images": ["pytorch"], "price_per_hour": "1"}
    bad = {k: v for k, v in {**good, **profile}.items() if v is not None}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"profiles": [bad]}))
    run = helm("template", RELEASE, str(CHART), "-f", str(values), f"--set={A_DOMAIN}",
               check=False)
    assert run.returncode != 0, f"{bad} installed"
    assert "values don't meet the specifications of the schema" in run.stderr, run.stderr
    assert says in run.stderr, run.stderr
    values.write_text(yaml.safe_dump({"profiles": [good, {**good, "slug": "b", "cpu": "0.5",
                                                          "groups": ["lab"], "min_run": "5m"}]}))
    helm("template", RELEASE, str(CHART), "-f", str(values), f"--set={A_DOMAIN}")  # pass


@pytest.mark.parametrize("release", ["1lab", "gp.lab"])
def test_a_release_name_that_cannot_name_a_service_is_refused_readably(release):
    """Helm takes release names with dots or a leading digit; Services (<release>-hub) and
    the users' Namespace cannot have them, and the API server refused them mid-install."""
    run = helm("template", release, str(CHART), *values_args(None), check=False)
    assert run.returncode != 0
    assert "release name" in run.stderr and release in run.stderr, run.stderr


def test_the_hub_and_the_proxy_take_only_what_they_serve():
    """The hub's API from the proxy and the servers, the gpulease service from the proxy;
    the proxy's API from the hub only, its public port from anywhere."""
    objects = render(None)
    hub = one(objects, "NetworkPolicy", HUB)["spec"]
    by_port = {}
    for rule in hub["ingress"]:
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    components = {port: sorted(f["podSelector"]["matchLabels"].get(
        "app.kubernetes.io/component", f["podSelector"]["matchLabels"].get("component"))
        for f in froms) for port, froms in by_port.items()}
    # the servers reach the gpulease service directly (GPULEASE_SERVICE_URL), on its port
    assert components == {8081: ["proxy", "singleuser-server"],
                          8090: ["proxy", "singleuser-server"]}
    # its port, whatever it is, and no other to the servers
    moved = one(render(None, "hub.servicePort=9100"), "NetworkPolicy", HUB)["spec"]
    (servers,) = [r for r in moved["ingress"]
                  if r["from"][0]["podSelector"]["matchLabels"].get("component")]
    assert [p["port"] for p in servers["ports"]] == [8081, 9100]
    proxy = one(objects, "NetworkPolicy", f"{RELEASE}-proxy")["spec"]["ingress"]
    assert {"ports": [{"protocol": "TCP", "port": 8000}]} in proxy  # public: no `from`
    (api,) = [r for r in proxy if r["ports"][0]["port"] == 8001]
    assert [f["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for f in api["from"]] == ["hub"]


def test_long_release_names_in_two_namespaces_never_share_a_cluster_wide_object():
    """ClusterRoles and ClusterRoleBindings carry the release and its namespace; cut to 63
    characters, two long pairs would collide: past the limit the name ends in a hash."""
    release = "lab-notebooks-production-" + "x" * 28  # 53 characters, as helm allows
    names = []
    for namespace in ("research-gpu-cluster-team-one", "research-gpu-cluster-team-two"):
        out = helm("template", release, str(CHART), "-n", namespace, *values_args(None)).stdout
        cluster_wide = [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(out)
                        if o and o["kind"] in ("ClusterRole", "ClusterRoleBinding",
                                               "PriorityClass")]
        assert all(len(n) <= 63 for _kind, n in cluster_wide), cluster_wide
        assert len(set(cluster_wide)) == len(cluster_wide) == 8
        names.append(set(cluster_wide))
    assert not names[0] & names[1], names


def test_spot_pods_must_rank_below_on_demand_ones():
    run = helm("template", RELEASE, str(CHART), f"--set={A_DOMAIN}",
               "--set=spot.priorityClasses.spotValue=1000",
               check=False)
    assert run.returncode != 0
    assert "spotValue (1000) must be below onDemandValue (1000)" in run.stderr, run.stderr
    run = helm("template", RELEASE, str(CHART), f"--set={A_DOMAIN}",
               "--set=spot.priorityClasses.coreValue=1000",
               check=False)
    assert run.returncode != 0 and "coreValue (1000) must be above onDemandValue" in run.stderr
    off = helm("template", RELEASE, str(CHART), f"--set={A_DOMAIN}",
               "--set=spot.priorityClasses.create=false").stdout
    assert "kind: PriorityClass" not in off and "priorityClassName" not in off
