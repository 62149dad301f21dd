"""Device assignments in the database: claim, release, reconcile, and the race.

Runs on SQLite and on PostgreSQL (the `engine` fixture). The race tests are
the reason this module exists: concurrent claims must never hand one device
to two servers, in one process or several.
"""

import logging
import multiprocessing
import threading
from collections import Counter

import pytest
from sqlalchemy import select

from gpulease.core.capacity.placement import NoFit, place
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import (
    DEMO_INVENTORY,
    Inventory,
    load_declared_inventory,
    parse_declared_inventory,
)
from gpulease.store import assignments as assignments_module
from gpulease.store.assignments import AssignmentStore, Holder, ReconcileReport
from gpulease.store.db import assignments, make_engine

SLICE = DeviceRequest("H200", "1g.18gb")
CARD = DeviceRequest("H200")
SLICES = {f"MIG-declared-local-0-{i}-1g.18gb" for i in range(7)}


@pytest.fixture
def demo() -> Inventory:
    return load_declared_inventory(DEMO_INVENTORY)


@pytest.fixture
def store(engine) -> AssignmentStore:
    return AssignmentStore(engine)


def test_claim_records_and_release_frees(store, demo):
    p = store.claim("alice", "", "h200-1g", SLICE, demo)
    assert p.uuids == ("MIG-declared-local-0-0-1g.18gb",)
    card = store.claim("bob", "big", "h200-full", CARD, demo)
    assert card.uuids == ("GPU-declared-local-1",)

    held = store.held()
    assert set(held) == {"MIG-declared-local-0-0-1g.18gb", "GPU-declared-local-1"}
    alice = held["MIG-declared-local-0-0-1g.18gb"]
    assert isinstance(alice, Holder)
    assert (alice.user, alice.server, alice.profile) == ("alice", "", "h200-1g")
    assert store.devices_of("bob", "big") == ["GPU-declared-local-1"]
    assert store.devices_of("bob", "") == []

    # The card is held: a second request for it is a 503 naming what is free.
    with pytest.raises(NoFit) as info:
        store.claim("carol", "", "h200-full", CARD, demo)
    assert info.value.status == 503
    assert "Free now: 6× H200 slice 1g.18gb" in info.value.message

    assert store.release("bob", "big", "user") == ["GPU-declared-local-1"]
    assert store.release("bob", "big", "user") == []  # idempotent
    assert store.claim("carol", "", "h200-full", CARD, demo).uuids == ("GPU-declared-local-1",)

    history = store.history()
    released = [h for h in history if h["user"] == "bob"]
    assert len(released) == 1 and released[0]["release_reason"] == "user"
    assert released[0]["released_at"] is not None
    assert history[0]["user"] == "carol"  # newest first
    assert len(store.history(limit=2)) == 2


def test_failed_claim_changes_nothing(store, demo):
    store.claim("alice", "s", "h200-full", CARD, demo)
    # A restart of alice/s with a profile that cannot fit: the transaction
    # rolls back, so her card is not released by the attempt.
    with pytest.raises(NoFit) as info:
        store.claim("alice", "s", "a100", DeviceRequest("A100-80GB"), demo)
    assert info.value.status == 422
    assert store.devices_of("alice", "s") == ["GPU-declared-local-1"]


def test_restart_replaces_a_servers_devices(store, demo):
    store.claim("alice", "s", "h200-full", CARD, demo)
    # The same server starting again (now on a slice) gives its card back first.
    p = store.claim("alice", "s", "h200-1g", SLICE, demo)
    assert store.devices_of("alice", "s") == list(p.uuids)
    assert "GPU-declared-local-1" not in store.held()
    # ... and restarting on the same card works although it "held" it.
    store.claim("alice", "s", "h200-full", CARD, demo)
    assert store.devices_of("alice", "s") == ["GPU-declared-local-1"]
    reasons = Counter(h["release_reason"] for h in store.history())
    assert reasons == {"restart": 2, None: 1}


def test_unique_index_collision_is_retried(store, demo, monkeypatch):
    store.claim("alice", "", "p", SLICE, demo)
    calls = []

    def place_blind_once(request, inventory, held, *_withheld, **_tier):
        # The first attempt "forgets" what is held, as a racing claim would:
        # the partial unique index rejects its insert and the claim retries.
        calls.append(set(held))
        return place(request, inventory, () if len(calls) == 1 else held)

    monkeypatch.setattr(assignments_module, "place_keeping_units", place_blind_once)
    p = store.claim("bob", "", "p", SLICE, demo)
    assert len(calls) == 2
    assert p.uuids == ("MIG-declared-local-0-1-1g.18gb",)
    assert set(store.held()) == {"MIG-declared-local-0-0-1g.18gb", "MIG-declared-local-0-1-1g.18gb"}


def test_endless_collisions_end_in_503(store, demo, monkeypatch):
    store.claim("alice", "", "p", SLICE, demo)
    monkeypatch.setattr(assignments_module, "place_keeping_units",
                        lambda r, inv, held, *_withheld, **_tier: place(r, inv, ()))
    with pytest.raises(NoFit) as info:
        store.claim("bob", "", "p", SLICE, demo)
    assert info.value.status == 503
    assert store.devices_of("bob", "") == []


