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
        self._labelled: set[tuple[str, str]] = set()

    def server(self, user: str, server: str, cpu: float | None, gpu: float | None) -> None:
        """Set one server's gauges; an unknown value is left out rather than shown as 0."""
        key = (user, server)
        for gauge, value in ((self.cpu, cpu), (self.gpu, gpu)):
            if value is None:
                try:
                    gauge.remove(user, server)
                except KeyError:
                    pass
            else:
                gauge.labels(user=user, server=server).set(value)
        self._labelled.add(key)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop the series of servers no longer running."""
        for user, server in self._labelled - keep:
            for gauge in (self.cpu, self.gpu):
                try:
                    gauge.remove(user, server)
                except KeyError:
                    pass
        self._labelled &= keep
