from dataclasses import replace
from pathlib import Path

from gpulease.host.state import StateDir
from gpulease.hub.auth.caller_rights import ADMIN_SCOPE
from gpulease.hub.config.hub_config import CLI_SERVICE_NAME, SERVICE_NAME, HubSettings, hub_config


def settings(tmp_path) -> HubSettings:
    return HubSettings(
        state=StateDir(Path(tmp_path)), db_url="sqlite:///x", inventory_file="inv.yaml",
        catalog_file="", node_name="box", admin_name="root-admin", service_port=9999,
        cli_token="t0k", proxy_token="p", chp_command="/x/chp",
    )


def test_embedded_defaults(tmp_path):
    c = hub_config(settings(tmp_path))
    assert c.JupyterHub.db_url.startswith("sqlite:///") and "private" in c.JupyterHub.db_url
    assert c.JupyterHub.spawner_class.endswith("LocalGPUSpawner")
    assert c.LocalGPUSpawner.inventory_file == "inv.yaml"
    assert c.LocalAccountsAuthenticator.admin_users == {"root-admin"}
    assert c.ConfigurableHTTPProxy.command == ["/x/chp"]


def test_service_and_cli_token_roles(tmp_path):
    c = hub_config(settings(tmp_path))
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert services[SERVICE_NAME]["url"] == "http://127.0.0.1:9999"
    assert services[CLI_SERVICE_NAME]["api_token"] == "t0k"
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert CLI_SERVICE_NAME in roles["gpulease-admin"]["services"]
    assert ADMIN_SCOPE in roles["gpulease-admin"]["scopes"]
    assert ADMIN_SCOPE in c.JupyterHub.custom_scopes


def test_culler_service_and_its_role(tmp_path):
    from dataclasses import replace

    from gpulease.hub.config.hub_config import CULLER_SERVICE_NAME

    s = replace(settings(tmp_path), culler={"port": "9998", "interval": "30"})
    c = hub_config(s)
    services = {svc["name"]: svc for svc in c.JupyterHub.services}
    assert services[CULLER_SERVICE_NAME]["environment"]["GPULEASE_CULLER_INTERVAL"] == "30"
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    scopes = set(roles["gpulease-culler"]["scopes"])
    assert {"list:users", "read:servers", "admin:server_state", ADMIN_SCOPE} <= scopes
    # It never contacts users' servers: no access to them, filtered or not.
    assert not [s for s in scopes if s.split("!")[0] in ("access:servers", "servers")]
    # A server's own token reaches the gpulease service, to push its kernel state.
    assert f"access:services!service={SERVICE_NAME}" in c.LocalGPUSpawner.server_token_scopes
    assert roles["gpulease-culler"]["services"] == [CULLER_SERVICE_NAME]
    assert c.JupyterHub.last_activity_interval == 0
    assert CULLER_SERVICE_NAME not in {svc["name"] for svc in hub_config(settings(tmp_path))
                                       .JupyterHub.services}


def test_culler_stale_after_is_a_hub_option_that_reaches_the_culler(tmp_path):
    """The culler runs as a hub service, which does not inherit the hub's
    environment: how long a push counts is set on the hub and handed over."""
    from dataclasses import replace

    import pytest
    from traitlets import TraitError

    from gpulease.hub.app import GPULeaseHub
    from gpulease.hub.config.hub_config import CULLER_SERVICE_NAME
    from gpulease.idle_culler.app import parse_args

    culler = GPULeaseHub(culler_stale_after="90s")._culler_settings("declared")
    c = hub_config(replace(settings(tmp_path), culler=culler))
    env = {svc["name"]: svc for svc in c.JupyterHub.services}[CULLER_SERVICE_NAME]["environment"]
    args = parse_args([], {k: v for k, v in env.items() if isinstance(v, str)})
    assert args.stale_after == 90
    assert "culler_stale_after" in GPULeaseHub.class_get_help()
    with pytest.raises(TraitError, match="not a duration"):
        GPULeaseHub(culler_stale_after="90")


def test_culler_readings_interval_is_a_hub_option_that_reaches_the_culler(tmp_path):
    """Issue 47: how often the culler sends GPU readings is set on the hub (the culler, a hub
    service, inherits no environment), 10 s by default, 0 off, never negative."""
    import pytest
    from traitlets import TraitError

    from gpulease.hub.app import GPULeaseHub
    from gpulease.hub.config.hub_config import CULLER_SERVICE_NAME
    from gpulease.idle_culler.app import parse_args

    def culler_args(hub: GPULeaseHub):
        c = hub_config(replace(settings(tmp_path), culler=hub._culler_settings("declared")))
        env = {svc["name"]: svc for svc in c.JupyterHub.services}[CULLER_SERVICE_NAME][
            "environment"]
        return parse_args([], {k: v for k, v in env.items() if isinstance(v, str)})

    assert culler_args(GPULeaseHub()).readings_interval == 10.0
    assert culler_args(GPULeaseHub(culler_readings_interval=2.5)).readings_interval == 2.5
    assert culler_args(GPULeaseHub(culler_readings_interval=0)).readings_interval == 0
    help_text = GPULeaseHub.class_get_help()
    assert "culler_readings_interval" in help_text and "turn them off" in help_text
    # what the service takes (1 to 300 s): anything else would lose every reading
    for bad in (-1, 0.5, 301):
        with pytest.raises(TraitError, match="0 \\(off\\) or 1 to 300 seconds"):
            GPULeaseHub(culler_readings_interval=bad)
    assert "gpu_chart_step" in help_text
    for bad in (0, 601):
        with pytest.raises(TraitError, match="gpu_chart_step must be 1 to 600"):
            GPULeaseHub(gpu_chart_step=bad)


