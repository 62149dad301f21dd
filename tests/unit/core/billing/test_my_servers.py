"""A researcher's servers as the home page shows them
(gpulease/core/billing/my_servers.py): their states, and a running server's start to its
millisecond (tests/e2e/test_home_page.py shows the real pages).
"""

from __future__ import annotations

import datetime as dt

from gpulease.core.billing.my_servers import LastFailure, ServerFacts, server_states
from gpulease.core.billing.sessions import Session

NOW = dt.datetime(2025, 3, 1, 12, 0, 0)


def session(server, *, ended=None, reason=None, started=NOW - dt.timedelta(seconds=90),
            profile="h200-1g"):
    return Session(1, "bea", server, profile, "user:bea", 1_200_000, started,
                   NOW - dt.timedelta(seconds=30), ended, reason, None)


def test_server_states():
    facts = [
        ServerFacts("run", ready=True, user_options={"profile": ["h200-1g"]}),
        ServerFacts("wait", pending="spawn", user_options={"profile": "h200-full"}),
        ServerFacts("boot", pending="spawn", user_options={"profile": "cpu"}),
        ServerFacts("nap", user_options={"profile": "h200-1g"}),
        ServerFacts("off", user_options={"profile": "cpu"}),
        ServerFacts("bare", ready=True, started=NOW),
    ]
    latest = {
        "run": session("run"),
        "nap": session("nap", ended=NOW, reason="idle"),
        "off": session("off", ended=NOW, reason="user", profile="cpu"),
    }
    states = server_states(facts, latest, {"h200-1g": 1800}, {"wait": 2, "boot": None}, NOW)
    by = {s.name: s for s in states}
    assert [s.name for s in states] == ["", "bare", "boot", "nap", "off", "run", "wait"]
    assert by[""].state == "stopped" and by[""].profile is None
    run = by["run"]
    assert (run.state, run.profile, run.billed_ms, run.cost_ucr) == (
        "running", "h200-1g", 90_000, 30_000)  # 90 s at 1.20/h
    assert run.to_json() == {"name": "run", "state": "running", "profile": "h200-1g",
                             "started": "2025-03-01T11:58:30Z", "billed_seconds": 90,
                             "billed_ms": 90_000, "cost": "0.030000",
                             "rate_per_hour": "1.200000"}
    assert by["bare"].state == "running" and by["bare"].cost_ucr is None  # not metered
    assert by["wait"].to_json() == {"name": "wait", "state": "queued", "profile": "h200-full",
                                    "position": 2}
    assert by["boot"].to_json() == {"name": "boot", "state": "pending", "profile": "cpu",
                                    "pending": "spawn"}
    assert by["nap"].to_json() == {"name": "nap", "state": "suspended", "profile": "h200-1g",
                                   "reason": "idle",
                                   "reason_text": "Suspended after 30 min idle"}
    assert by["off"].state == "stopped"


def test_a_running_servers_start_is_written_to_its_millisecond():
    # api/me/servers, as api/usage: started + billed_ms is the moment billed to, so
    # the start must keep its milliseconds (it was cut to the second: .120 lost).
    started = NOW - dt.timedelta(seconds=90, milliseconds=-120)
    states = server_states([ServerFacts("run", ready=True)],
                           {"run": session("run", started=started)}, {}, {}, NOW)
    (state,) = [s for s in states if s.name == "run"]
    assert state.to_json()["started"] == "2025-03-01T11:58:30.120Z"
    assert state.to_json()["billed_ms"] == 89_880


def test_a_stopped_servers_last_failed_start_is_shown_until_it_runs_again():
    failed = LastFailure(NOW - dt.timedelta(seconds=30), "it exited before it answered",
                         "ValueError: bad config")
    earlier = session("", ended=NOW - dt.timedelta(seconds=30), reason="start_failed",
                      started=NOW - dt.timedelta(seconds=35))
    later = session("", ended=NOW - dt.timedelta(seconds=5), reason="user",
                    started=NOW - dt.timedelta(seconds=20))
    facts = [ServerFacts(""), ServerFacts("big", pending="spawn")]
    failures = {"": failed, "big": failed}
    (default, big) = server_states(facts, {"": earlier}, {}, {}, NOW, failures)
    assert default.state == "stopped" and default.failed_start == failed
    assert big.state == "pending" and big.failed_start is None  # starting again
    (default, _) = server_states(facts, {"": later}, {}, {}, NOW, failures)
    assert default.failed_start is None  # it ran since
    (default, _) = server_states(facts, {}, {}, {}, NOW, failures)  # not metered
    assert default.failed_start == failed
    assert "failed_start" not in default.to_json() and "log_tail" not in str(default.to_json())
