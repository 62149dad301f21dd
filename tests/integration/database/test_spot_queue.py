"""The embedded queue's preemption passes (spawners/queueing/runner.py with
spawners/queueing/spot_preemption.py) on a real database: what the attack on the spot tier found."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import yaml

from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.hub.billing.metering import Meter
from gpulease.spawners.context import GPULeaseContext
from gpulease.spawners.queueing.runner import QueueRunner

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


async def _after_waiting(choice, groups: set[str], now_profile):
    """GPULeaseSpawnCore._still_usable_after_waiting for `choice`, with the user in `groups`
    and the profile now `now_profile`: (refusals, starts given back)."""
    from types import SimpleNamespace

    from gpulease.core.refusal import Refusal
    from gpulease.spawners.spawn_core import GPULeaseSpawnCore

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


async def test_a_spot_start_that_waited_is_refused_if_spot_was_withdrawn_meanwhile():
    """Attack: a spot start queued before its user left the spot groups (or before the
    admin removed the spot price) started on spot after its wait."""
    from dataclasses import replace

    from gpulease.core.policy.options import ServerChoice
    from gpulease.core.tiers import SPOT
    from tests.integration.database.test_queue_resume import SLICE as PROFILE

    profile = replace(PROFILE, spot_price_per_hour_ucr=100_000, spot_groups=("lab",))
    choice = ServerChoice(profile, None, "user:eve", "request", SPOT)
    refused, given_back = await _after_waiting(choice, {"researchers"}, profile)
    assert given_back == [("eve", "")] and refused[0].status == 403
    assert "only for members of group(s) lab" in refused[0].message
    refused, given_back = await _after_waiting(
        choice, {"lab"}, replace(profile, spot_price_per_hour_ucr=None))
    assert given_back == [("eve", "")] and "no longer offers spot" in refused[0].message
    assert await _after_waiting(choice, {"lab"}, profile) == ([], [])  # still theirs


@pytest.mark.parametrize("tier", ["on-demand", "spot"])
@pytest.mark.parametrize("change, says", [
    ({"groups": ("lab",)}, "restricted to group(s) lab, and you are no longer"),
    ({"enabled": False}, "was disabled while the start waited"),
    (None, "was deleted while the start waited"),
])
async def test_a_start_that_waited_is_refused_if_its_profile_changed_meanwhile(tier, change,
                                                                               says):
    """Second attack: the check read the profile as it was when the start was asked, so
    an admin restricting, disabling or deleting it while a start waited did not refuse
    it (and a spot refusal named no group)."""
    from dataclasses import replace

    from gpulease.core.policy.options import ServerChoice
    from tests.integration.database.test_queue_resume import SLICE as PROFILE

    profile = replace(PROFILE, spot_price_per_hour_ucr=100_000)
    choice = ServerChoice(profile, None, "user:eve", "request", tier)
    now = None if change is None else replace(profile, **change)
    refused, given_back = await _after_waiting(choice, {"physics"}, now)
    assert given_back == [("eve", "")] and refused[0].status == 403
    assert says in refused[0].message, refused[0].message
    assert refused[0].errors[0].field == "profile"


def test_a_pending_preemption_survives_a_hub_restart(engine):
    """Attack: a restart forgot the deadline: the queued on-demand start preempted the
    same server again, with a new deadline, billing it past the one it was told."""
    from gpulease.spawners.queueing.spot_preemption import _record

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


# --- found by a second attack: withdrawals, restarts and billing past the deadline -------

CARD = DeviceRequest("H200")


@pytest.fixture
def mixed(db_url, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"nodes": [{"name": "n", "gpus": [
        {"model": "H200", "mig": ["1g.18gb", "1g.18gb"]}, {"model": "H200"},
        {"model": "H200"}]}]}))
    c = GPULeaseContext(db_url, str(inventory))
    c.meter = Meter(c.engine)
    yield c
    c.engine.dispose()


def _restart_during_grace(ctx, deadline: dt.datetime) -> None:
    """sue (spot slice) was told she is preempted until `deadline`; the hub restarts."""
    why = "preempted for odin/(default)'s on-demand start of H200 slice 1g.18gb"
    assert ctx.meter.preempt(("sue", ""), deadline, why)
    ctx.meter.sessions.set_preemption(ctx.meter.live[("sue", "")].session_id, deadline, why)
    ctx.meter = Meter(ctx.engine)
    ctx.meter.recover(lambda user, server: True)
    assert ctx.meter.preempting[("sue", "")].deadline == deadline


async def test_a_restored_preemption_stands_while_the_queue_is_resumed(mixed):
    """After a restart the previous hub's queued starts come back one at a time, spot
    ones (which arrived earlier) first: a pass for them does not take back the
    preemption made for an on-demand start not yet back."""
    ctx, now = mixed, utcnow()
    _running(ctx, "ada", "on-demand", now - dt.timedelta(minutes=20))
    _running(ctx, "sue", "spot", now - dt.timedelta(minutes=5))
    ctx.assignments.claim("bob", "", "card", CARD, ctx.inventory)
    ctx.assignments.claim("cat", "", "card", CARD, ctx.inventory)
    deadline = utcnow().replace(microsecond=0) + dt.timedelta(seconds=90)
    _restart_during_grace(ctx, deadline)
    ctx.meter.queue_resuming = True  # as GPULeaseHub._resume_queue sets it
    runner = QueueRunner(ctx, poll_s=60)
    runner.spot_grace_s = 60
    cy = asyncio.ensure_future(runner.admit("cy", "", "card", CARD, max_wait=30, spot=True))
    try:
        await _until(lambda: runner.position("cy", "") == 1)
        await runner.serve()
        assert ctx.meter.preempting[("sue", "")].deadline == deadline
    finally:
        cy.cancel()
        await asyncio.gather(cy, return_exceptions=True)


async def test_once_the_queue_is_back_a_restored_preemption_nobody_needs_is_taken_back(ctx):
    """The on-demand start sue was preempted for did not come back (its profile was
    disabled meanwhile, say): the pass after the resume takes her preemption back."""
    import logging

    from gpulease.hub.servers.queue_resume import resume_then_serve
    from gpulease.spawners.queueing import runner as queue_runner

    _running(ctx, "sue", "spot", utcnow() - dt.timedelta(minutes=5))
    _restart_during_grace(ctx, utcnow().replace(microsecond=0) + dt.timedelta(seconds=90))
    try:
        await resume_then_serve(None, ctx, [], "", logging.getLogger("t"), embedded=True)
        assert ctx.meter.preempting == {}
        assert ctx.meter.sessions.open_sessions()[0].preempted_until is None
    finally:
        queue_runner._runners.pop(id(ctx), None)


async def test_a_preemption_that_a_later_start_counts_on_is_not_taken_back(mixed):
    """lee (the latest spot card) is preempted for y (one card); x (two cards) queues
    behind; y is cancelled: x needs lee's card and sam's, so sam is preempted too and
    lee's preemption stands with the deadline lee was told (it was taken back, then made
    again with a new one)."""
    ctx, now = mixed, utcnow()
    _running(ctx, "ada", "on-demand", now - dt.timedelta(minutes=20))
    _running(ctx, "bea", "on-demand", now - dt.timedelta(minutes=20))
    for user, ago in (("sam", 20), ("lee", 5)):
        ctx.assignments.claim(user, "", "card", CARD, ctx.inventory)
        ctx.meter.open(user, "", "card", f"user:{user}", 36_000,
                       now - dt.timedelta(minutes=ago), "spot")
    runner = QueueRunner(ctx, poll_s=60)
    runner.spot_grace_s = 60
    y = asyncio.ensure_future(runner.admit("y", "", "card", CARD, max_wait=30))
    x = None
    try:
        await _until(lambda: ("lee", "") in ctx.meter.preempting)
        first = ctx.meter.preempting[("lee", "")].deadline
        x = asyncio.ensure_future(runner.admit("x", "", "two", DeviceRequest("H200", count=2),
                                               max_wait=30))
        await _until(lambda: runner.position("x", "") == 2)
        await runner.serve()
        assert set(ctx.meter.preempting) == {("lee", "")}
        y.cancel()
        await asyncio.gather(y, return_exceptions=True)
        await _until(lambda: ("sam", "") in ctx.meter.preempting)
        await runner.serve()
        assert ctx.meter.preempting[("lee", "")].deadline == first
    finally:
        for waiter in (y, x):
            if waiter is not None:
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)


def test_a_hub_lost_after_the_deadline_bills_only_to_it(engine):
    """Heartbeats confirm a preempted server past its deadline until its stop is done; a
    hub that dies then leaves the session open, and the next one closes it at the
    deadline, as preempted, not at its last confirmation as hub_lost."""
    meter = Meter(engine)
    start = utcnow().replace(microsecond=0) - dt.timedelta(minutes=10)
    session = meter.open("sue", "", "slice", "user:sue", 36_000, start, "spot")
    deadline = start + dt.timedelta(minutes=5)
    assert meter.preempt(("sue", ""), deadline, "preempted for odin")
    meter.sessions.set_preemption(session.id, deadline, "preempted for odin")
    meter.sessions.confirm([session.id], deadline + dt.timedelta(seconds=10))
    again = Meter(engine)
    again.recover(lambda user, server: False)
    closed = again.sessions.get(session.id)
    assert (closed.ended, closed.end_reason) == (deadline, "preempted")
    assert closed.billed_ms() == 5 * 60 * 1000


def test_a_preemption_asks_for_heartbeats_at_its_deadline_and_for_its_kill(engine):
    """A preempted server stopped at the first regular heartbeat after its deadline kept
    its GPU up to an interval (15 s) past it, and a server ignoring SIGTERM up to two:
    the meter asks the hub for a beat at the deadline, and one once the kill is due."""
    asked: list[dt.datetime] = []
    meter = Meter(engine, heartbeat_s=15)
    meter.beat_at = asked.append
    start = utcnow().replace(microsecond=0)
    session = meter.open("sue", "", "slice", "user:sue", 36_000, start, "spot")
    deadline = start + dt.timedelta(minutes=2)
    assert meter.preempt(("sue", ""), deadline, "preempted for odin")
    kill = deadline + dt.timedelta(seconds=meter.kill_after_s + 0.1)
    assert asked == [deadline, kill]
    meter.sessions.set_preemption(session.id, deadline, "preempted for odin")
    again = Meter(engine)
    again.beat_at = asked.append
    again.recover(lambda user, server: True)  # a restored preemption asks again
    assert asked[2:] == [deadline, kill]


async def test_the_hub_beats_at_the_moment_asked():
    from gpulease.hub.billing.metering import beat_at

    beats: list[dt.datetime] = []

    async def heartbeat_once():
        beats.append(utcnow())

    when = utcnow() + dt.timedelta(seconds=0.3)
    beat_at(when, heartbeat_once)
    await asyncio.sleep(0.2)
    assert beats == []
    await _until(lambda: beats, timeout=2)
    assert len(beats) == 1 and beats[0] >= when
