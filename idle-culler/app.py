"""The `gpulease-culler` hub service: options, its tiny HTTP app (health, metrics), the loop.

The hub starts it as a managed service with JUPYTERHUB_API_TOKEN,
JUPYTERHUB_API_URL, JUPYTERHUB_SERVICE_URL and JUPYTERHUB_SERVICE_PREFIX set.
Options come from argv or from GPULEASE_CULLER_<OPTION> variables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from urllib.parse import urlparse

from jupyterhub.services.auth import HubAuthenticated
from jupyterhub.utils import url_path_join
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from gpulease.core.units import parse_duration
from gpulease.idle_culler.cpu import CpuSource, NoCpuSource, ProcessTreeCpuSource
from gpulease.idle_culler.culler import Culler, CullerConfig
from gpulease.idle_culler.gpu import (
    GpuActivitySource,
    NoGpuSource,
    NvmlGpuSource,
    PrometheusDcgmSource,
)
from gpulease.idle_culler.hubapi import HubClient
from gpulease.idle_culler.pod_metrics import PodMetricsCpuSource
from gpulease.idle_culler.service_notices import ServiceNotices
from gpulease.process_exit import end_process, exit_with_hub

log = logging.getLogger("gpulease.culler")
SERVICE_NAME = "gpulease-culler"


def parse_args(argv: list[str] | None = None, env: dict[str, str] | None = None):
    env = dict(os.environ if env is None else env)

    def default(name: str, fallback: str) -> str:
        return env.get(f"GPULEASE_CULLER_{name.upper().replace('-', '_')}", fallback)

    p = argparse.ArgumentParser(prog=SERVICE_NAME, description="gpulease's GPU-aware idle culler")
    p.add_argument("--interval", type=float, default=float(default("interval", "30")),
                   help="seconds between passes (default 30)")
    p.add_argument("--cpu-threshold", type=float, default=float(default("cpu-threshold", "10")),
                   help="percent of one core above which a server is busy (default 10)")
    p.add_argument("--gpu-threshold", type=float, default=float(default("gpu-threshold", "5")),
                   help="GPU compute percent above which a server is busy (default 5)")
    p.add_argument("--gpu-source", default=default("gpu-source", "nvml"),
                   help="nvml | prometheus:URL (dcgm-exporter; in the cluster shape a pod's "
                        "series by its pod and namespace labels) | none (default nvml)")
    p.add_argument("--cpu-source", default=default("cpu-source", "process"),
                   choices=["process", "pod-metrics", "none"],
                   help="process (embedded: the server's process tree) | pod-metrics (cluster: "
                        "metrics.k8s.io PodMetrics; unknown without a metrics server) | none")
    p.add_argument("--hub-url", default=default("hub-url", env.get("JUPYTERHUB_PUBLIC_URL", "")),
                   help="base URL under which /services/gpulease/ is reached (the embedded "
                        "hub gives the service's own address; never the servers)")
    p.add_argument("--concurrency", type=int, default=int(default("concurrency", "50")),
                   help="CPU and GPU readings in flight at once (default 50)")
    p.add_argument("--warn-before", type=parse_duration, default=default("warn-before", "5m"),
                   help="notice lead time, at most half a timeout (default 5m)")
    p.add_argument("--stale-after", type=parse_duration, default=default("stale-after", "3m"),
                   help="how long a server's pushed kernel state counts as current "
                        "(default 3m: three of gpulease.singleuser's 60 s heartbeats)")
    p.add_argument("--readings-interval", type=float,
                   default=float(default("readings-interval", "10")),
                   help="seconds between the running GPU servers' activity and memory "
                        "readings sent to the gpulease service (PUT api/gpu-readings), which "
                        "shows them to their researchers: 1 to 300, or 0 to turn them off "
                        "(default 10)")
    p.add_argument("--log-level", default=default("log-level", "INFO"),
                   help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    args = p.parse_args(argv)
    if args.readings_interval != 0 and not 1 <= args.readings_interval <= 300:
        # what the service takes: outside it, every push would be refused
        p.error(f"--readings-interval must be 0 (off) or 1 to 300 seconds, not "
                f"{args.readings_interval:g}")
    if not args.hub_url:
        p.error("--hub-url (or GPULEASE_CULLER_HUB_URL) is required: where /services/gpulease/ is")
    for name in ("warn_before", "stale_after"):  # defaults are not parsed by argparse
        if isinstance(getattr(args, name), str):
            setattr(args, name, parse_duration(getattr(args, name)))
    return args


def gpu_source(spec: str) -> GpuActivitySource:
    if spec == "nvml":
        return NvmlGpuSource()
    if spec.startswith("prometheus:"):
        return PrometheusDcgmSource(spec.removeprefix("prometheus:"))
    if spec == "none":
        return NoGpuSource()
    raise ValueError(f"unknown --gpu-source {spec!r}: nvml, prometheus:URL or none")


def cpu_source(spec: str) -> CpuSource:
    if spec == "process":
        return ProcessTreeCpuSource()
    if spec == "pod-metrics":
        return PodMetricsCpuSource()
    return NoCpuSource()


MAX_BODY_BYTES = 1024  # the culler's own pages are GETs


class HealthHandler(web.RequestHandler):
    def initialize(self, culler: Culler) -> None:
        self.culler = culler

    def get(self) -> None:
        from gpulease import __version__

        body: dict = {"service": SERVICE_NAME, "version": __version__, "last_pass": None}
        if self.culler.last_pass is not None:
            when, report = self.culler.last_pass
            body["last_pass"] = {"at": when.isoformat().replace("+00:00", "Z"),
                                 "seconds": round(report.seconds, 3),
                                 "servers": len(report.decisions), "errors": len(report.errors)}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class MetricsHandler(HubAuthenticated, web.RequestHandler):
    """Prometheus text format. Names users, so it needs a token with access to this service."""

    def initialize(self, culler: Culler, public: bool = False) -> None:
        self.culler, self.public = culler, public

    def get(self) -> None:
        if not self.public and not self.get_current_user():
            raise web.HTTPError(403, "a token with access to this service is required")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.culler.metrics.registry))


def make_app(culler: Culler, prefix: str, *, public_metrics: bool = False) -> web.Application:
    return web.Application([
        (url_path_join(prefix, "metrics"), MetricsHandler,
         {"culler": culler, "public": public_metrics}),
        (prefix.rstrip("/") + "/?", HealthHandler, {"culler": culler}),
    ])


def build(args, env: dict[str, str]) -> Culler:
    config = CullerConfig(interval_s=args.interval, cpu_threshold=args.cpu_threshold,
                          gpu_threshold=args.gpu_threshold, concurrency=args.concurrency,
                          stale_after_s=float(args.stale_after), warn_before_s=args.warn_before,
                          readings_interval_s=args.readings_interval)
    hub = HubClient(env["JUPYTERHUB_API_URL"], args.hub_url, env["JUPYTERHUB_API_TOKEN"])
    return Culler(hub, cpu_source(args.cpu_source), gpu_source(args.gpu_source), config=config,
                  notices=ServiceNotices(hub))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="[%(levelname)s %(asctime)s gpulease-culler] %(message)s")
    env = dict(os.environ)
    culler = build(args, env)
    service_url = urlparse(env.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:0"))
    prefix = env.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{SERVICE_NAME}/")

    async def serve() -> None:
        app = make_app(culler, prefix,
                       public_metrics=env.get("GPULEASE_CULLER_PUBLIC_METRICS") == "1")
        # No handler takes a body; tornado's default would buffer 100 MB of one, from
        # anyone (through the hub's proxy, or a server on this host straight at the port).
        app.listen(service_url.port or 0, address=service_url.hostname or "127.0.0.1",
                   max_body_size=MAX_BODY_BYTES)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher = asyncio.create_task(exit_with_hub(os.getppid(), stop))
        log.info("gpulease-culler: every %ss, cpu > %g%% (%s), gpu > %g%% (%s), kernels as "
                 "pushed to the gpulease service at %s (current for %ss); GPU readings %s",
                 args.interval, args.cpu_threshold, args.cpu_source, args.gpu_threshold,
                 args.gpu_source, args.hub_url, args.stale_after,
                 f"every {args.readings_interval}s" if args.readings_interval > 0 else "off")
        try:
            await culler.run_forever(stop)
        finally:
            watcher.cancel()
            await culler.hub.close()
            if isinstance(culler.cpu, PodMetricsCpuSource):
                await culler.cpu.close()
        log.info("gpulease-culler stopped")

    asyncio.run(serve())
    end_process(0)  # stopped: skip Python's finalization (the hub waits for it)
