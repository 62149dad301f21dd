"""The hub-side metering loop, on a real database, with the hub replaced by callbacks."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from gpulease.core.billing.enforcement import (
    ACCOUNT_CAP,
    OUT_OF_CREDIT,
    CapUse,
    Metered,
    RunningServer,
    StopOrder,
    StopProgress,
    missing_sessions,
    stop_actions,
    who_must_stop,
)
from gpulease.core.billing.rules import month_start, to_ms
from gpulease.core.billing.sessions import MeterConflict
from gpulease.core.clock import utcnow
from gpulease.hub.billing.metering import Meter
from gpulease.store.db import sessions
from gpulease.store.member_caps import capped_spends

RATE = 3_600_000_000  # 1 credit a second


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def meter(engine):
    m = Meter(engine, heartbeat_s=1)
    m.acquire_lease()
    return m


Key = tuple[str, str]


@dataclass
class FakeHub:
    """The hub's side of the heartbeat (HubServers): what runs, and what it was asked."""

    alive: set[Key] = field(default_factory=set)  # process runs
    active: set[Key] = field(default_factory=set)  # the hub counts it (running, pending)
    ready: list[RunningServer] = field(default_factory=list)
    stops: list[Key] = field(default_factory=list)
    kills: list[Key] = field(default_factory=list)

    def add(self, key: Key, alive: bool = True) -> None:
        self.active.add(key)
        if alive:
            self.alive.add(key)

    def gone(self, key: Key) -> None:
        self.alive.discard(key)
        self.active.discard(key)

    async def is_running(self, user, server):
        return (user, server) in self.alive

    def is_active(self, user, server):
        return (user, server) in self.active

    async def running(self):
        return list(self.ready)

    async def stop(self, user, server):
        self.stops.append((user, server))

    async def kill(self, user, server):
        self.kills.append((user, server))
        return 1


def always_running(*keys: Key) -> FakeHub:
    hub = FakeHub()
    for key in keys:
        hub.add(key)
    return hub


def test_heartbeat_confirms_and_stops_accounts_at_zero(meter):
    meter.ledger.grant("user:a", 5_000_000, note="t", actor="test")
    started = utcnow() - dt.timedelta(seconds=10)
    meter.open("a", "", "pricey", "user:a", RATE, started)
    hub = always_running(("a", ""))
    run(meter.heartbeat(hub))
    stopped = hub.stops
    assert stopped == [("a", "")]
    session = meter.sessions.open_for("a", "")
    assert session.requested_end_reason == "out_of_credit"
    assert session.billed_seconds() >= 10
    meter.close("a", "", "user")
    closed = meter.sessions.get(session.id)
    assert closed.end_reason == "out_of_credit"


def test_low_balance_notice(meter):
    """A balance turning low posts a `credit_low` notice and notifies the user, once."""
    from gpulease.hub.servers.notifier import announce
    from gpulease.store.notices import NoticeStore

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
        hub = always_running(("b", ""))
        await meter.heartbeat(hub)
        await meter.heartbeat(hub)
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
    t0 = to_ms(utcnow()) - dt.timedelta(seconds=20)  # on the millisecond, as metered
    s = meter.open("d", "", "pricey", "user:d", RATE, t0)
    real_close = meter.sessions.close

    def broken(*args, **kwargs):
        raise OperationalError("close", {}, Exception("database down"))

    monkeypatch.setattr(meter.sessions, "close", broken)
    ended = t0 + dt.timedelta(seconds=7)
    meter.close("d", "", "user", ended=ended)
    assert meter.sessions.open_for("d", "") is not None and len(meter.pending) == 1
    monkeypatch.setattr(meter.sessions, "close", real_close)
    run(meter.heartbeat(always_running(("d", ""))))
    closed = meter.sessions.get(s.id)
    assert closed.ended == ended and closed.billed_ms() == 7000
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


# --- the heartbeat's decisions (gpulease.core.billing.enforcement), pure ---------------------

