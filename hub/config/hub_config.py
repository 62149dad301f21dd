"""gpulease's JupyterHub configuration, assembled as a plain function.

`hub_config(settings)` returns the traitlets Config that `gpulease up` lays
under the user's own config file and command line (theirs win). Keeping it a
pure function means what the embedded hub runs with is testable without a hub.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from traitlets.config import Config

from gpulease.core.capacity.queue import QUEUE_PLACES_PER_USER
from gpulease.core.policy.cpu_totals import CPU_ONLY_CPU_PER_USER, CPU_ONLY_MEMORY_PER_USER
from gpulease.host.state import StateDir
from gpulease.hub.auth.caller_rights import ADMIN_SCOPE, AUDIT_SCOPE, HUB_ADMIN_SCOPE
from gpulease.hub.config.cluster_shape import SPAWNER_CLASS as CLUSTER_SPAWNER
from gpulease.hub.web.named_servers import NAMED_SERVER_LIMIT
from gpulease.site_urls import SiteURLs
from gpulease.spawners.queueing.spot_preemption import SPOT_GRACE_S
from gpulease.store.failed_starts import DEFAULT_LIMIT as FAILED_START_LIMIT
from gpulease.store.failed_starts import DEFAULT_WINDOW_S as FAILED_START_WINDOW_S

SERVICE_NAME = "gpulease"
CLI_SERVICE_NAME = "gpulease-cli"
CULLER_SERVICE_NAME = "gpulease-culler"

CUSTOM_SCOPES = {
    ADMIN_SCOPE: {
        "description": "Administer gpulease: profiles, credits, limits, inventory, accounts.",
        "subscopes": [AUDIT_SCOPE],
    },
    AUDIT_SCOPE: {"description": "Read gpulease's usage, inventory and audit log."},
}

# What the gpulease service itself may do on the hub: create local users,
# read users and servers, and stop servers with a reason.
SERVICE_SCOPES = [
    "admin:users",
    "list:users",
    "read:users",
    "read:groups",
    "read:servers",
    "delete:servers",
    "admin:server_state",
    # POST api/servers stores validated options through the hub's PUT/PATCH on
    # /users/{name}/servers/{server}, which need start:servers (nothing starts).
    "start:servers",
]


TEMPLATES = Path(__file__).resolve().parent.parent / "templates"  # hub/templates

# JupyterHub's own defaults for a start that does not wait in gpulease's queue:
# Spawner.start_timeout and JupyterHub.concurrent_spawn_limit.
NORMAL_START_S = 60
NORMAL_CONCURRENT_SPAWNS = 100


def low_balance_banner(s: HubSettings):
    """template_vars callable: `gpulease_banner()` in page.html, the page user's notices
    (suspend warnings, stops) and low-balance warning, if any. The balance comes
    from the meter's memory (refreshed every heartbeat); the notices cost one
    small query, in a worker thread (gpulease.hub.web.template_values).
    """

    def banner(user):
        from gpulease.hub.web.template_values import OffLoop
        from gpulease.spawners.context import get_context
        from gpulease.store.notices import banner_text

        if user is None:
            return None
        ctx = get_context(s.db_url, s.inventory_file, s.catalog_file, s.node_name)
        low = (ctx.meter.low.get(user.name, "") if ctx.meter else "") or ""
        name = user.name  # the hub's ORM is read here, on the loop

        def text() -> str:
            try:
                notices = banner_text(ctx.notices.active(name))
            except Exception:  # a page must render even when the database is away
                notices = ""
            return " ".join(part for part in (notices, low) if part)

        return lambda: OffLoop(text, fallback=low)

    return banner


def _context_of(s: HubSettings):
    """The shared gpulease context of this hub (created on first use, in the hub process)."""

    def get():
        from gpulease.spawners.context import get_context

        return get_context(s.db_url, s.inventory_file, s.catalog_file, s.node_name)

    return get


def hub_page_handlers(s: HubSettings) -> list[tuple]:
    """Handlers gpulease adds to the hub itself, under its prefix (GPULeaseHub.init_handlers).

    The home page's default-profile form posts here with the hub's own cookie
    and _xsrf, and the spawn page's recommendation panel asks here: a hub page has
    no OAuth cookie of the gpulease service.
    """
    from gpulease.hub.web.home_page import DefaultProfileFormHandler
    from gpulease.hub.web.recommend import RecommendHandler
    from gpulease.hub.web.site_handler import SiteHandler

    return [(r"/gpulease/default-profile", DefaultProfileFormHandler,
             {"get_ctx": _context_of(s)}),
            # the spawn page's "Which profile does my work need?" panel
            (r"/gpulease/recommend", RecommendHandler, {"get_ctx": _context_of(s)}),
            # ... for the user whose spawn page it is (an admin's /hub/spawn/ada)
            (r"/gpulease/recommend/([^/]+)", RecommendHandler, {"get_ctx": _context_of(s)}),
            (r"/gpulease/site", SiteHandler, {"urls": s.urls})]


def _smtp_password(_spawner) -> str:
    # Evaluated when the service starts (JupyterHub calls callables in a
    # spawner's environment): the secret never enters the Config.
    return os.environ.get("GPULEASE_SMTP_PASSWORD", "")


def notify_environment(s: HubSettings) -> dict:
    """What the gpulease service needs to send notifications."""
    return {
        "GPULEASE_NOTIFY_WEBHOOK_URL": s.notify_webhook_url,
        "GPULEASE_SMTP_HOST": s.smtp_host,
        "GPULEASE_SMTP_PORT": str(s.smtp_port),
        "GPULEASE_SMTP_FROM": s.smtp_from,
        "GPULEASE_SMTP_STARTTLS": "1" if s.smtp_starttls else "0",
        "GPULEASE_SMTP_USERNAME": s.smtp_username,
        "GPULEASE_SMTP_PASSWORD": _smtp_password,
    }


# What the idle culler needs: users, their servers and activity, each server's
# state (its pid for the CPU reading, its devices), and the gpulease service
# (the kernel state servers pushed, api/stop to suspend, notices). Never
# access:servers: the culler does not contact users' servers, and a token
# sent to one could be logged by the user's own code there.
CULLER_SCOPES = [
    "list:users", "read:users:name", "read:users:activity", "read:servers",
    "admin:server_state", f"access:services!service={SERVICE_NAME}", ADMIN_SCOPE,
]


@dataclass(frozen=True)
class HubSettings:
    state: StateDir
    db_url: str
    inventory_file: str
    catalog_file: str
    node_name: str
    admin_name: str
    service_port: int
    cli_token: str
    proxy_token: str
    chp_command: str | None
    admin_groups: tuple[str, ...] = ()
    auditor_groups: tuple[str, ...] = ()
    # Where browsers reach the hub (JupyterHub.public_url, with the base URL), and the
    # host users' servers get subdomains of (gpulease.hub.web.origins; "": the hub's origin).
    public_url: str = "http://127.0.0.1:8000/"
    subdomain_host: str = ""
    cookie_host_prefix: bool = False  # JupyterHub.cookie_host_prefix_enabled (https)
    # Where the proxy reaches the gpulease service, and the address it listens on
    # (GPULeaseHub.service_address): loopback unless the proxy runs in a pod of its own.
    service_host: str = "127.0.0.1"
    service_listen: str = "127.0.0.1"
    # Where the embedded box's servers reach the hub API and the service: loopback, or
    # the host's address on the sandboxes' bridge (gpulease.hub.config.sandbox_setup).
    internal_host: str = "127.0.0.1"
    culler: dict[str, str] | None = None  # GPULEASE_CULLER_* settings; None: no culler
    # Notifications (GPULeaseHub.notify_webhook_url, smtp_*).
    notify_webhook_url: str = ""
    smtp_host: str = ""
    smtp_port: int = 25
    smtp_from: str = "gpulease@localhost"
    smtp_starttls: bool = False
    smtp_username: str = ""
    # The admission queue (GPULeaseHub.queue_max_wait, queue_max_length).
    queue_max_wait_s: int = 1800
    queue_max_length: int = 500
    spot_grace_s: float = SPOT_GRACE_S  # GPULeaseHub.spot_grace_period
    reservations_by_researchers: bool = False  # GPULeaseHub.reservations_by_researchers
    reservation_lead_s: int = 24 * 3600  # GPULeaseHub.reservation_lead_time
    # Per-user limits (GPULeaseHub.queue_places_per_user, cpu_only_*_per_user).
    queue_places_per_user: int = QUEUE_PLACES_PER_USER
    # Rationing of failed starts (GPULeaseHub.failed_start_limit, failed_start_window).
    failed_start_limit: int = FAILED_START_LIMIT
    failed_start_window_s: int = FAILED_START_WINDOW_S
    gpu_chart_step_s: int = 60  # GPULeaseHub.gpu_chart_step, for the service
    extra_tiers: tuple[dict, ...] = ()  # GPULeaseHub.extra_tiers, for the service
    cpu_only_cpu_per_user: str = CPU_ONLY_CPU_PER_USER
    cpu_only_memory_per_user: str = CPU_ONLY_MEMORY_PER_USER
    # Isolation between users (gpulease.hub.config.isolation_check.IsolationPlan.settings()):
    # the spawner's unix_*/resource_limits/device_* options; shown by api/inventory.
    isolation: dict = field(default_factory=dict)
    # GPULeaseHub.shape: embedded (LocalGPUSpawner) or cluster (GPUKubeSpawner, pods
    # in cluster_namespace; the hub's $KUBECONFIG, if any, passed to the service).
    shape: str = "embedded"
    cluster_namespace: str = ""
    kubeconfig: str = ""
    # The spawner's node selector and GPU tolerations (cluster_shape.spawner_nodes): the
    # service's availability counts the nodes the spawner admits to.
    cluster_nodes: dict = field(default_factory=dict)

    @property
    def urls(self) -> SiteURLs:
        """The hub's, the service's and the servers' public URLs (absolute)."""
        return SiteURLs(self.public_url, self.subdomain_host)

    @property
    def page_urls(self) -> SiteURLs:
        """The URLs the hub's pages link to: absolute across origins; on one shared
        origin relative to it, as the hub's address beyond loopback is not known."""
        if self.subdomain_host:
            return self.urls
        return SiteURLs(urlsplit(self.public_url).path or "/")