def test_the_cluster_shapes_culler_reads_pods_through_prometheus_and_the_metrics_api(tmp_path):
    """Cluster shape: CPU from metrics.k8s.io, GPU from culler_prometheus_url; the culler,
    a hub service that inherits nothing, gets what its Kubernetes client is configured from."""
    from dataclasses import replace

    from gpulease.hub.app import GPULeaseHub
    from gpulease.hub.config.hub_config import CULLER_SERVICE_NAME, kube_client_environment
    from gpulease.idle_culler.app import parse_args

    hub = GPULeaseHub(shape="cluster", culler_prometheus_url="http://prometheus.monitoring:9090")
    culler = hub._culler_settings("cluster")
    assert culler["cpu_source"] == "pod-metrics"
    assert culler["gpu_source"] == "prometheus:http://prometheus.monitoring:9090"
    assert GPULeaseHub(shape="cluster")._culler_settings("cluster")["gpu_source"] == "none"
    assert GPULeaseHub()._culler_settings("declared")["cpu_source"] == "process"
    c = hub_config(replace(settings(tmp_path), culler=culler, shape="cluster",
                           kubeconfig="/etc/hub/kubeconfig"))
    env = {svc["name"]: svc for svc in c.JupyterHub.services}[CULLER_SERVICE_NAME]["environment"]
    assert env["KUBECONFIG"] == "/etc/hub/kubeconfig"
    args = parse_args([], {k: v for k, v in env.items() if isinstance(v, str)})
    assert args.cpu_source == "pod-metrics" and args.gpu_source.startswith("prometheus:")
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kube_client_environment("", in_pod) == in_pod
    assert "culler_prometheus_url" in GPULeaseHub.class_get_help()


def test_users_servers_and_the_service_on_origins_of_their_own(tmp_path):
    s = replace(settings(tmp_path), public_url="http://localhost:8000/",
                subdomain_host="http://localhost:8000")
    c = hub_config(s)
    assert c.JupyterHub.subdomain_host == "http://localhost:8000"
    assert c.JupyterHub.public_url == "http://localhost:8000/"
    assert c.JupyterHub.cookie_host_prefix_enabled is False  # http: no __Host- cookies
    # servers reach the service at its own loopback address: no *.localhost name to resolve
    assert c.LocalGPUSpawner.environment["GPULEASE_SERVICE_URL"] == (
        f"http://127.0.0.1:{s.service_port}/services/gpulease/")
    service = next(x for x in c.JupyterHub.services if x["name"] == "gpulease")
    assert service["environment"]["GPULEASE_PUBLIC_URL"] == "http://localhost:8000/"
    assert service["environment"]["GPULEASE_SUBDOMAIN_HOST"] == "http://localhost:8000"
    https = hub_config(replace(s, public_url="https://gpu.example.org/",
                               subdomain_host="https://gpu.example.org", cookie_host_prefix=True))
    assert https.JupyterHub.cookie_host_prefix_enabled is True


def test_one_shared_origin_links_relatively(tmp_path):
    s = replace(settings(tmp_path), public_url="http://127.0.0.1:8000/", subdomain_host="")
    c = hub_config(s)
    assert c.JupyterHub.subdomain_host == "" and c.JupyterHub.public_url == ""
    assert s.page_urls.service("usage") == "/services/gpulease/usage"
    assert s.urls.service() == "http://127.0.0.1:8000/services/gpulease/"  # the CLI's


def test_the_hubs_own_tiers_reach_the_gpulease_service(tmp_path):
    """GPULeaseHub.extra_tiers: the service registers the same records (hub/service/app.py)."""
    import json

    preview = {"name": "preview", "price_field": "preview_price_per_hour", "label": "Preview",
               "queue_rank": 15}
    c = hub_config(replace(settings(tmp_path), extra_tiers=(preview,)))
    service = {s["name"]: s for s in c.JupyterHub.services}[SERVICE_NAME]
    assert json.loads(service["environment"]["GPULEASE_EXTRA_TIERS"]) == [preview]
    plain = {s["name"]: s for s in hub_config(settings(tmp_path)).JupyterHub.services}
    assert json.loads(plain[SERVICE_NAME]["environment"]["GPULEASE_EXTRA_TIERS"]) == []
