import datetime as dt

from gpulease.core.billing.sessions import Session
from gpulease.core.billing.suspended import suspended_servers

T = dt.datetime(2026, 11, 30, 12, 0, 0)


def session(server, reason, ended=True, profile="h200-1g"):
    return Session(id=1, user="a", server=server, profile=profile, account="user:a",
                   rate_per_hour_ucr=1, started=T, last_confirmed=T,
                   ended=T if ended else None, end_reason=reason if ended else None,
                   requested_end_reason=None)


def test_only_stopped_servers_whose_last_session_was_suspended():
    latest = {
        "": session("", "idle"),
        "train": session("train", "user"),
        "big": session("big", "out_of_credit"),
        "live": session("live", None, ended=False),
        "again": session("again", "idle"),
    }
    found = suspended_servers(latest, active={"again"}, idle_timeouts={"h200-1g": 1800})
    assert [(s.server, s.reason) for s in found] == [("", "idle"), ("big", "out_of_credit")]
    assert found[0].text == "Suspended after 30 min idle"
    assert found[0].profile == "h200-1g"
