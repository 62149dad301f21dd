"""The embedded queue's preemption passes (spawners/queue_runner.py with
spawners/spot_preemption.py) on a real database: what the attack on the spot tier found."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import yaml

from gpulease.hub.context import GPULeaseContext
from gpulease.hub.db import utcnow
from gpulease.hub.metering import Meter
from gpulease.spawners.placement import DeviceRequest
from gpulease.spawners.queue_runner import QueueRunner

SLICE = DeviceRequest("H200", "1g.18gb")


@pytest.fixture
def ctx(db_url, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "n", "gpus": [
        {"model": "H200", "mig": ["1g.18gb", "1g.18gb"]}]}]}))
    c = GPULeaseContext(db_url, str(inventory))
    c.meter = Meter(c.engine)
    yield c
    c.engine.dispose()


def _running(ctx, user: str, tier: str, started: dt.datetime) -> None:
    ctx.assignments.claim(user, "", "slice", SLICE, ctx.inventory)
    ctx.meter.open(user, "", "slice", f"user:{user}", 360_000, started, tier)


async def _until(condition, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_a_cancelled_on_demand_start_does_not_leave_a_spot_server_preempted(ctx):
    """Attack: queue an on-demand start (a spot server is told it is preempted), then
    cancel it: nobody needs the slice, and the spot server must keep running."""
    now = utcnow()
    _running(ctx, "sam", "spot", now - dt.timedelta(minutes=10))
    _running(ctx, "sue", "spot", now - dt.timedelta(minutes=5))
    runner = QueueRunner(ctx, poll_s=60)
    runner.spot_grace_s = 60
    waiter = asyncio.ensure_future(runner.admit("mallory", "", "slice", SLICE, max_wait=30))
    await _until(lambda: bool(ctx.meter.preempting) and ctx.notices.active("sue"))
    assert set(ctx.meter.preempting) == {("sue", "")}
    assert [n.kind for n in ctx.notices.active("sue")] == ["preemption_warning"]
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # the pass after it left takes it back, and the notice with it
    await _until(lambda: not ctx.meter.preempting and not ctx.notices.active("sue"))


async def test_a_start_placed_in_the_same_pass_does_not_hide_the_need_to_preempt(ctx):
    """Attack: the pass that placed bob counted the slice it gave him as free for cy, so
    nobody was preempted for cy until the next poll."""
    now = utcnow()
    _running(ctx, "ada", "on-demand", now - dt.timedelta(minutes=10))
    ctx.assignments.claim("sue", "", "slice", SLICE, ctx.inventory)  # starting: no session yet
    runner = QueueRunner(ctx, poll_s=60)
    runner.spot_grace_s = 60
    bob = asyncio.ensure_future(runner.admit("bob", "", "slice", SLICE, max_wait=30))
    await _until(lambda: runner.position("bob", "") == 1)
    cy = asyncio.ensure_future(runner.admit("cy", "", "slice", SLICE, max_wait=30))
    await _until(lambda: runner.position("cy", "") == 2)
    await asyncio.sleep(0.2)
    ctx.meter.open("sue", "", "slice", "user:sue", 360_000, now - dt.timedelta(minutes=5), "spot")
    ctx.assignments.release("ada", "", "user")
    ctx.meter.close("ada", "", "user")
    await runner.serve()
    assert (await asyncio.wait_for(bob, 5)).queued
    assert runner.position("cy", "") == 1
    assert ("sue", "") in ctx.meter.preempting, "cy waits, sue's slice is the only room"
    cy.cancel()
    await asyncio.gather(cy, return_exceptions=True)


async def test_a_spot_start_that_waited_is_refused_if_spot_was_withdrawn_meanwhile():
    """Attack: a spot start queued before its user left the spot groups (or before the
    admin removed the spot price) started on spot after its wait."""
    from dataclasses import replace
    from types import SimpleNamespace

    from gpulease.hub.options import SPOT, ServerChoice
    from gpulease.hub.refusal import Refusal
    from gpulease.spawners.spawn_core import GPULeaseSpawnCore
    from tests.test_queue_resume import SLICE as PROFILE

    profile = replace(PROFILE, spot_price_per_hour_ucr=100_000, spot_groups=("lab",))
    choice = ServerChoice(profile, None, "user:eve", "request", SPOT)

    async def attempt(groups: set[str], now_profile):
        refused, given_back = [], []

        async def groups_now():
            return groups

        class _Runner:
            async def give_back(self, user, server):
                given_back.append((user, server))

        def refuse(refusal: Refusal):
            refused.append(refusal)
            raise RuntimeError(refusal.message)

        fake = SimpleNamespace(
            _groups_now=groups_now, _queue_runner=lambda: _Runner(), refuse=refuse,
            user=SimpleNamespace(name="eve"), name="",
            gpulease=SimpleNamespace(profiles=SimpleNamespace(get=lambda slug: now_profile)))
        try:
            await GPULeaseSpawnCore._still_usable_after_waiting(fake, choice)
        except RuntimeError:
            pass
        return refused, given_back

    refused, given_back = await attempt({"researchers"}, profile)  # left the group
    assert given_back == [("eve", "")] and refused[0].status == 403
    assert "only for members of group(s) lab" in refused[0].message
    refused, given_back = await attempt({"lab"}, replace(profile, spot_price_per_hour_ucr=None))
    assert given_back == [("eve", "")] and "no longer offers spot" in refused[0].message
    assert await attempt({"lab"}, profile) == ([], [])  # still theirs: it starts


def test_a_pending_preemption_survives_a_hub_restart(engine):
    """Attack: a restart forgot the deadline: the queued on-demand start preempted the
    same server again, with a new deadline, billing it past the one it was told."""
    from gpulease.spawners.spot_preemption import _record

    meter = Meter(engine)
    meter.open("sue", "", "slice", "user:sue", 360_000, utcnow() - dt.timedelta(minutes=5), "spot")
    deadline = utcnow().replace(microsecond=0) + dt.timedelta(seconds=120)
    why = "preempted for odin's on-demand start"
    assert meter.preempt(("sue", ""), deadline, why)
    asyncio.run(_record(meter, ("sue", ""), deadline, why))
    again = Meter(engine)
    again.recover(lambda user, server: True)
    assert ("sue", "") in again.live
    assert again.preempting[("sue", "")].deadline == deadline
    assert again.preempting[("sue", "")].why == why
    # taken back: a further restart has none
    assert again.withdraw_preemption(("sue", ""))
    asyncio.run(_record(again, ("sue", ""), None))
    third = Meter(engine)
    third.recover(lambda user, server: True)
    assert ("sue", "") in third.live and ("sue", "") not in third.preempting
