"""The 'servers stuck pending' signal: admitted spawns not ready yet, and the oldest's age."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from gpulease.spawners.queueing import pending as pending_spawns
from gpulease.spawners.queueing.pending import PendingSpawnsCollector, pending_ages, register


class FakeSpawner:
    def __init__(self, admitted_at: float | None, pending: str | None):
        self.gpulease_admitted_at = admitted_at
        self.pending = pending


def test_only_admitted_spawns_still_pending_count():
    spawners = [FakeSpawner(100.0, "spawn"),  # admitted, starting: counted
                FakeSpawner(None, "spawn"),  # queued or refused before admission
                FakeSpawner(50.0, None),  # admitted long ago, ready since
                FakeSpawner(90.0, "stop")]  # stopping
    assert pending_ages(spawners, now=160.0) == [60.0]


def test_the_collector_reports_the_count_and_the_oldest(monkeypatch):
    monkeypatch.setattr(pending_spawns, "_spawners", pending_spawns.weakref.WeakSet())
    now = time.monotonic()
    kept = [FakeSpawner(now - 700, "spawn"), FakeSpawner(now - 5, "spawn"),
            FakeSpawner(None, "spawn")]
    for spawner in kept:
        register(spawner)
    registry = CollectorRegistry()
    registry.register(PendingSpawnsCollector())
    text = generate_latest(registry).decode()
    assert "gpulease_admitted_spawns_pending 2.0" in text
    oldest = float(text.split("\ngpulease_admitted_spawn_pending_seconds ")[1].split()[0])
    assert 700 <= oldest < 760
    del kept  # a spawner the hub forgot is not counted
    assert "gpulease_admitted_spawns_pending 0.0" in generate_latest(registry).decode()