T0 = dt.datetime(2025, 3, 10, 12, 0, 0)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_missing_sessions_bill_from_the_first_answer_when_known_else_from_now():
    seen = RunningServer(("a", ""), "cpu", "user:a", RATE, launched_at=at(5), started_at=at(0))
    unseen = RunningServer(("b", "x"), "cpu", "user:b", RATE, started_at=at(-100))
    metered = RunningServer(("c", ""), "cpu", "user:c", RATE, launched_at=at(1))
    repairs = missing_sessions([seen, unseen, metered], {("c", "")}, at(30))
    assert [(r.server.key, r.since, r.gap_s) for r in repairs] == [
        (("a", ""), at(5), 25.0),
        (("b", "x"), at(30), 130.0),  # not known to have run before: logged, not billed
    ]


def test_who_must_stop_out_of_credit_before_cap_and_never_free_sessions():
    sessions = [
        Metered(("a", ""), "user:a", RATE),
        Metered(("b", ""), "group:lab", RATE),
        Metered(("c", ""), "group:lab", RATE),
        Metered(("d", ""), "group:lab", 0),  # free: never stopped for money
        Metered(("e", ""), "user:e", RATE),
        Metered(("f", ""), "group:poor", RATE),
    ]
    balances = {"user:a": 0, "group:lab": 50_000_000, "user:e": 1, "group:poor": -5}
    caps = {("group:lab", "b"): CapUse(5_000_000, 5_000_000),  # reached: stop
            ("group:lab", "c"): CapUse(5_000_000, 4_999_999),
            ("group:lab", "d"): CapUse(0, 10),
            ("group:poor", "f"): CapUse(1, 100)}
    orders = who_must_stop(sessions, balances, caps)
    assert [(o.key[0], o.reason) for o in orders] == [
        ("a", OUT_OF_CREDIT), ("b", ACCOUNT_CAP), ("f", OUT_OF_CREDIT)]
    cap = orders[1]
    assert cap.cap == CapUse(5_000_000, 5_000_000)
    assert "5.000000" in cap.why and "group:lab" in cap.why and "monthly cap" in cap.why


def test_a_session_opened_while_the_heartbeat_read_the_balances_is_not_stopped():
    """The heartbeat reads the balances of the accounts it meters on another thread; a
    session that opens meanwhile (a start billed from its launch) has no balance read
    this beat. It was taken for 0 and stopped as out of credit at once (seen in
    tests/e2e/test_spot.py under load: the on-demand start a spot server was
    preempted for, stopped the same second). It is judged at the next beat."""
    sessions = [Metered(("odin", ""), "user:odin", RATE), Metered(("a", ""), "user:a", RATE)]
    orders = who_must_stop(sessions, {"user:a": 0}, {})
    assert [(o.key[0], o.reason) for o in orders] == [("a", OUT_OF_CREDIT)]


def test_stop_actions_stop_every_heartbeat_and_kill_once_a_stop_had_its_time():
    order = StopOrder(("a", ""), OUT_OF_CREDIT, "user:a", "out")
    progress = StopProgress(order, first_at=at(0))
    assert stop_actions(progress, at(0), 7.5) == ("stop",)
    progress.attempts = 1
    assert stop_actions(progress, at(7), 7.5) == ("stop",)
    assert stop_actions(progress, at(15), 7.5) == ("kill", "stop")


# --- the heartbeat, on a real database with the hub replaced by FakeHub ---------------


def test_a_running_server_without_a_session_gets_one_from_its_first_answer(meter, caplog):
    meter.ledger.grant("user:g", 100_000_000, note="t", actor="test")
    answered = to_ms(utcnow()) - dt.timedelta(seconds=20)
    hub = always_running(("g", "slow"))
    hub_started = answered - dt.timedelta(seconds=3)  # JupyterHub's `started` of the run
    hub.ready = [RunningServer(("g", "slow"), "pricey", "user:g", RATE, launched_at=answered,
                               started_at=hub_started)]
    with caplog.at_level(logging.WARNING, logger="gpulease.metering"):
        run(meter.heartbeat(hub))
    session = meter.sessions.open_for("g", "slow")
    assert session is not None and session.started == answered
    # the run it bills, which the culler's GPU readings name (gpulease/store/gpu_stats.py)
    with meter.engine.connect() as conn:
        assert conn.execute(select(sessions.c.run_started_at).where(
            sessions.c.id == session.id)).scalar() == hub_started
    assert ("g", "slow") in meter.live and session.billed_seconds() >= 20
    assert "no open billing session" in caplog.text and "gap of 2" in caplog.text
    # the next heartbeat finds no gap: one session, not a second
    caplog.clear()
    run(meter.heartbeat(hub))
    assert "no open billing session" not in caplog.text
    assert meter.sessions.open_for("g", "slow").id == session.id


