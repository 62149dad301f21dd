"""The end of a reservation for its running servers: the decision (hub/billing/reservation_ends.py
end_steps), pure."""

import datetime as dt

from gpulease.core.billing.sessions import LiveSession
from gpulease.core.capacity.reservation_rules import Reservation
from gpulease.hub.billing.reservation_ends import end_steps
from gpulease.store.reservations import Booked

T0 = dt.datetime(2026, 12, 7, 9)
H = dt.timedelta(hours=1)
NOTICE = dt.timedelta(minutes=10)


def _booked(rid: int, end: dt.datetime, cancelled: dt.datetime | None = None) -> Booked:
    r = Reservation(rid, "user:lee", "slice", ("H200", "1g.18gb"), 1, 2, T0, end, 1, cancelled)
    return Booked(r, 2, "continue", "", T0, "admin")


def _live(rid: int | None, tier: str = "reserved") -> LiveSession:
    return LiveSession(1, "slice", "user:lee", 0, T0, tier, rid)


def test_servers_are_told_once_each_then_ended_at_the_end():
    booked = {1: _booked(1, T0 + 2 * H)}
    live = {("lee", "a"): _live(1), ("lee", "b"): _live(1), ("ann", ""): _live(None, "spot")}
    early = end_steps(live, booked, T0 + 2 * H - NOTICE - dt.timedelta(seconds=1), NOTICE)
    assert early.notify == [] and early.end == []
    ahead = end_steps(live, booked, T0 + 2 * H - NOTICE, NOTICE)
    assert [k for k, _ in ahead.notify] == [("lee", "a"), ("lee", "b")] and ahead.end == []
    # a is told; b, started after, still is
    again = end_steps(live, booked, T0 + 2 * H - NOTICE / 2, NOTICE, {(("lee", "a"), 1)})
    assert [k for k, _ in again.notify] == [("lee", "b")]
    ended = end_steps(live, booked, T0 + 2 * H, NOTICE, {(("lee", "a"), 1)})
    assert [k for k, _ in ended.end] == [("lee", "a"), ("lee", "b")] and ended.notify == []


def test_a_cancelled_reservation_ends_at_the_first_hour_it_refunded():
    booked = {1: _booked(1, T0 + 5 * H, cancelled=T0 + dt.timedelta(minutes=70))}
    live = {("lee", ""): _live(1)}
    assert end_steps(live, booked, T0 + 2 * H - dt.timedelta(seconds=1), NOTICE).end == []
    assert [k for k, _ in end_steps(live, booked, T0 + 2 * H, NOTICE).end] == [("lee", "")]
