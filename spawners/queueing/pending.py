"""How long admitted spawns have been pending, for the "servers stuck pending" alert.

A spawn waiting in the queue for capacity is pending by design (the queue's own
limits end it); one that was admitted — capacity counted for it — and still is not
ready after many minutes is stuck: a pod that never schedules or never pulls its
image, a server that never answers. Both shapes' spawners register here; a
collector reads them at each scrape of the hub's /hub/metrics.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

OLDEST = "gpulease_admitted_spawn_pending_seconds"
PENDING = "gpulease_admitted_spawns_pending"
_spawners: weakref.WeakSet = weakref.WeakSet()


def register(spawner: Any) -> None:
    """Count `spawner` (a GPULeaseSpawnCore) from now on; forgotten when it is."""
    _spawners.add(spawner)


def pending_ages(spawners: Any, now: float) -> list[float]:
    """Seconds since admission of each spawn still pending (admitted, not ready)."""
    return [now - s.gpulease_admitted_at for s in spawners
            if s.gpulease_admitted_at is not None and getattr(s, "pending", None) == "spawn"]


class PendingSpawnsCollector:
    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ages = pending_ages(list(_spawners), time.monotonic())
        yield GaugeMetricFamily(PENDING, "Spawns admitted (capacity counted for them) and "
                                "not ready yet", value=len(ages))
        yield GaugeMetricFamily(OLDEST, "Seconds the oldest admitted, not yet ready spawn has "
                                "been pending (0: none)", value=max(ages, default=0.0))


_registered = False


def register_collector() -> None:
    """Put the collector on the default registry (the one /hub/metrics serves), once."""
    global _registered
    if not _registered:
        from prometheus_client import REGISTRY

        REGISTRY.register(PendingSpawnsCollector())
        _registered = True