def test_an_out_of_credit_stop_is_retried_and_killed_until_the_server_is_gone(meter):
    meter.ledger.grant("user:h", 1_000_000, note="t", actor="test")
    meter.open("h", "", "pricey", "user:h", RATE, utcnow() - dt.timedelta(seconds=5))
    hub = always_running(("h", ""))
    meter.kill_after = 0  # every heartbeat after the first kills
    failed = REGISTRY.get_sample_value("gpulease_credit_stops_failed_total",
                                       {"reason": "out_of_credit"}) or 0
    run(meter.heartbeat(hub))
    assert hub.stops == [("h", "")] and hub.kills == []
    run(meter.heartbeat(hub))  # a SIGTERM-ignoring server: still there
    assert hub.stops == [("h", "")] * 2 and hub.kills == [("h", "")]
    assert REGISTRY.get_sample_value("gpulease_credit_stops_failed_total",
                                     {"reason": "out_of_credit"}) == failed + 1
    # a pending (starting or stopping) server is still pushed
    hub.alive.discard(("h", ""))
    run(meter.heartbeat(hub))
    assert len(hub.stops) == 3 and len(hub.kills) == 2
    # gone: its session closes with the reason, and nothing more is asked
    meter.close("h", "", "server_died")
    hub.gone(("h", ""))
    run(meter.heartbeat(hub))
    assert len(hub.stops) == 3 and meter.stopping == {}
    (session,) = [s for s in meter.sessions.latest_by_server("h").values()]
    assert session.end_reason == "out_of_credit"


def test_an_out_of_credit_stop_ends_with_its_session_not_the_next_start(meter):
    """Credit granted and the server started again within a heartbeat of its stop: the
    new start (pending, no session yet) is another run, not the stop's to interrupt."""
    meter.ledger.grant("user:n", 1_000_000, note="t", actor="test")
    meter.open("n", "", "pricey", "user:n", RATE, utcnow() - dt.timedelta(seconds=5))
    hub = always_running(("n", ""))
    run(meter.heartbeat(hub))
    assert hub.stops == [("n", "")]
    meter.close("n", "", "user")  # the stop completed: its session closed
    meter.ledger.grant("user:n", 100_000_000, note="t", actor="test")
    hub.alive.discard(("n", ""))  # and the user's new start is pending (active, no session)
    run(meter.heartbeat(hub))
    assert hub.stops == [("n", "")] and meter.stopping == {}  # before: stopped again


def test_a_stop_is_not_killed_before_it_had_a_heartbeat(meter):
    meter.ledger.grant("user:i", 1_000_000, note="t", actor="test")
    meter.open("i", "", "pricey", "user:i", RATE, utcnow() - dt.timedelta(seconds=5))
    hub = always_running(("i", ""))
    run(meter.heartbeat(hub))
    run(meter.heartbeat(hub))  # at once: the stop has had no time (heartbeat_s is 1)
    assert hub.kills == [] and len(hub.stops) == 2


