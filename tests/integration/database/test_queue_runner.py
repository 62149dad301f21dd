"""The hub-side queue runner on a real database and a declared inventory, without a hub.

It is what LocalGPUSpawner.start awaits: limits, then devices now or a wait in
the queue, woken by releases (and a slow poll), bounded by queue_max_wait,
left on cancel.
"""

from __future__ import annotations

import asyncio

import pytest
import yaml

from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.policy.limits import Limit
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.queueing.runner import QueueRunner, Refused, queue_progress

SLICE = DeviceRequest("H200", "1g.18gb")
CARD = DeviceRequest("H200")
TWO = DeviceRequest("H200", count=2)


@pytest.fixture
def ctx(db_url, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "n", "gpus": [
        {"model": "H200", "mig": ["1g.18gb", "1g.18gb"]},
        {"model": "H200"}, {"model": "H200"},
    ]}]}))
    c = GPULeaseContext(db_url, str(inventory))
    yield c
    c.engine.dispose()


async def _admit(runner, user, request, server="", **kw):
    kw.setdefault("max_wait", 30)
    return await runner.admit(user, server, "p", request, **kw)


async def _until(cond, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_no_queueing_refuses_at_once_naming_what_is_free(ctx):
    runner = QueueRunner(ctx)
    await _admit(runner, "a", SLICE, max_wait=0)
    await _admit(runner, "b", SLICE, max_wait=0)
    with pytest.raises(Refused) as e:
        await _admit(runner, "c", SLICE, max_wait=0)
    assert e.value.status == 503
    assert "0 of 2 free" in e.value.message and "Free now: 2× H200 (full cards)" in e.value.message
    assert ctx.queue.rows() == []


async def test_never_fits_is_422_not_queued(ctx):
    with pytest.raises(Refused) as e:
        await _admit(QueueRunner(ctx), "a", DeviceRequest("H200", count=3))
    assert e.value.status == 422 and ctx.queue.rows() == []


async def test_a_queued_start_is_placed_when_a_device_is_released(ctx):
    runner = QueueRunner(ctx, poll_s=60)  # only the release event can wake it in time
    await _admit(runner, "a", SLICE)
    await _admit(runner, "b", SLICE)
    waiter = asyncio.ensure_future(_admit(runner, "c", SLICE, server="x"))
    await _until(lambda: runner.position("c", "x") == 1)
    events = queue_progress(runner, "c", "x", SLICE.describe(), lambda: not waiter.done(),
                            interval=0.02)
    first = await events.__anext__()
    assert first["message"] == "Waiting for a free H200 slice 1g.18gb: position 1 in the queue"
    assert [(r.user, r.server, r.position) for r in ctx.queue.rows()] == [("c", "x", 1)]
    assert ctx.queue.waiting_by_profile() == {"p": 1}
    released = ctx.assignments.release("a", "", "user")
    runner.released()
    admitted = await asyncio.wait_for(waiter, 5)
    assert admitted.queued and admitted.placement.uuids == tuple(released)
    assert ctx.assignments.devices_of("c", "x") == released
    assert ctx.queue.rows() == [] and runner.waiting == []
    rest = [e async for e in events]
    assert rest[-1]["message"] == "A free H200 slice 1g.18gb is yours; starting"


async def test_the_slow_poll_finds_releases_made_elsewhere(ctx):
    runner = QueueRunner(ctx, poll_s=0.1)
    await _admit(runner, "a", SLICE)
    await _admit(runner, "b", SLICE)
    waiter = asyncio.ensure_future(_admit(runner, "c", SLICE))
    await _until(lambda: runner.position("c", "") == 1)
    ctx.assignments.release("b", "", "user")  # no released() call
    assert (await asyncio.wait_for(waiter, 5)).queued


async def test_the_wait_is_bounded_and_leaves_no_row(ctx):
    runner = QueueRunner(ctx)
    await _admit(runner, "a", SLICE)
    await _admit(runner, "b", SLICE)
    with pytest.raises(Refused) as e:
        await _admit(runner, "c", SLICE, max_wait=0.3)
    assert e.value.status == 503 and "queue_max_wait" in e.value.message
    assert "Free now:" in e.value.message
    assert ctx.queue.rows() == [] and runner.waiting == []


async def test_a_cancelled_start_leaves_the_queue(ctx):
    runner = QueueRunner(ctx)
    await _admit(runner, "a", SLICE)
    await _admit(runner, "b", SLICE)
    waiter = asyncio.ensure_future(_admit(runner, "c", SLICE))
    await _until(lambda: runner.position("c", "") == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await _until(lambda: ctx.queue.rows() == [])
    assert runner.waiting == []
    # the slice freed later goes to nobody
    ctx.assignments.release("a", "", "user")
    runner.released()
    await asyncio.sleep(0.1)
    assert ctx.assignments.devices_of("c", "") == []


async def test_the_head_is_not_overtaken_by_what_would_delay_it(ctx):
    runner = QueueRunner(ctx, poll_s=60)
    await _admit(runner, "a", CARD)  # one of the two cards held
    head = asyncio.ensure_future(_admit(runner, "big", TWO))
    await _until(lambda: runner.position("big", "") == 1)
    small = asyncio.ensure_future(_admit(runner, "small", CARD))
    await _until(lambda: runner.position("small", "") == 2)
    # a slice delays nobody: it starts at once, ahead of both
    assert not (await _admit(runner, "sl", SLICE)).queued
    await asyncio.sleep(0.1)
    assert not small.done()  # the free card is kept for the head
    ctx.assignments.release("a", "", "user")
    runner.released()
    admitted = await asyncio.wait_for(head, 5)
    assert len(admitted.placement.uuids) == 2
    assert runner.position("small", "") == 1
    small.cancel()


async def test_limits_are_checked_before_queueing_and_count_queued_starts(ctx):
    runner = QueueRunner(ctx)
    ctx.limits.set("user:a", {"max_slices": 2})
    await _admit(runner, "a", SLICE, server="one")
    await _admit(runner, "b", SLICE)
    queued = asyncio.ensure_future(_admit(runner, "a", SLICE, server="two"))
    await _until(lambda: runner.position("a", "two") == 1)
    with pytest.raises(Refused) as e:
        await _admit(runner, "a", SLICE, server="three")
    assert e.value.status == 409
    assert "user:a" in e.value.message and "a/one" in e.value.message
    assert "a/two (queued)" in e.value.message
    queued.cancel()
    ctx.limits.set("group:lab", {"max_gpus": 1})
    await _admit(runner, "m1", CARD, user_groups=["lab"], group_members={"lab": ["m1", "m2"]})
    with pytest.raises(Refused) as e:
        await _admit(runner, "m2", CARD, user_groups=["lab"],
                     group_members={"lab": ["m1", "m2"]})
    assert e.value.status == 409 and "group:lab" in e.value.message and "m1/" in e.value.message
    assert ctx.limits.get("group:lab") == Limit("group:lab", 1, None)


async def test_a_user_holds_at_most_max_per_user_places_and_the_refusal_leaves_no_row(ctx):
    runner = QueueRunner(ctx)
    await _admit(runner, "a", SLICE)
    await _admit(runner, "b", SLICE)  # both slices held: the next slice start waits
    waiters = [asyncio.ensure_future(_admit(runner, "c", SLICE, server=s, max_per_user=3))
               for s in ("x", "y", "z")]
    await _until(lambda: len(runner.waiting) == 3)
    with pytest.raises(Refused) as e:
        await _admit(runner, "c", SLICE, server="w", max_per_user=3)
    assert e.value.status == 409 and "queue_places_per_user 3" in e.value.message
    assert "c/x, c/y, c/z" in e.value.message
    assert [(r.user, r.server) for r in ctx.queue.rows()] == [("c", "x"), ("c", "y"), ("c", "z")]
    other = asyncio.ensure_future(_admit(runner, "d", SLICE, max_per_user=3))  # others still queue
    await _until(lambda: runner.position("d", "") == 4)
    for waiter in [*waiters, other]:
        waiter.cancel()
    await _until(lambda: ctx.queue.rows() == [])