# What a kubernetes_asyncio client in a hub service needs of the hub's environment:
# JupyterHub passes a service only its `environment`, and in a pod the in-cluster
# configuration is found by these two variables (with the ServiceAccount's files).
IN_CLUSTER_VARIABLES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


def kube_client_environment(kubeconfig: str, environ: dict[str, str] | None = None
                            ) -> dict[str, str]:
    """The variables a hub service's Kubernetes client is configured from."""
    environ = os.environ if environ is None else environ
    out = {name: environ[name] for name in IN_CLUSTER_VARIABLES if environ.get(name)}
    if kubeconfig:
        out["KUBECONFIG"] = kubeconfig
    return out


def project_chp() -> str | None:
    """configurable-http-proxy installed by npm inside the project, if there is one."""
    root = Path(__file__).resolve().parents[2]  # the checkout (hub/config/ is two below)
    candidate = root / "node_modules" / ".bin" / "configurable-http-proxy"
    return str(candidate) if candidate.exists() else None


def parse_service_address(address: str) -> tuple[str, int]:
    """GPULeaseHub.service_address as (host, port); ("127.0.0.1", 0) when empty (0: pick a
    free port). ValueError naming what is wrong."""
    if not address:
        return "127.0.0.1", 0
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"GPULeaseHub.service_address {address!r}: expected host:port, a host "
                         "name the proxy resolves (the hub's Service) and a port 1-65535")
    return host, int(port)


