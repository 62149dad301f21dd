"""The culler's GPU readings: validation field by field, and the last hour kept in memory."""

import sys
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from gpulease.hub.service.activity_store import PushError
from gpulease.hub.service.billing_views import iso
from gpulease.hub.service.gpu_readings import (
    MAX_SERVERS_PER_PUSH,
    GpuReadings,
    parse_readings,
    reading_view,
)

NOW = datetime(2030, 1, 1, 12)  # naive UTC, as the service keeps it
STARTED = "2030-01-01T11:00:00.000Z"


def entry(**kw):
    return {"user": "ada", "server": "", "started": STARTED, "activity": Decimal("37.5"),
            "memory_used_bytes": 1234, "memory_total_bytes": 19327352832, "source": "nvml",
            "why": "", **kw}


def test_a_reading_is_kept_as_given():
    push = parse_readings({"servers": [entry()]}, NOW)
    (r,) = push.readings
    assert (r.activity, r.memory_used_bytes, r.source, r.at) == (37.5, 1234, "nvml", NOW)
    assert r.started == datetime(2030, 1, 1, 11) and push.interval_s == 10.0
    assert isinstance(r.activity, float)
    (r,) = parse_readings({"servers": [entry(activity=None, memory_used_bytes=None,
                                             source="", why="no GPU")]}, NOW).readings
    assert r.activity is None and r.why == "no GPU" and r.sample().source == ""
    assert parse_readings({"servers": []}, NOW).readings == []
    assert parse_readings({"servers": [], "interval_s": 2.5}, NOW).interval_s == 2.5
    # the hub's clock a little ahead of this service's is no error
    (r,) = parse_readings({"servers": [entry(started="2030-01-01T12:04:59Z")]}, NOW).readings
    assert r.started == datetime(2030, 1, 1, 12, 4, 59)


@pytest.mark.parametrize(("bad", "field"), [
    ({"activity": True}, "activity"), ({"activity": -0.1}, "activity"),
    ({"activity": Decimal("100.01")}, "activity"), ({"activity": "50"}, "activity"),
    ({"memory_used_bytes": 1.5}, "memory_used_bytes"), ({"memory_used_bytes": -1},
                                                        "memory_used_bytes"),
    ({"memory_total_bytes": 2**63}, "memory_total_bytes"), ({"source": "smi"}, "source"),
    ({"why": "x" * 501}, "why"), ({"user": ""}, "user"), ({"server": None}, "server"),
    ({"user": "a" * 256}, "user"), ({"pid": 1}, "pid"), ({"started": None}, "started"),
    ({"started": "2030-01-01"}, "started"), ({"started": "yesterday"}, "started"),
    # a start later than this service's clock by more than 5 minutes: no server's start
    ({"started": "2030-01-01T12:05:01Z"}, "started"), ({"started": "9999-12-31T00:00:00Z"},
                                                       "started"),
    # a lone surrogate: valid JSON, no valid text (no database takes it)
    ({"user": "ada\ud800"}, "user"), ({"server": "\udfff"}, "server"), ({"why": "\ud800"}, "why"),
    # an integer too large for a float (JSON has no bound): refused, never a 500
    ({"activity": 10**400}, "activity"),
])
def test_each_bad_field_is_named_and_nothing_is_kept(bad, field):
    with pytest.raises(PushError) as e:
        parse_readings({"servers": [entry(), entry(**bad)]}, NOW)
    assert e.value.status == 400
    assert [f for f, _ in e.value.errors] == [f"servers[1].{field}"]


def test_the_push_itself_is_checked():
    for body, field in [([], ""), ({"servers": "x"}, "servers"), ({"extra": 1, "servers": []},
                                                                  "extra"),
                        ({"servers": [entry()] * (MAX_SERVERS_PER_PUSH + 1)}, "servers"),
                        ({"servers": [], "interval_s": 0.5}, "interval_s"),
                        ({"servers": [], "interval_s": True}, "interval_s"),
                        ({"servers": [], "interval_s": 301}, "interval_s"),
                        ({"servers": [], "interval_s": 10**400}, "interval_s")]:
        with pytest.raises(PushError) as e:
            parse_readings(body, NOW)
        assert e.value.errors[0][0] == field


def push_at(at: datetime, *entries: dict, interval_s: float = 10.0):
    return parse_readings({"servers": list(entries), "interval_s": interval_s}, at)


def test_the_last_hour_is_a_point_a_minute_of_the_session_it_was_accepted_for():
    store = GpuReadings()
    ada = [7]  # the session each reading was accepted for
    # two readings in minute 0 (mean 20, memory peak 300), one in 30, 50, 70, 80
    for minutes, activity, memory in ((0, 10, 300), (0.5, 30, 100), (30, 30, 1), (50, 50, 1),
                                      (70, 70, 1), (80, None, None)):
        store.put(push_at(NOW + timedelta(minutes=minutes),
                          entry(activity=activity, memory_used_bytes=memory)), ada)
    held = store.of_session("ada", "", 7)
    assert [(p["activity"], p["memory_used_bytes"]) for p in held.points(NOW)] == [(20.0, 300)]
    later = NOW + timedelta(minutes=115)  # an hour back: 55 min; 0, 30 and 50 are older
    assert [(p["activity"], p["memory_used_bytes"]) for p in held.points(later)] == [
        (70.0, 1), (None, None)]
    assert held.latest.activity is None
    # Another session of the same server (a restart) sees none of it, nor does "no session".
    assert store.of_session("ada", "", 8) is None and store.of_session("ada", "", None) is None
    # A reading the store was not told is of the open session is kept nowhere.
    store.put(push_at(later, entry(user="eve")), [None])
    assert store.of_session("eve", "", 1) is None
    # The same run going on in a new session (a reservation's end) keeps its chart...
    store.put(push_at(later, entry(activity=1)), [8])
    assert [p["activity"] for p in store.of_session("ada", "", 8).points(later)] == [
        70.0, None, 1.0]
    # ...a new run starts a new one.
    store.put(push_at(later, entry(activity=2, started="2030-01-01T13:00:00Z")), [9])
    assert [p["activity"] for p in store.of_session("ada", "", 9).points(later)] == [2.0]


def test_the_store_is_bounded_in_servers():
    store = GpuReadings(max_servers=2)
    for user in ("ada", "bob", "carl"):
        store.put(push_at(NOW, entry(user=user)), [1])
    assert store.of_session("ada", "", 1) is None  # the least recently pushed is forgotten
    assert store.of_session("carl", "", 1) is not None
    # Fixed-size arrays a server: an hour of a reading a second takes no more room.
    held = store.of_session("carl", "", 1)
    size = sum(sys.getsizeof(getattr(held, a)) for a in held.__slots__)
    for second in range(3600):
        held.add(push_at(NOW + timedelta(seconds=second), entry()).readings[0], 1.0)
    assert sum(sys.getsizeof(getattr(held, a)) for a in held.__slots__) == size < 2048


def test_a_stale_reading_is_not_shown_as_current():
    (r,) = push_at(NOW, entry()).readings
    assert reading_view(r, iso, NOW + timedelta(seconds=30), 10.0)["activity"] == 37.5
    stale = reading_view(r, iso, NOW + timedelta(seconds=31), 10.0)
    assert (stale["activity"], stale["memory_used_bytes"], stale["source"]) == (None, None, "")
    assert stale["why"].startswith("no reading for 31 s")
    # three of a slower culler's intervals
    assert reading_view(r, iso, NOW + timedelta(seconds=150), 60.0)["activity"] == 37.5

