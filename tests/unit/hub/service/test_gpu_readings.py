"""The culler's GPU readings: validation field by field, and the last hour kept in memory."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from gpulease.hub.service.activity_store import PushError
from gpulease.hub.service.gpu_readings import (
    MAX_SERVERS_PER_PUSH,
    GpuReadings,
    parse_readings,
)

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)


def entry(**kw):
    return {"user": "ada", "server": "", "activity": Decimal("37.5"),
            "memory_used_bytes": 1234, "memory_total_bytes": 19327352832, "source": "nvml",
            "why": "", **kw}


def test_a_reading_is_kept_as_given():
    (r,) = parse_readings({"servers": [entry()]}, NOW)
    assert (r.activity, r.memory_used_bytes, r.source, r.at) == (37.5, 1234, "nvml", NOW)
    assert isinstance(r.activity, float)
    (r,) = parse_readings({"servers": [entry(activity=None, memory_used_bytes=None,
                                             source="", why="no GPU")]}, NOW)
    assert r.activity is None and r.why == "no GPU" and r.sample().source == ""
    assert parse_readings({"servers": []}, NOW) == []


@pytest.mark.parametrize(("bad", "field"), [
    ({"activity": True}, "activity"), ({"activity": -0.1}, "activity"),
    ({"activity": Decimal("100.01")}, "activity"), ({"activity": "50"}, "activity"),
    ({"memory_used_bytes": 1.5}, "memory_used_bytes"), ({"memory_used_bytes": -1},
                                                        "memory_used_bytes"),
    ({"memory_total_bytes": 2**63}, "memory_total_bytes"), ({"source": "smi"}, "source"),
    ({"why": "x" * 501}, "why"), ({"user": ""}, "user"), ({"server": None}, "server"),
    ({"user": "a" * 256}, "user"), ({"pid": 1}, "pid"),
])
def test_each_bad_field_is_named_and_nothing_is_kept(bad, field):
    with pytest.raises(PushError) as e:
        parse_readings({"servers": [entry(), entry(**bad)]}, NOW)
    assert e.value.status == 400
    assert [f for f, _ in e.value.errors] == [f"servers[1].{field}"]


def test_the_push_itself_is_checked():
    for body, field in [([], ""), ({"servers": "x"}, "servers"), ({"extra": 1, "servers": []},
                                                                  "extra"),
                        ({"servers": [entry()] * (MAX_SERVERS_PER_PUSH + 1)}, "servers")]:
        with pytest.raises(PushError) as e:
            parse_readings(body, NOW)
        assert e.value.errors[0][0] == field


def test_the_last_hour_is_kept_bounded_per_server_and_in_all():
    store = GpuReadings(max_servers=2, max_history=3)
    for minutes in (0, 30, 50, 70, 80):
        store.put(parse_readings({"servers": [entry(activity=minutes)]},
                                 NOW + timedelta(minutes=minutes)))
    later = NOW + timedelta(minutes=115)  # an hour back: 55 min; 0 and 30 off the bound
    assert [r.activity for r in store.history("ada", "", later)] == [70.0, 80.0]
    assert store.latest("ada", "").activity == 80.0
    store.put(parse_readings({"servers": [entry(user="bob"), entry(user="carl")]}, later))
    assert store.latest("ada", "") is None  # the least recently pushed is forgotten
    assert store.history("nobody", "", later) == [] and store.latest("bob", "") is not None
