"""`gpulease up`: JupyterHub, configured as gpulease's embedded hub.

`GPULeaseHub` is JupyterHub with gpulease's options (state folder, profiles,
inventory, admin) and defaults laid under the user's config file and command
line. It prepares the state folder, creates the first-run admin, applies the
profiles file, checks the inventory, and after JupyterHub has restored its
servers, reconciles the recorded device assignments with what still runs.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from jupyterhub import orm
from jupyterhub.app import JupyterHub
from jupyterhub.app import aliases as hub_aliases
from tornado.httpserver import HTTPServer
from traitlets import Dict, default

from gpulease.core.billing.rules import BillingError
from gpulease.core.model.catalog import CatalogError
from gpulease.core.model.inventory import InventoryError
from gpulease.core.model.profiles import SAMPLE_PROFILES, ProfileError
from gpulease.core.policy.user_names import outside_the_rule, rename_hint
from gpulease.core.tiers import register_all
from gpulease.core.units import parse_duration
from gpulease.host.state import (
    StateError,
    default_state_root,
    keep_crypt_key,
    prepare_state_dir,
    read_or_create_secret,
    write_cli_file,
)
from gpulease.host.unix_accounts import UnixAccountError
from gpulease.hub.auth.github import GPULeaseGitHubAuthenticator
from gpulease.hub.auth.local import LocalAccountsAuthenticator
from gpulease.hub.auth.oauth import ProviderSignIn
from gpulease.hub.auth.oidc import GPULeaseOIDCAuthenticator
from gpulease.hub.auth.rights_groups import refuse_unproducible_groups
from gpulease.hub.billing.metering import Meter
from gpulease.hub.config import sandbox_setup
from gpulease.hub.config.app_options import GPULeaseOptions
from gpulease.hub.config.cluster_shape import banner_lines as cluster_banner
from gpulease.hub.config.cluster_shape import (
    cluster_spawner_classes,
    require_kubespawner,
    resolve_namespace,
    spawner_nodes,
)
from gpulease.hub.config.host_at_start import HostAtStart
from gpulease.hub.config.hub_config import (
    SERVICE_NAME,
    HubSettings,
    hub_config,
    hub_page_handlers,
    notify_environment,
    parse_service_address,
    project_chp,
)
from gpulease.hub.config.isolation_check import (
    decide,
    reachability_error,
    server_env_paths,
    unreachable,
)
from gpulease.hub.config.server_env import ServerEnvError
from gpulease.hub.config.server_env import choose as choose_server_env
from gpulease.hub.servers.interrupted_start import with_interruptible_starts
from gpulease.hub.servers.notifier import Notifier, announce, backends_from_env
from gpulease.hub.servers.queue_resume import resume_then_serve
from gpulease.hub.servers.tasks import HubTasks, prune_audit
from gpulease.hub.web import canonical_host
from gpulease.hub.web.body_budget import BudgetedHTTPServer
from gpulease.hub.web.hub_user_api import with_checked_names
from gpulease.hub.web.named_servers import refusing_limit
from gpulease.hub.web.origins import OriginError, is_loopback, plan_origins
from gpulease.spawners.context import get_context
from gpulease.spawners.local.cgroups import HostReader, choose_mechanism
from gpulease.spawners.local.spawner import LocalGPUSpawner, prestart_warm_launcher
from gpulease.spawners.local.warm_start import close_all as close_warm_launchers
from gpulease.spawners.nvml_metrics import register_gpu_temperatures
from gpulease.store.accounts import AccountError, ensure_first_admin
from gpulease.store.audit import RetentionError, parse_retention

gpulease_aliases = {
    **hub_aliases,
    "state": "GPULeaseHub.state_dir",
    "profiles": "GPULeaseHub.profiles_file",
    "inventory": "GPULeaseHub.inventory_file",
    "catalog": "GPULeaseHub.catalog_file",
    "admin": "GPULeaseHub.admin_name",
    "config": "GPULeaseHub.config_file",
    "subdomain-host": "JupyterHub.subdomain_host",
    "f": "GPULeaseHub.config_file",
}


TOKEN_MAX_DAYS = 90  # the longest an API token lives (JupyterHub.token_expires_in_max_seconds)
# Request bodies to the hub itself (its API, login and spawn pages): JupyterHub's HTTP
# server takes tornado's 100 MB default, buffered in the hub's memory before any login
# is checked. Its largest bodies (a bulk user add) are far smaller.
HUB_MAX_BODY_BYTES = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GPULeaseHub(GPULeaseOptions, HostAtStart, JupyterHub):
    """The embedded gpulease hub (its own options: gpulease.hub.config.app_options)."""

    name = "gpulease"
    description = "gpulease: GPU notebooks on JupyterHub, billed by the millisecond."
    aliases = Dict(gpulease_aliases)

    @default("ip")
    def _default_ip(self):
        return "127.0.0.1"

    @default("bind_url")
    def _bind_url_default(self):
        # Loopback unless told otherwise: a lab exposes the hub on purpose, with --ip.
        return ("https" if self.ssl_cert else "http") + "://127.0.0.1:8000"

    @default("state_dir")
    def _default_state_dir(self):
        return os.environ.get("GPULEASE_STATE") or str(default_state_root(
            Path.cwd(), accounts_must_reach=os.geteuid() == 0 and self.per_user_accounts
            and self.shape == "embedded"))

    @default("profiles_file")
    def _default_profiles_file(self):
        return str(SAMPLE_PROFILES)

    @default("node_name")
    def _default_node_name(self):
        return socket.gethostname().split(".")[0] or "local"

    @default("classes")
    def _gpulease_classes(self):
        return [*super()._load_classes(), LocalGPUSpawner, *cluster_spawner_classes(),
                LocalAccountsAuthenticator, GPULeaseOIDCAuthenticator,
                GPULeaseGitHubAuthenticator]

    @default("token_expires_in_max_seconds")
    def _token_expiry_default(self):
        # API tokens (VS Code's, scripts') expire: asked without an expiry, they get this.
        return TOKEN_MAX_DAYS * 86400

    @property
    def _cluster(self) -> bool:
        return self.shape == "cluster"

    def load_config_file(self, *args, **kwargs):
        """Lay gpulease's defaults under the user's config file and command line."""
        if self.config_file:
            super().load_config_file(self.config_file)
        try:
            self._prepare()
        except (StateError, ProfileError, InventoryError, CatalogError, BillingError,
                RetentionError, UnixAccountError, AccountError, OriginError, OSError,
                sandbox_setup.SandboxSetupError, ValueError) as e:
            problems = str(e).strip().replace("\n", "\n  ")
            print(f"gpulease: cannot start:\n  {problems}", file=sys.stderr)
            self.exit(1)
        base = hub_config(self._settings)
        base.merge(self.config)
        self.update_config(base)

    def _prepare(self) -> None:
        self._audit_retention = parse_retention(self.audit_retention)
        # Before the profiles are read: their tiers' price fields are keys of theirs.
        try:
            register_all(self.extra_tiers)
        except ValueError as e:
            raise StateError(f"GPULeaseHub.extra_tiers: {e}") from None
        # First: a hub that would serve users' servers unsafely starts nothing.
        self._origins = plan_origins(
            scheme="https" if self.ssl_cert else "http", ip=self.ip, port=self.port,
            base_url=self.base_url, subdomain_host=self.subdomain_host,
            public_url=self.public_url, allow_shared_origin=self.allow_shared_origin,
            cluster=self._cluster)
        namespace = ""
        if self._cluster:
            require_kubespawner()
            namespace = resolve_namespace(self.cluster_namespace, self.config)
            if self.inventory_file:
                self.log.warning("GPULeaseHub.inventory_file is ignored in the cluster shape: "
                                 "the inventory is the cluster's nodes")
        state = prepare_state_dir(self.state_dir, homes=not self._cluster)
        self._state = state
        self.log.info("State folder: %s", state.root)
        db_url = self.billing_db_url or state.gpulease_db_url
        inventory_file = "" if self._cluster else self.inventory_file
        ctx = get_context(db_url, inventory_file, self.catalog_file, self.node_name)
        if not self._cluster and ctx.inventory.source == "none" and not inventory_file:
            from gpulease.core.model.inventory import DEMO_INVENTORY

            inventory_file = str(DEMO_INVENTORY)
            ctx = get_context(db_url, inventory_file, self.catalog_file, self.node_name)
        self._ctx = ctx
        # Before any write: a second hub on this database stops here.
        if ctx.meter is None:
            ctx.meter = Meter(ctx.engine, heartbeat_s=self.heartbeat_interval)
        # The hub's own notices (credit low, a cap's stop, a queued server that started, a
        # preemption) are posted and sent through this; the backends, read at each call, are
        # configured further down.
        self._notify_backends: dict[str, Notifier] = {}
        ctx.meter.announce = lambda *notice: announce(ctx.notices, self._notify_backends,
                                                      *notice)
        ctx.meter.acquire_lease()
        # Spawns the previous hub left queued start again once this one is up (start()).
        self._left_queued = ctx.queue.rows()
        if self._left_queued:
            self.log.info("%d spawns left queued by the previous hub: they start again, in "
                          "their order, once the hub is up", len(self._left_queued))
        if not self._cluster:
            self.log.info("GPU inventory: %s", ctx.inventory.label)
        if ctx.inventory.source == "nvml":  # the box's GPU temperatures on /hub/metrics
            register_gpu_temperatures(ctx.inventory.nodes[0].name)
        applied = ctx.profiles.apply_file_if_changed(self.profiles_file)
        if applied is not None:
            self.log.info("Applied profiles file %s: %s", self.profiles_file, applied)
        prune_audit(ctx, self._audit_retention, self.log)
        self._first_admin_password = ensure_first_admin(
            ctx.accounts, self.admin_name, os.environ.get("GPULEASE_ADMIN_PASSWORD") or None
        )
        # The cluster's pods are kept apart by Kubernetes (docs/cluster.md), not here.
        self._isolation = None if self._cluster else self._check_isolation(state, ctx)
        cli_token = read_or_create_secret(state.private / "cli_token")
        keep_crypt_key(state)
        try:
            service_host, service_port = parse_service_address(self.service_address)
        except ValueError as e:
            raise StateError(str(e)) from None
        service_port = service_port or _free_port()
        self._sandbox = self._setup_sandbox(state, service_port)
        if service_host == "127.0.0.1":  # where the servers' namespaces reach it
            service_host = self._sandbox.host_address
        self._settings = HubSettings(
            state=state,
            db_url=db_url,
            inventory_file=inventory_file,
            catalog_file=self.catalog_file,
            node_name=self.node_name,
            admin_name=self.admin_name,
            service_port=service_port,
            service_host=service_host,
            service_listen=(service_host if service_host in ("127.0.0.1",
                                                             self._sandbox.host_address)
                            else ""),
            internal_host=self._sandbox.host_address,
            cli_token=cli_token,
            proxy_token=read_or_create_secret(state.private / "proxy_token"),
            chp_command=project_chp(),
            admin_groups=tuple(self.admin_groups),
            auditor_groups=tuple(self.auditor_groups),
            notify_webhook_url=self.notify_webhook_url, smtp_host=self.smtp_host,
            smtp_port=self.smtp_port, smtp_from=self.smtp_from,
            smtp_starttls=self.smtp_starttls, smtp_username=self.smtp_username,
            public_url=self._origins.public_url or self._public_url(),
            subdomain_host=self._origins.subdomain_host,
            cookie_host_prefix=self._origins.cookie_host_prefix,
            culler=self._culler_settings("cluster" if self._cluster else ctx.inventory.source),
            queue_max_wait_s=parse_duration(self.queue_max_wait, "queue_max_wait"),
            queue_max_length=self.queue_max_length,
            queue_places_per_user=self.queue_places_per_user,
            failed_start_limit=self.failed_start_limit, gpu_chart_step_s=self.gpu_chart_step,
            extra_tiers=tuple(self.extra_tiers),
            failed_start_window_s=parse_duration(self.failed_start_window,
                                                 "failed_start_window"),
            spot_grace_s=self.spot_grace_period,
            reservations_by_researchers=self.reservations_by_researchers,
            reservation_lead_s=parse_duration(self.reservation_lead_time,
                                              "reservation_lead_time"),
            cpu_only_cpu_per_user=self.cpu_only_cpu_per_user,
            cpu_only_memory_per_user=self.cpu_only_memory_per_user,
            isolation={} if self._isolation is None else {
                **self._isolation.settings(), "homes": str(state.homes),
                "server_env": self._server_env, "warm_start": self.warm_start,
                "sandbox": self._sandbox.spawner, **self._server_log_settings()},
            shape=self.shape, cluster_namespace=namespace,
            cluster_nodes=spawner_nodes(self.config) if self._cluster else {},
            kubeconfig=os.environ.get("KUBECONFIG", ""),
        )
        # Notices the hub posts itself (a queued server started) go out the same ways.
        self._notify_backends = backends_from_env({
            k: v if isinstance(v, str) else os.environ.get("GPULEASE_SMTP_PASSWORD", "")
            for k, v in notify_environment(self._settings).items()
        })

    def _check_isolation(self, state, ctx):
        """Decide how users are kept apart here; refuse to start when accounts could not work."""
        import pwd

        try:
            mechanism = choose_mechanism(HostReader().facts(), self.resource_limits)
        except ValueError as e:
            raise StateError(str(e)) from None
        plan = decide(
            is_root=os.geteuid() == 0, per_user_accounts=self.per_user_accounts,
            policy=self.unix_policy(state),
            mechanism=mechanism, hub_account=pwd.getpwuid(os.geteuid()).pw_name,
            device_nodes=self.device_nodes,
        )
        try:
            self._server_env, self._server_env_line = choose_server_env(
                self.server_env, accounts=plan.unix_accounts, state_root=state.root)
        except (ServerEnvError, OSError, subprocess.SubprocessError) as e:
            raise StateError(f"cannot make the servers' environment: {e}") from None
        if plan.unix_accounts:
            default = self._server_env or None
            envs = {image.local_env or default for image in ctx.catalog.images} | {default}
            problems = unreachable([*server_env_paths(envs),
                                    ("the homes folder", str(state.homes), False)])
            if problems:
                raise StateError(reachability_error(problems, str(state.root)))
        self.log.info(self._server_env_line)
        for line in plan.banner():
            self.log.info(line)
        return plan

    def _public_url(self) -> str:
        """Where the proxy serves users, for services that reach servers through it."""
        proto = "https" if self.ssl_cert else "http"
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0", "::") else self.ip
        host = f"[{host}]" if ":" in host else host
        return f"{proto}://{host}:{self.port}{self.base_url}"

    def _culler_settings(self, inventory_source: str) -> dict[str, str] | None:
        if not self.culler_enabled:
            return None
        # The cluster shape: a pod's GPU from dcgm-exporter through Prometheus (by its pod
        # labels), its CPU from metrics.k8s.io (unknown where no metrics server runs).
        prometheus = f"prometheus:{self.culler_prometheus_url}" if (
            self.culler_prometheus_url) else ""
        gpu = self.culler_gpu_source or prometheus or (
            "nvml" if inventory_source == "nvml" else "none")
        return {
            "port": str(_free_port()),
            "interval": str(self.culler_interval),
            "cpu_threshold": str(self.culler_cpu_threshold),
            "gpu_threshold": str(self.culler_gpu_threshold),
            "gpu_source": gpu,
            "cpu_source": "pod-metrics" if self.shape == "cluster" else "process",
            "warn_before": self.culler_warn_before,
            "stale_after": self.culler_stale_after,
            "readings_interval": str(self.culler_readings_interval),
        }

    def init_tornado_settings(self):
        super().init_tornado_settings()
        # A named server beyond the limit is refused with 409 naming it (JupyterHub: 400).
        settings = self.tornado_settings
        settings["named_server_limit_per_user"] = refusing_limit(
            settings.get("named_server_limit_per_user", 0))

    def init_tornado_application(self):
        super().init_tornado_application()
        if self.subdomain_host:  # page requests on another host name go to the hub's
            canonical_host.install(self.tornado_application, self.public_url,
                                   self.hub.base_url)

    def init_handlers(self):
        super().init_handlers()
        # First, ahead of JupyterHub's catch-all 404 (a subclass's own routes,
        # rather than the deprecated extra_handlers).
        self.handlers[:0] = self.add_url_prefix(self.hub_prefix,
                                                hub_page_handlers(self._settings))
        # Names outside gpulease's rule are refused before JupyterHub writes a row.
        self.handlers = with_checked_names(self.handlers)
        # A start a stop interrupts answers 409 saying so (JupyterHub's own: a bare 500).
        self.handlers = with_interruptible_starts(self.handlers)

    def _provider_names_aside(self) -> AbstractContextManager:
        """A sign-in provider's admin_users and allowed_users are its names, not hub
        users to make (ProviderSignIn.provider_names_aside)."""
        auth = self.authenticator
        return auth.provider_names_aside() if isinstance(auth, ProviderSignIn) else nullcontext()

    async def init_users(self):
        # Before JupyterHub's own pass, which logs each such user's add_user error.
        hub_names = [name for (name,) in self.db.query(orm.User.name)]
        for bad in outside_the_rule(hub_names, self._ctx.accounts.names()):
            self.log.warning(rename_hint(bad, str(self._state.homes)))
        with self._provider_names_aside():
            return await super().init_users()

    async def init_role_assignment(self):
        with self._provider_names_aside():  # it gives admin_users the admin role
            return await super().init_role_assignment()

    async def init_spawners(self):
        count = await super().init_spawners()
        ctx = self._ctx

        def running(user: str, server: str) -> bool:
            orm_user = orm.User.find(self.db, user)
            if orm_user is None:
                return False
            spawner = orm_user.orm_spawners.get(server)
            return spawner is not None and spawner.server is not None

        ctx.meter.recover(running)
        if self._cluster:  # no devices of this host: Kubernetes assigns them
            return count
        report = ctx.assignments.reconcile(ctx.inventory, running)
        for device, holder in report.gone:
            self.log.error(
                "Device %s, held by %s/%s, is no longer in the inventory (%s); "
                "it will not be handed out",
                device, holder.user, holder.server or "(default)", ctx.inventory.label,
            )
        return count

    async def start(self):
        # JupyterHub makes its HTTPServer in start() with no size option: set tornado's
        # default for it. A body declared larger is refused (400) before any of it is read,
        # one sent chunked is cut past the bound; what bodies over 16 KiB hold at once is
        # bounded too, each must arrive within a minute (gpulease.hub.web.body_budget).
        HTTPServer.configure(BudgetedHTTPServer, max_body_size=HUB_MAX_BODY_BYTES)
        self._refuse_taken_ports()
        refuse_unproducible_groups(self)  # GitHub: rights no stranger's organisation gets
        self._warm_line = "" if self._cluster else prestart_warm_launcher(self.config)
        if self._warm_line:
            self.log.info(self._warm_line)
        await super().start()
        self._tasks = HubTasks(
            self, self._ctx, heartbeat_s=self.heartbeat_interval,
            end_notice=parse_duration(self.reservation_end_notice, "reservation_end_notice"),
            audit_retention=self._audit_retention, embedded=not self._cluster, log=self.log)
        self._tasks.start()
        self._make_namespaces_ahead()
        self._resume_queue()
        urls = self._settings.urls
        write_cli_file(self._state, urls.hub_public, self._settings.cli_token,
                       service_url=urls.service())
        self._announce(urls.hub_public)

    def _resume_queue(self) -> None:
        """Start again what the previous hub left queued, now that the hub, its proxy and
        services are up: through the hub's REST API (gpulease.hub.servers.queue_resume says why)."""
        left, self._left_queued = getattr(self, "_left_queued", []), []
        token = self._service_map[SERVICE_NAME].api_token if left else ""
        self._resuming = resume_then_serve(self, self._ctx, left, token, self.log,
                                           embedded=not self._cluster)

    async def cleanup(self):
        meter = self._ctx.meter if getattr(self, "_ctx", None) else None
        if getattr(self, "_tasks", None):
            self._tasks.stop()
        if meter is not None:
            meter.shutting_down = True
        if getattr(self, "_ctx", None):  # what waits in the queue stays, for the next hub
            self._ctx.queue.keep_rows()
        await super().cleanup()
        close_warm_launchers()
        self._remove_sandbox_network()
        if meter is not None:
            await asyncio.to_thread(meter.release_lease)  # a write: may wait for the lock

    def _announce(self, url: str) -> None:
        if self._isolation is None:  # the cluster shape
            lines = [f"gpulease is running at {url}",
                     *cluster_banner(self._settings.cluster_namespace, self.config),
                     f"State folder: {self._state.root} (databases and secrets in private/)"]
        else:
            lines = [f"gpulease is running at {url}",
                     f"GPU inventory: {self._ctx.inventory.label}",
                     f"State folder: {self._state.root} (databases and secrets in private/, "
                     f"homes in {self._state.homes}/<user>)", self._server_env_line,
                     *self._isolation.banner(), *self._sandbox.lines, self._warm_line]
        if self._origins.warning:
            lines.append(self._origins.warning)
        if self._first_admin_password:
            lines.append(
                f"First-run admin: user '{self.admin_name}', password "
                f"'{self._first_admin_password}' (shown once; change it or keep it safe)"
            )
        if not self.ssl_cert and not is_loopback(self.ip):
            lines.append(
                f"WARNING: listening on {self.ip or 'all interfaces'} without TLS: passwords and "
                "tokens cross the network in clear text. Use --ssl-cert/--ssl-key or a TLS proxy."
            )
        banner = "\n".join(lines)
        print(banner, flush=True)
        self._first_admin_password = None


main = GPULeaseHub.launch_instance
