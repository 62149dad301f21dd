"""The culler's Prometheus metrics, in a registry of its own (one per Culler)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CullerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # An own registry, not the global one: tests build many cullers in one
        # process, and the hub's metrics are not ours to mix with.
        self.registry = registry or CollectorRegistry()
        self.cpu = Gauge("gpulease_server_cpu_percent",
                         "CPU of a server's processes, percent of one core (last pass)",
                         ["user", "server"], registry=self.registry)
        self.gpu = Gauge("gpulease_server_gpu_percent",
                         "Compute utilisation of a server's busiest GPU device (last pass)",
                         ["user", "server"], registry=self.registry)
        self.actions = Counter("gpulease_culler_actions",
                               "Decisions of the idle culler, by action",
                               ["action"], registry=self.registry)
        self.pass_seconds = Histogram(
            "gpulease_culler_pass_seconds", "Duration of one culler pass over all servers",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=self.registry)
        self.last_pass = Gauge(
            "gpulease_culler_last_pass_timestamp_seconds",
            "When the culler's last pass over the servers ended (Unix time): an alert fires "
            "when it is old", registry=self.registry)
        # Each server's labelled children, cached: labels() costs a lock and a lookup.
        self._children: dict[tuple[str, str], list] = {}

    def server(self, user: str, server: str, cpu: float | None, gpu: float | None) -> None:
        """Set one server's gauges; an unknown value is left out rather than shown as 0."""
        children = self._children.setdefault((user, server), [None, None])
        for i, (gauge, value) in enumerate(((self.cpu, cpu), (self.gpu, gpu))):
            if value is None:
                if children[i] is not None:
                    gauge.remove(user, server)
                    children[i] = None
            else:
                if children[i] is None:
                    children[i] = gauge.labels(user=user, server=server)
                children[i].set(value)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop the series of servers no longer running."""
        for key in set(self._children) - keep:
            for gauge, child in zip((self.cpu, self.gpu), self._children.pop(key), strict=True):
                if child is not None:
                    gauge.remove(*key)