def test_reconcile(store, demo):
    store.claim("alive", "", "p", SLICE, demo)        # slot 0
    store.claim("dead", "", "p", SLICE, demo)         # slot 1
    store.claim("alive", "big", "p", CARD, demo)      # the full card
    store.claim("dead", "x", "p", SLICE, demo)        # slot 2
    # The host comes back with GPU 1 gone and GPU 0's slot 2 gone.
    shrunk = parse_declared_inventory({"nodes": [{"name": "local", "gpus": [
        {"model": "H200", "mig": ["1g.18gb", "1g.18gb"]}]}]}, "shrunk")
    asked = []

    def running(user, server):
        asked.append((user, server))
        return user == "alive"

    report = store.reconcile(shrunk, running)
    assert isinstance(report, ReconcileReport)
    assert sorted(u for u, _ in report.kept) == ["GPU-declared-local-1", "MIG-declared-local-0-0-1g.18gb"]
    assert sorted(u for u, _ in report.released) == [
        "MIG-declared-local-0-1-1g.18gb", "MIG-declared-local-0-2-1g.18gb"]
    assert sorted((u, h.user, h.server) for u, h in report.gone) == [
        ("GPU-declared-local-1", "alive", "big"), ("MIG-declared-local-0-2-1g.18gb", "dead", "x")]
    assert len(asked) == len(set(asked)) == 4  # each server asked once

    # Still-held vanished card stays held: never handed out while its server runs.
    assert set(store.held()) == {"MIG-declared-local-0-0-1g.18gb", "GPU-declared-local-1"}
    reasons = {h["device_uuid"]: h["release_reason"] for h in store.history()}
    assert reasons["MIG-declared-local-0-1-1g.18gb"] == "server_died"
    assert reasons["MIG-declared-local-0-2-1g.18gb"] == "device_gone"

    # A second reconcile finds nothing more to release.
    again = store.reconcile(shrunk, running)
    assert again.released == [] and len(again.kept) == 2


def _race_engine(engine, size: int):
    # Each thread needs its own connection at once: a pool as big as the race.
    return make_engine(engine.url.render_as_string(hide_password=False),
                       pool_size=size, max_overflow=5)


def _claim_all(store: AssignmentStore, inventory: Inventory, users: list[str]) -> list:
    barrier = threading.Barrier(len(users))
    results: list = [None] * len(users)

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store.claim(users[i], "", "h200-1g", SLICE, inventory).uuids
        except NoFit as exc:
            results[i] = exc
        except Exception as exc:  # anything else fails the test below, visibly
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(users))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def _check_race(results: list, store: AssignmentStore) -> None:
    won = [r for r in results if isinstance(r, tuple)]
    lost = [r for r in results if not isinstance(r, tuple)]
    assert all(isinstance(r, NoFit) and r.status == 503 for r in lost), lost[:3]
    assert len(won) == 7 and len(lost) == len(results) - 7
    uuids = [u for (u,) in won]
    assert sorted(uuids) == sorted(SLICES)  # distinct, and exactly the seven slices
    assert set(store.held()) == SLICES
    with store.engine.connect() as conn:
        rows = conn.execute(select(assignments.c.device_uuid)).scalars().all()
    assert sorted(rows) == sorted(SLICES)  # no stray rows from losers or retries


def test_race_50_threads_for_7_slices(engine, demo, caplog):
    caplog.set_level(logging.WARNING, logger="gpulease.store.assignments")
    race = _race_engine(engine, 50)
    try:
        store = AssignmentStore(race)
        results = _claim_all(store, demo, [f"user{i}" for i in range(50)])
        _check_race(results, store)
    finally:
        race.dispose()
    # The lock (BEGIN IMMEDIATE, the advisory lock) serialises the claims, so
    # the unique index never had to reject one: no claim collided and retried.
    assert not [r.getMessage() for r in caplog.records if "collided" in r.getMessage()]


def _claim_in_process(url: str, first: int, count: int, barrier, queue) -> None:
    # Runs in a child process: its own engine, its own threads.
    engine = make_engine(url, pool_size=count, max_overflow=5)
    store = AssignmentStore(engine)
    inventory = load_declared_inventory(DEMO_INVENTORY)
    barrier.wait()
    results = _claim_all(store, inventory, [f"user{i}" for i in range(first, first + count)])
    queue.put([r if isinstance(r, tuple) else (type(r).__name__, getattr(r, "status", None))
               for r in results])
    engine.dispose()


def test_race_two_processes_sqlite(engine):
    if engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL serialises with an advisory lock; the threaded race covers it")
    # The hub, the gpulease service and the CLI are separate processes on one
    # SQLite file: the lock must hold across processes, not just threads.
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    url = engine.url.render_as_string(hide_password=False)
    procs = [ctx.Process(target=_claim_in_process, args=(url, first, 25, barrier, queue))
             for first in (0, 25)]
    for p in procs:
        p.start()
    results = [r for _ in procs for r in queue.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    won = [r for r in results if r[0].startswith("MIG-")]
    assert sorted(u for (u,) in won) == sorted(SLICES)
    assert sorted(results[i] for i in range(50) if results[i] not in won) == [("NoFit", 503)] * 43
    assert set(AssignmentStore(engine).held()) == SLICES
