"""PrometheusDouble: a TEST DOUBLE of Prometheus's HTTP API (`GET /api/v1/query`), for the culler.

No Prometheus, dcgm-exporter or GPU runs in the tests: this small aiohttp
server answers an instant query with the vector the test sets, labelled as
dcgm-exporter labels DCGM_FI_PROF_GR_ENGINE_ACTIVE (`UUID`, `gpu`,
`GPU_I_ID`, `GPU_I_PROFILE`, `Hostname`, and with its Kubernetes mapping
`namespace`, `pod`, `container`); a query for DCGM_FI_DEV_FB_USED and _FREE (the
culler's memory reading) gets `memory_series` instead. Used by tests/integration/web/test_culler_sources.py,
tests/integration/web/test_culler_pass.py and tests/cluster/test_culler_cluster.py; never
outside tests. (No tests in here.)
"""

from __future__ import annotations

import socket

from aiohttp import web

from gpulease.idle_culler.gpu import DCGM_FB_FREE, DCGM_FB_USED, DCGM_METRIC


def dcgm_series(uuid: str, ratio: float, *, gpu: int = 0, pod: str = "", namespace: str = "",
                container: str = "notebook", instance: int | None = None,
                profile: str = "", dra_claim: str = "", mig_uuid: str = "") -> dict:
    """One DCGM_FI_PROF_GR_ENGINE_ACTIVE sample (a ratio 0..1) as Prometheus returns it.

    `dra_claim`: the labels dcgm-exporter adds with KUBERNETES_ENABLE_DRA for a device of
    a DRA claim (NVIDIA/dcgm-exporter internal/pkg/transformation/const.go): the claim,
    NVIDIA's driver, its pool and device, and for a MIG device its profile and uuid (the
    series stays the parent GPU's UUID with the instance's GPU_I_ID)."""
    labels = {"__name__": DCGM_METRIC, "UUID": uuid, "gpu": str(gpu),
              "device": f"nvidia{gpu}", "Hostname": "gpu-node-1", "modelName": "NVIDIA H200"}
    if pod:  # dcgm-exporter leaves them empty, which Prometheus drops, for a device no pod holds
        labels |= {"namespace": namespace, "pod": pod, "container": container}
    if instance is not None:
        labels |= {"GPU_I_ID": str(instance), "GPU_I_PROFILE": profile or "1g.18gb"}
    if dra_claim:
        labels |= {"dra_claim_name": dra_claim, "dra_claim_namespace": namespace,
                   "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": "gpu-node-1",
                   "dra_device_name": f"gpu-{gpu}"}
        if instance is not None:
            labels |= {"dra_mig_profile": profile or "1g.18gb", "dra_mig_device_uuid": mig_uuid,
                       "dra_device_name": f"gpu-{gpu}-mig-1g18gb-19-{instance}"}
    return {"metric": labels, "value": [1741000000.0, repr(ratio)]}


def dcgm_fb_series(uuid: str, used_mib: float, free_mib: float, **labels) -> list[dict]:
    """The DCGM_FI_DEV_FB_USED and _FREE samples (MiB) of a device, labelled as
    `dcgm_series` labels its activity (same keyword arguments)."""
    out = []
    for name, mib in ((DCGM_FB_USED, used_mib), (DCGM_FB_FREE, free_mib)):
        series = dcgm_series(uuid, 0.0, **labels)
        series["metric"]["__name__"] = name
        series["value"] = [series["value"][0], repr(float(mib))]
        out.append(series)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrometheusDouble:
    """`series`: the vector answered; `memory_series`: that answered to a query naming the
    framebuffer metrics; `fail`: an HTTP status to answer instead (a broken one)."""

    def __init__(self, series: list[dict] | None = None,
                 memory_series: list[dict] | None = None) -> None:
        self.series = list(series or [])
        self.memory_series = list(memory_series or [])
        self.fail: int | None = None
        self.queries: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _query(self, request: web.Request) -> web.Response:
        self.queries.append(request.query.get("query", ""))
        if self.fail is not None:
            return web.json_response({"status": "error", "errorType": "internal",
                                      "error": "the test double was told to fail"},
                                     status=self.fail)
        query = request.query.get("query", "")
        result = self.memory_series if DCGM_FB_USED in query else self.series
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": result}})

    async def start(self) -> PrometheusDouble:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        """Prometheus goes away: its port refuses connections from now on."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> PrometheusDouble:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()
