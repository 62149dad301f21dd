"""The hub-side metering loop, on a real database, with the hub replaced by callbacks."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy.exc import OperationalError

from gpulease.hub.db import utcnow
from gpulease.hub.metering import Meter
from gpulease.hub.sessions import MeterConflict

RATE = 3_600_000_000  # 1 credit a second


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def meter(engine):
    m = Meter(engine, heartbeat_s=1)
    m.acquire_lease()
    return m


async def always_running(user, server):
    return True


def test_heartbeat_confirms_and_stops_accounts_at_zero(meter):
    meter.ledger.grant("user:a", 5_000_000, note="t", actor="test")
    started = utcnow() - dt.timedelta(seconds=10)
    meter.open("a", "", "pricey", "user:a", RATE, started)
    stopped = []

    async def stop(user, server):
        stopped.append((user, server))

    run(meter.heartbeat(always_running, stop))
    assert stopped == [("a", "")]
    session = meter.sessions.open_for("a", "")
    assert session.requested_end_reason == "out_of_credit"
    assert session.billed_seconds() >= 10
    meter.close("a", "", "user")
    closed = meter.sessions.get(session.id)
    assert closed.end_reason == "out_of_credit"


def test_low_balance_notice(meter):
    """A balance turning low posts a `credit_low` notice and notifies the user, once."""
    from gpulease.hub.notices import NoticeStore
    from gpulease.hub.notifier import announce

    sent = []

    class Recorder:
        async def send(self, user, prefs, subject, text):
            sent.append((user, prefs.address, subject, text))

    store = NoticeStore(meter.engine)
    store.set_prefs("b", "email", "b@example.org")
    meter.announce = lambda *n: announce(store, {"email": Recorder()}, *n)
    meter.ledger.grant("user:b", 300_000_000, note="t", actor="test")  # 300 s at 1 credit/s

    async def beats():
        meter.open("b", "", "pricey", "user:b", RATE, utcnow())
        await meter.heartbeat(always_running, None)
        await meter.heartbeat(always_running, None)
        await asyncio.sleep(0.2)  # the message goes out in the background

    run(beats())
    assert "Low balance" in meter.low["b"]
    (notice,) = store.active("b")
    assert notice.kind == "credit_low" and "running low" in notice.message
    assert "pricey" in notice.message and "min left" in notice.message
    assert len(sent) == 1 and sent[0][:2] == ("b", "b@example.org")


def test_dead_server_is_billed_to_when_it_was_last_seen(meter):
    meter.ledger.grant("user:c", 100_000_000, note="t", actor="test")
    t0 = utcnow() - dt.timedelta(seconds=30)
    meter.open("c", "s", "pricey", "user:c", RATE, t0)
    meter.mark_alive("c", "s", t0 + dt.timedelta(seconds=12))
    meter.close("c", "s", "server_died")
    (session,) = [s for s in [meter.sessions.get(1)] if s]
    assert session.end_reason == "server_died"
    assert session.billed_seconds() == 12


def test_closes_that_fail_are_written_when_the_database_returns(meter, monkeypatch):
    meter.ledger.grant("user:d", 100_000_000, note="t", actor="test")
    t0 = utcnow() - dt.timedelta(seconds=20)
    s = meter.open("d", "", "pricey", "user:d", RATE, t0)
    real_close = meter.sessions.close

    def broken(*args, **kwargs):
        raise OperationalError("close", {}, Exception("database down"))

    monkeypatch.setattr(meter.sessions, "close", broken)
    ended = t0 + dt.timedelta(seconds=7)
    meter.close("d", "", "user", ended=ended)
    assert meter.sessions.open_for("d", "") is not None and len(meter.pending) == 1
    monkeypatch.setattr(meter.sessions, "close", real_close)
    run(meter.heartbeat(always_running, None))
    closed = meter.sessions.get(s.id)
    assert closed.ended == ended and closed.billed_seconds() == 7
    assert meter.pending == []


def test_hub_shutdown_reason(meter):
    meter.ledger.grant("user:e", 100_000_000, note="t", actor="test")
    s = meter.open("e", "", "pricey", "user:e", RATE, utcnow())
    meter.shutting_down = True
    meter.close("e", "", "user")
    assert meter.sessions.get(s.id).end_reason == "hub_shutdown"


def test_a_second_meter_is_refused(engine, meter):
    other = Meter(engine, heartbeat_s=1)
    with pytest.raises(MeterConflict):
        other.acquire_lease()