def test_a_member_at_their_cap_is_stopped_with_account_cap_and_told(meter):
    from gpulease.hub.servers.notifier import announce
    from gpulease.store.notices import NoticeStore

    store = NoticeStore(meter.engine)
    meter.announce = lambda *n: announce(store, {}, *n)
    meter.ledger.grant("group:lab", 1_000_000_000, note="t", actor="test")
    meter.ledger.set_cap("group:lab", "j", 3_000_000)  # 3 credits a month
    meter.ledger.set_cap("group:lab", "k", 300_000_000)
    meter.open("j", "", "pricey", "group:lab", RATE, utcnow() - dt.timedelta(seconds=4))
    meter.open("k", "", "pricey", "group:lab", RATE, utcnow() - dt.timedelta(seconds=4))
    hub = always_running(("j", ""), ("k", ""))
    run(meter.heartbeat(hub))
    assert hub.stops == [("j", "")]
    assert meter.sessions.open_for("j", "").requested_end_reason == "account_cap"
    (notice,) = store.active("j")
    assert notice.kind == "suspended"
    assert "monthly cap" in notice.message and "3.000000" in notice.message
    assert "group:lab" in notice.message
    meter.close("j", "", "user")
    (session,) = meter.sessions.latest_by_server("j").values()
    assert session.end_reason == "account_cap"


def test_a_session_whose_server_the_hub_forgot_is_closed_at_its_last_sight(meter):
    meter.ledger.grant("user:l", 100_000_000, note="t", actor="test")
    t0 = utcnow() - dt.timedelta(seconds=30)
    s = meter.open("l", "", "pricey", "user:l", RATE, t0)
    meter.mark_alive("l", "", t0 + dt.timedelta(seconds=10))
    run(meter.heartbeat(FakeHub()))
    closed = meter.sessions.get(s.id)
    assert closed.end_reason == "server_died" and closed.billed_seconds() == 10


def test_capped_spends_agree_with_member_spend(meter):
    ledger = meter.ledger
    ledger.grant("group:lab", 1_000_000_000, note="t", actor="test")
    ledger.grant("group:other", 1_000_000_000, note="t", actor="test")
    ledger.set_cap("group:lab", "m", 10_000_000)
    ledger.set_cap("group:other", "n", 1)
    now = to_ms(utcnow())
    done = meter.open("m", "a", "p", "group:lab", RATE, now - dt.timedelta(seconds=30))
    meter.close("m", "a", "user", ended=now - dt.timedelta(seconds=20))
    meter.sessions.get(done.id)
    meter.open("m", "b", "p", "group:lab", RATE, now - dt.timedelta(seconds=5))
    meter.open("o", "", "p", "group:lab", RATE, now)  # no cap: not reported
    since = month_start(now)
    found = capped_spends(meter.engine, {("group:lab", "m"), ("group:lab", "o"),
                                         ("group:other", "n"), ("user:m", "m")}, since)
    assert found == {("group:lab", "m"): (10_000_000, ledger.member_spend("group:lab", "m", since)),
                     ("group:other", "n"): (1, 0)}
    assert found[("group:lab", "m")][1] == 10_000_000  # the closed run; the open one unconfirmed


def test_a_preempted_spot_server_is_stopped_from_its_deadline_and_billed_up_to_it(meter):
    meter.ledger.grant("user:p", 100_000_000, note="t", actor="test")
    t0 = to_ms(utcnow()) - dt.timedelta(seconds=30)
    meter.open("p", "", "slice", "user:p", RATE, t0, "spot")
    meter.open("q", "", "slice", "user:p", RATE, t0)  # on demand: never preempted
    deadline = t0 + dt.timedelta(seconds=10)
    assert meter.preempt(("p", ""), deadline, "for x") and not meter.preempt(("p", ""),
                                                                           deadline, "again")
    assert not meter.preempt(("q", ""), deadline, "for x")
    meter._order_preemptions(t0 + dt.timedelta(seconds=9))
    assert ("p", "") not in meter.stopping  # still in its grace period
    meter._order_preemptions(deadline)
    order = meter.stopping[("p", "")].order
    assert order.reason == "preempted" and order.why == "for x"
    meter.close("p", "", "user")  # the stop came 20 s after the deadline
    (session,) = [s for s in meter.sessions.latest_by_server("p").values()]
    assert session.tier == "spot" and session.billed_ms() == 10_000
    assert ("p", "") not in meter.preempting