def service_direct_base(s: HubSettings, host: str = "127.0.0.1") -> str:
    """The gpulease service's own address with the hub's base URL, bypassing the proxy."""
    return f"http://{host}:{s.service_port}{urlsplit(s.public_url).path}"


def service_direct_url(s: HubSettings, host: str = "127.0.0.1") -> str:
    """The gpulease service's own address and prefix, bypassing the proxy."""
    return f"{service_direct_base(s, host)}services/{SERVICE_NAME}/"


def hub_config(s: HubSettings) -> Config:
    from gpulease.hub.web.error_text import error_text
    from gpulease.hub.web.home_page import home_template_var
    from gpulease.hub.web.site_nav import SiteNav

    c = Config()
    hub = c.JupyterHub
    hub.db_url = s.state.hub_db_url
    # Each user's servers on an origin of their own (gpulease.hub.web.origins).
    hub.subdomain_host = s.subdomain_host
    hub.public_url = s.public_url if s.subdomain_host else ""
    hub.cookie_host_prefix_enabled = s.cookie_host_prefix
    hub.cookie_secret_file = str(s.state.cookie_secret_file)
    hub.pid_file = ""
    cluster = s.shape == "cluster"
    if s.internal_host != "127.0.0.1":  # the servers' namespaces reach the hub API there
        hub.hub_ip = s.internal_host
    hub.spawner_class = (CLUSTER_SPAWNER if cluster else "gpulease.spawners.local.LocalGPUSpawner")
    hub.authenticator_class = "gpulease.hub.auth.local.LocalAccountsAuthenticator"
    hub.allow_named_servers = True
    # Refused with 409 naming it beyond (gpulease.hub.web.named_servers); yours wins.
    hub.named_server_limit_per_user = NAMED_SERVER_LIMIT
    # Ctrl-C stops the embedded box's servers; a cluster's pods outlive a hub restart
    # (an upgrade, a rescheduled hub pod), their sessions carried on (Meter.recover).
    hub.cleanup_servers = not cluster
    hub.custom_scopes = CUSTOM_SCOPES
    hub.template_paths = [str(TEMPLATES)]
    hub.template_vars = {
        "gpulease_banner": low_balance_banner(s),
        # the home page's servers, profiles and default profile (hub/web/home_page.py)
        "gpulease_home": home_template_var(_context_of(s)),
        # error.html's wording per status; JupyterHub calls a callable value with
        # the page's user, so this one returns the function itself
        "gpulease_error_text": lambda _user: error_text,
        # the one navigation bar of the hub's and the service's pages (hub/web/site_nav.py)
        "gpulease_nav": lambda _user: SiteNav(s.page_urls),
    }
    hub.services = [
        {
            "name": SERVICE_NAME,
            "display": True,
            "url": f"http://{s.service_host}:{s.service_port}",
            "command": [sys.executable, "-m", "gpulease.hub.service"],
            "environment": {
                "GPULEASE_DB_URL": s.db_url,
                "GPULEASE_INVENTORY_FILE": s.inventory_file,
                "GPULEASE_CATALOG_FILE": s.catalog_file,
                "GPULEASE_NODE_NAME": s.node_name,
                "GPULEASE_SERVICE_PORT": str(s.service_port),
                "GPULEASE_SERVICE_LISTEN": s.service_listen,
                # links from the service's pages to the hub's (gpulease.site_urls)
                "GPULEASE_PUBLIC_URL": s.page_urls.hub_public,
                "GPULEASE_SUBDOMAIN_HOST": s.subdomain_host,
                # its login cookie __Host- prefixed as the hub's are (JupyterHub tells only
                # spawners): else a user's subdomain could toss hers onto the service
                "JUPYTERHUB_COOKIE_HOST_PREFIX_ENABLED": "1" if s.cookie_host_prefix else "0",
                # api/inventory shows it; `users add` makes the Unix account with it
                "GPULEASE_ISOLATION": json.dumps(s.isolation),
                "GPULEASE_RESERVATIONS_BY_RESEARCHERS": "1" if s.reservations_by_researchers
                else "",
                "GPULEASE_RESERVATION_LEAD_S": str(s.reservation_lead_s),
                "GPULEASE_FAILED_START_LIMIT": str(s.failed_start_limit),
                "GPULEASE_FAILED_START_WINDOW_S": str(s.failed_start_window_s),
                "GPULEASE_GPU_CHART_STEP_S": str(s.gpu_chart_step_s),
                "GPULEASE_EXTRA_TIERS": json.dumps(list(s.extra_tiers)),
                # where servers' own logs are (api/logs): the embedded box's state folder
                "GPULEASE_SERVER_LOG_ROOT": "" if cluster else str(s.state.root),
                # The cluster shape's inventory reads the cluster (JupyterHub passes
                # no KUBECONFIG, nor the in-cluster variables, to services).
                "GPULEASE_CLUSTER_NAMESPACE": s.cluster_namespace if cluster else "",
                "GPULEASE_CLUSTER_NODES": json.dumps(s.cluster_nodes) if cluster else "",
                **(kube_client_environment(s.kubeconfig) if cluster else {}),
                **notify_environment(s),
            },
            "oauth_no_confirm": True,
            # Pages log in with OAuth: let the cookie token carry the gpulease
            # scopes the user holds (the hub drops those they do not), so an
            # auditor's browser can open the admin report, and a hub admin's
            # its admin:users, which makes it a gpulease admin (caller_rights).
            # No confirmation page: oauth_no_confirm above.
            "oauth_client_allowed_scopes": [ADMIN_SCOPE, AUDIT_SCOPE, HUB_ADMIN_SCOPE],
        },
        # The CLI's token is a hub admin: `users add --admin` makes a hub admin,
        # which JupyterHub lets only an admin do, and the gpulease service stays
        # no admin (it forwards the caller's token for that one request). The
        # token is in private/, readable only by the hub's account.
        {"name": CLI_SERVICE_NAME, "api_token": s.cli_token, "display": False, "admin": True},
    ]
    hub.load_roles = [
        {
            # Every user may call the gpulease service (it decides per endpoint
            # what they may see); JupyterHub's default `user` role does not
            # include access to services.
            "name": "user",
            "description": "Standard user privileges, and the gpulease service",
            "scopes": ["self", f"access:services!service={SERVICE_NAME}"],
        },
        {
            "name": "gpulease-service",
            "description": "What the gpulease service does on the hub",
            "services": [SERVICE_NAME],
            "scopes": SERVICE_SCOPES,
        },
        {
            "name": "gpulease-admin",
            "description": "Administer gpulease",
            "services": [CLI_SERVICE_NAME],
            "groups": list(s.admin_groups),
            "scopes": [ADMIN_SCOPE, f"access:services!service={SERVICE_NAME}", "admin:users",
                       "admin:servers", "list:users", "read:users"],
        },
        {
            "name": "gpulease-auditor",
            "description": "Read gpulease's usage, inventory and audit log",
            "groups": list(s.auditor_groups),
            "scopes": [AUDIT_SCOPE, f"access:services!service={SERVICE_NAME}"],
        },
    ]

    if s.culler is not None:
        hub.services.append({
            "name": CULLER_SERVICE_NAME,
            "display": False,
            "url": f"http://127.0.0.1:{s.culler['port']}",
            "command": [sys.executable, "-m", "gpulease.idle_culler"],
            "environment": {
                # The gpulease service at its own port, not through the proxy:
                # under --ssl-cert the proxy's certificate names the public host,
                # not 127.0.0.1, so the culler could not verify it and read nothing.
                "GPULEASE_CULLER_HUB_URL": service_direct_base(s, s.internal_host),
                **{f"GPULEASE_CULLER_{k.upper()}": v for k, v in s.culler.items()},
                # The cluster shape's CPU reading asks the API server (metrics.k8s.io).
                **(kube_client_environment(s.kubeconfig) if cluster else {}),
            },
        })
        hub.load_roles.append({
            "name": "gpulease-culler",
            "description": "What the idle culler reads, and stopping idle servers through gpulease",
            "services": [CULLER_SERVICE_NAME],
            "scopes": CULLER_SCOPES,
        })
    # Activity that reaches the hub is what servers report (every minute, see
    # the spawner's environment), not every request the proxy forwarded: an
    # open JupyterLab tab polls constantly and would keep an idle GPU alive.
    hub.last_activity_interval = 0

    proxy = c.ConfigurableHTTPProxy
    proxy.auth_token = s.proxy_token
    proxy.pid_file = str(s.state.proxy_pid_file)
    if s.chp_command:
        proxy.command = [s.chp_command]

    auth = c.LocalAccountsAuthenticator
    auth.db_url = s.db_url
    auth.admin_users = {s.admin_name}
    # Sign-in through a provider (hub/auth/oauth.py, docs/auth.md): its identities are
    # mapped to names in gpulease's database; GPULeaseHub.admin_groups make hub admins
    # (and gpulease-admin, load_roles above).
    signin = c.ProviderSignIn
    signin.db_url = s.db_url
    if s.admin_groups:
        signin.admin_groups = set(s.admin_groups)

    spawner = c.GPUKubeSpawner if cluster else c.LocalGPUSpawner
    # Every server's extension asks the gpulease service for its notices, and
    # pushes its kernel state there for the culler, with the server's own
    # token, which therefore may reach that service: directly, not through the
    # proxy, which routes the service by its subdomain (a name a pod cannot
    # resolve). A pod's 127.0.0.1 is its own: it reaches the hub's Service.
    service_url = service_direct_url(s, s.service_host if cluster else s.internal_host)
    spawner.environment = {
        "GPULEASE_SERVICE_URL": service_url,
        "JUPYTERHUB_ACTIVITY_INTERVAL": "60",  # the culler's user-activity signal, per minute
    }
    spawner.server_token_scopes = [
        "users:activity!user", "access:servers!server", f"access:services!service={SERVICE_NAME}",
    ]
    spawner.db_url = s.db_url
    spawner.inventory_file = s.inventory_file
    spawner.catalog_file = s.catalog_file
    spawner.node_name = s.node_name
    if cluster:
        spawner.namespace = s.cluster_namespace
    else:  # what only the embedded box has: its state folder, accounts, cgroups
        spawner.state_dir = str(s.state.root)
        for key in ("unix_accounts", "unix_prefix", "unix_uid_min", "unix_uid_max",
                    "unix_hub_id", "adopt_unmarked_accounts",
                    "resource_limits", "device_control", "device_nodes", "server_env",
                    "warm_start", "sandbox", "server_log_max_bytes", "server_log_keep"):
            if key in s.isolation:
                setattr(spawner, key, s.isolation[key])
    # A queued spawn is still a pending start for JupyterHub: its start_timeout
    # must outlast the wait, and its concurrent_spawn_limit count the queue.
    spawner.queue_max_wait = float(s.queue_max_wait_s)
    spawner.queue_max_length = s.queue_max_length
    spawner.queue_places_per_user = s.queue_places_per_user
    spawner.failed_start_limit = s.failed_start_limit
    spawner.failed_start_window = s.failed_start_window_s
    spawner.spot_grace_period = s.spot_grace_s
    spawner.cpu_only_cpu_per_user = s.cpu_only_cpu_per_user
    spawner.cpu_only_memory_per_user = s.cpu_only_memory_per_user
    spawner.start_timeout = s.queue_max_wait_s + NORMAL_START_S
    hub.concurrent_spawn_limit = s.queue_max_length + NORMAL_CONCURRENT_SPAWNS
    return c
