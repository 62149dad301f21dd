"""MetricsApiDouble: a TEST DOUBLE of the Kubernetes metrics API (metrics.k8s.io/v1beta1 PodMetrics).

The test cluster runs no metrics server (tests/cluster/ shows the culler's
CPU source against the real API server: unknown). This aiohttp server
stands for one, so the path where a metrics server exists is shown too,
through the real kubernetes_asyncio client: a PodMetricsList per namespace
as metrics-server answers it, or the error status the test sets. Used by
tests/integration/web/test_culler_sources.py; never outside tests. (No tests in here.)
"""

from __future__ import annotations

from aiohttp import web

from tests.support.prometheus_double import free_port


def pod_metrics(name: str, namespace: str, **cpu_by_container: str) -> dict:
    """One PodMetrics item, usage as metrics-server writes it (nanocores: '1234567n')."""
    return {"metadata": {"name": name, "namespace": namespace},
            "timestamp": "2026-12-01T10:00:00Z", "window": "15s",
            "containers": [{"name": c, "usage": {"cpu": cpu, "memory": "81920Ki"}}
                           for c, cpu in cpu_by_container.items()]}


class MetricsApiDouble:
    """`pods`: {namespace: [PodMetrics]}; `fail`: (status, body) answered instead."""

    def __init__(self) -> None:
        self.pods: dict[str, list[dict]] = {}
        self.fail: tuple[int, str] | None = None
        self.lists: list[str] = []  # the namespace of each list request
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _list(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        self.lists.append(namespace)
        if self.fail is not None:
            status, body = self.fail
            return web.Response(status=status, text=body)
        return web.json_response({"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
                                  "items": self.pods.get(namespace, [])})

    async def start(self) -> MetricsApiDouble:
        app = web.Application()
        app.router.add_get("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods", self._list)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
