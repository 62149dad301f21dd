"""The gpulease service's tornado application, configured from the hub's environment."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

from jupyterhub.utils import url_path_join
from tornado import web
from tornado.routing import Rule

from gpulease.core.tiers import register_all
from gpulease.hub.servers.notifier import backends_from_env
from gpulease.hub.service import body_limit, hub_static, openapi
from gpulease.hub.service.activity_store import ActivityStore
from gpulease.hub.service.api import (
    activity,
    audit,
    failed_starts,
    gpu,
    inventory,
    limits,
    recommend,
    reservations,
    right_sizing,
    server_logs,
    servers,
)
from gpulease.hub.service.api import billing as b
from gpulease.hub.service.api import notices as n
from gpulease.hub.service.api.profiles import ProfileHandler, ProfilesHandler
from gpulease.hub.service.api.users import UsersHandler
from gpulease.hub.service.base import NotFoundHandler, RootHandler
from gpulease.hub.service.cluster_source import source_from_env
from gpulease.hub.service.pages import admin as admin_pages
from gpulease.hub.service.pages import usage as pages
from gpulease.hub.web.body_budget import BudgetedHTTPServer
from gpulease.process_exit import end_process, exit_with_hub
from gpulease.site_urls import SiteURLs
from gpulease.spawners.context import get_context
from gpulease.store.failed_starts import DEFAULT_LIMIT, DEFAULT_WINDOW_S, Rationing

log = logging.getLogger("gpulease.service")
TEMPLATES = Path(__file__).parent / "templates"


def site_urls_from_env(env: dict[str, str]) -> SiteURLs:
    """The hub's public URLs as the hub gave them (hub_config: GPULEASE_PUBLIC_URL,
    GPULEASE_SUBDOMAIN_HOST); relative to the one origin when it gave none."""
    public = env.get("GPULEASE_PUBLIC_URL") or env.get("JUPYTERHUB_BASE_URL") or "/"
    return SiteURLs(public, env.get("GPULEASE_SUBDOMAIN_HOST", ""))


def make_app(env: dict[str, str] | None = None) -> web.Application:
    env = dict(os.environ if env is None else env)
    # The hub's GPULeaseHub.extra_tiers, before the profiles are read: their price
    # fields are profile keys (a tier the hub registered and this did not would drop
    # every profile that prices it).
    register_all(json.loads(env.get("GPULEASE_EXTRA_TIERS") or "[]"))
    prefix = env.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulease/")
    ctx = get_context(
        env["GPULEASE_DB_URL"],
        env.get("GPULEASE_INVENTORY_FILE", ""),
        env.get("GPULEASE_CATALOG_FILE", ""),
        env.get("GPULEASE_NODE_NAME", "local"),
    )
    args = dict(
        ctx=ctx,
        hub_api_url=env.get("JUPYTERHUB_API_URL", ""),
        hub_api_token=env.get("JUPYTERHUB_API_TOKEN", ""),
    )
    routes = [
        (r"", RootHandler),
        (r"api/inventory", inventory.InventoryHandler),
        (r"api/profiles", ProfilesHandler),
        (r"api/profiles/([^/]+)", ProfileHandler),  # a bad slug: 400 naming the rule
        (r"api/users", UsersHandler),
        (r"api/balance", b.BalanceHandler),
        (r"api/usage", b.UsageHandler),
        (r"api/credits", b.CreditsHandler),
        (r"api/adjustments", b.AdjustmentsHandler),
        (r"api/accounts/group:([^/]+)/caps/([^/]+)", b.CapHandler),
        (r"api/stop", b.StopHandler),
        (r"usage", pages.UsagePage),
        (r"admin/report", pages.ReportPage),
    ]
    for module in (audit, failed_starts, limits, servers, admin_pages, activity, inventory,
                   reservations, server_logs, gpu, right_sizing, recommend, openapi):
        routes += module.ROUTES
    # First: a body declared over the bound is refused before any route reads it.
    handlers: list = [Rule(body_limit.DeclaresTooMuch(), body_limit.BodyTooLargeHandler, args)]
    handlers += [(url_path_join(prefix, path), cls, args) for path, cls in routes]
    backends = backends_from_env(env)  # mail and webhook, as the admin configured them
    handlers += n.notice_routes(prefix, args, backends)
    handlers.append((url_path_join(prefix, "oauth_callback"), pages.OAuthCallbackPage, args))
    # JupyterHub's stylesheet for the pages, as the hub serves it (hub_static.py)
    handlers.append((url_path_join(prefix, hub_static.ROUTE), hub_static.HubStaticFile))
    handlers.append((url_path_join(prefix, "api/.*"), NotFoundHandler, args))
    return web.Application(
        handlers,
        # an address no route serves: a page saying so, not tornado's bare "404: Not Found"
        default_handler_class=pages.PageNotFound,
        default_handler_args=args,
        cookie_secret=os.urandom(32),
        xsrf_cookies=False,
        template_path=str(TEMPLATES),
        gpulease_prefix=prefix,
        # the notification backends: notices the service opens (right-sizing) are sent too
        gpulease_notify_backends=backends,
        # the hub's, this service's and servers' URLs (links across origins)
        gpulease_urls=site_urls_from_env(env),
        # how users are kept apart on this host (gpulease.hub.config.isolation_check)
        gpulease_isolation=json.loads(env.get("GPULEASE_ISOLATION") or "{}"),
        # what servers pushed of their kernels and terminals, for the culler
        gpulease_server_activity=ActivityStore(since=datetime.now(UTC)),
        # the cluster shape (GPULEASE_CLUSTER_NAMESPACE set): api/inventory's cluster form
        gpulease_cluster=source_from_env(env),
        # GPULeaseHub.reservations_by_researchers: researchers reserve for themselves
        gpulease_reservations_by_researchers=env.get("GPULEASE_RESERVATIONS_BY_RESEARCHERS")
        == "1",
        # GPULeaseHub.reservation_lead_time: sooner, a period fits beside running servers
        gpulease_reservation_lead_s=int(env.get("GPULEASE_RESERVATION_LEAD_S") or 86400),
        # GPULeaseHub.failed_start_limit and _window: the rationing api/failed-starts shows
        # the embedded box's state folder, where servers' own logs are (api/logs)
        gpulease_server_log_root=env.get("GPULEASE_SERVER_LOG_ROOT", ""),
        # GPULeaseHub.gpu_chart_step: seconds a point of the status panel's last hour
        gpulease_gpu_chart_step_s=int(env.get("GPULEASE_GPU_CHART_STEP_S") or 60),
        gpulease_failed_start_rule=Rationing(
            int(env.get("GPULEASE_FAILED_START_LIMIT") or DEFAULT_LIMIT),
            int(env.get("GPULEASE_FAILED_START_WINDOW_S") or DEFAULT_WINDOW_S)),
    )


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)s %(asctime)s gpulease-service] %(message)s"
    )
    port = int(os.environ.get("GPULEASE_SERVICE_PORT", "0"))
    # Loopback, unless the proxy runs in a pod of its own (GPULeaseHub.service_address).
    listen = os.environ.get("GPULEASE_SERVICE_LISTEN", "127.0.0.1")
    app = make_app()

    async def serve() -> None:
        # The backstop for bodies without a length (chunked): cut past the bound. And
        # bodies over 16 KiB held at once are bounded, each within a minute
        # (gpulease.hub.web.body_budget).
        server = BudgetedHTTPServer(app, max_body_size=body_limit.MAX_BODY_BYTES)
        server.listen(port, address=listen)
        log.info("gpulease service listening on %s:%d", listen or "every address", port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Ctrl-C on `gpulease up` reaches the whole process group; the hub
        # stops this service itself, so both signals just end it quietly.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher = asyncio.create_task(exit_with_hub(os.getppid(), stop))
        await stop.wait()
        watcher.cancel()
        log.info("gpulease service stopped")

    asyncio.run(serve())
    end_process(0)  # stopped: skip Python's finalization (the hub waits for it)
