# The hub's configuration in the cluster shape, as the gpulease Helm chart installs it:
# `gpulease up --config` loads this over gpulease's defaults. What it reads of the values
# is in chart.json beside it; the secrets are in the environment (the hub's Secret).
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by traitlets as the file is loaded
here = Path(os.environ.get("GPULEASE_CHART_CONFIG", "/etc/gpulease"))
# hub.config and hub.extraConfig: in the Secret <release>-hub-config (they may hold an
# authenticator's client secret), mounted here.
secret = Path(os.environ.get("GPULEASE_CHART_SECRET", "/etc/gpulease-secret"))
chart = json.loads((here / "chart.json").read_text())

c.GPULeaseHub.shape = "cluster"
c.GPULeaseHub.cluster_namespace = chart["usersNamespace"]
c.GPULeaseHub.profiles_file = str(here / "profiles.yaml")
if (here / "catalog.yaml").exists():  # the values' catalog; else the one the image ships
    c.GPULeaseHub.catalog_file = str(here / "catalog.yaml")
c.GPULeaseHub.admin_name = chart["adminName"]
# The proxy runs in a pod of its own: it and the servers (in the users' namespace, hence
# the Service's name with its namespace) reach the hub's API and the gpulease service at
# the hub's Service.
c.GPULeaseHub.service_address = f"{chart['hubHost']}:{chart['servicePort']}"
c.JupyterHub.base_url = chart["baseUrl"]
c.JupyterHub.hub_bind_url = "http://:8081"
c.JupyterHub.hub_connect_url = f"http://{chart['hubHost']}:8081"
c.ConfigurableHTTPProxy.should_start = False
c.ConfigurableHTTPProxy.api_url = f"http://{chart['proxyApi']}:8001"
c.ConfigurableHTTPProxy.auth_token = os.environ["CONFIGPROXY_AUTH_TOKEN"]
# A new chart version may bring a newer JupyterHub: its tables are upgraded at start
# (gpulease's own are, always).
c.JupyterHub.upgrade_db = True
db_url = os.environ.get("GPULEASE_DB_URL", "")
if db_url:  # hub.db.type postgresql: both in the one database
    c.JupyterHub.db_url = db_url
    c.GPULeaseHub.billing_db_url = db_url

c.GPUKubeSpawner.mig_strategy = chart["migStrategy"]
c.GPUKubeSpawner.gpu_allocation = chart["gpuAllocation"]  # device-plugin | dra
c.GPUKubeSpawner.packing_scheduler = chart["schedulerName"]
# The tiers' PriorityClasses (priorityclasses.yaml): kube-scheduler preempts spot pods.
c.GPUKubeSpawner.on_demand_priority_class = chart["priorityClasses"]["onDemand"]
c.GPUKubeSpawner.cpu_only_priority_class = chart["priorityClasses"]["cpuOnly"]
c.GPUKubeSpawner.spot_priority_class = chart["priorityClasses"]["spot"]
c.GPULeaseHub.spot_grace_period = chart["spotGraceSeconds"]
c.GPUKubeSpawner.storage_capacity = chart["storage"]["capacity"]
c.GPUKubeSpawner.storage_access_modes = chart["storage"]["accessModes"]
if chart["storage"]["storageClass"]:
    c.GPUKubeSpawner.storage_class = chart["storage"]["storageClass"]
if chart["nodeSelector"]:
    c.GPUKubeSpawner.node_selector = chart["nodeSelector"]
# The proxy pod, known by the headless Service's name: the client address it forwards is
# what the login throttle counts; trustedProxies are proxies in front of it (an Ingress).
c.LocalAccountsAuthenticator.proxy_hosts = [chart["proxyApi"]]
c.LocalAccountsAuthenticator.trusted_proxies = chart["trustedProxies"]

# Where researchers reach the hub (the Ingress): links, and secure cookies behind TLS.
if chart["publicUrl"]:
    c.JupyterHub.public_url = chart["publicUrl"]
# Each user's servers on an origin of their own, USER.<domain> (hub.subdomainHost, else
# the Ingress's host; gpulease.hub.web.origins), or all on the hub's (hub.allowSharedOrigin).
c.JupyterHub.subdomain_host = chart["subdomainHost"]
c.GPULeaseHub.allow_shared_origin = chart["allowSharedOrigin"]

# Sign-in (auth.*; docs/auth.md): the provider's client secret is in the environment.
auth = chart["auth"]
c.GPULeaseHub.admin_groups = auth["adminGroups"]
c.GPULeaseHub.auditor_groups = auth["auditorGroups"]
if auth["type"] != "local":
    c.JupyterHub.authenticator_class = f"gpulease-{auth['type']}"
    oidc = auth["type"] == "oidc"
    signin = c.GPULeaseOIDCAuthenticator if oidc else c.GPULeaseGitHubAuthenticator
    signin.client_id = auth["clientId"]
    signin.client_secret = os.environ["GPULEASE_OAUTH_CLIENT_SECRET"]
    signin.oauth_callback_url = auth["callbackUrl"]
    signin.auth_refresh_age = auth["refreshAgeSeconds"]
    if auth["allowedUsers"]:
        signin.allowed_users = set(auth["allowedUsers"])
    if auth["allowedGroups"]:
        signin.allowed_groups = set(auth["allowedGroups"])
    if oidc:
        signin.oidc_issuer = auth["oidc"]["issuer"]
        signin.scope = auth["oidc"]["scopes"]
        signin.username_claim = auth["oidc"]["usernameClaim"]
        signin.auth_state_groups_key = f"oauth_user.{auth['oidc']['groupsClaim']}"
    else:
        signin.github_url = auth["github"]["url"]
        if auth["github"]["allowedOrganizations"]:
            signin.allowed_organizations = set(auth["github"]["allowedOrganizations"])

# hub.config: {ClassName: {option: value}}, passed through as traitlets configuration.
hub_config = secret / "hub-config.json"
passed = json.loads(hub_config.read_text()) if hub_config.exists() else {}
for class_name, options in passed.items():
    for option, value in options.items():
        c[class_name][option] = value

# hub.extraConfig: Python run after everything above.
extra_config = secret / "extra-config.py"
if extra_config.exists() and extra_config.read_text().strip():
    exec(compile(extra_config.read_text(), "hub.extraConfig", "exec"))
