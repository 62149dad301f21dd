"""Researchers reserving for themselves (GPULeaseHub.reservations_by_researchers on), on
a real hub: their own account only, profiles they may start only, cancelled with the
refund; a period beginning within reservation_lead_time fits beside running servers."""

from __future__ import annotations

import pytest

from tests.e2e.test_reservations import INVENTORY, _hour
from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "3.6",
     "reserved_price_per_hour": "1.8", "min_run": "1m"},
    {"slug": "vision", "display_name": "Vision slice", "groups": ["vision"],
     "gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 1, "memory": "2Gi",
     "images": ["mock"], "price_per_hour": "3.6", "reserved_price_per_hour": "1.8",
     "min_run": "1m"},
]}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, inventory=INVENTORY, mock_catalog=True,
                      args=["--GPULeaseHub.culler_enabled=False",
                            "--GPULeaseHub.reservations_by_researchers=True",
                            "--GPULeaseHub.reservation_lead_time=2h"])


def test_a_researcher_reserves_only_for_themselves_what_they_may_start(hub):
    admin = hub.admin_token
    lee, ann = hub.add_user(admin, "lee"), hub.add_user(admin, "ann")
    body = {"account": "user:lee", "profile": "slice", "units": 1, "start": _hour(3),
            "end": _hour(4)}
    for other in ("user:ann", "group:vision"):
        r = hub.service("POST", "api/reservations", lee, {**body, "account": other})
        assert r.status_code == 403 and "your own account user:lee" in r.text, r.text
    r = hub.service("POST", "api/reservations", lee, {**body, "profile": "vision"})
    assert r.status_code == 403 and "groups vision only" in r.text, r.text
    assert hub.service("GET", "api/reservations", admin).json()["reservations"] == []
    r = hub.service("POST", "api/reservations", lee, body)
    assert r.status_code == 201, r.text
    booked = r.json()
    assert hub.service("GET", "api/balance", lee).json()["balance"] == "98.200000"
    # ann may neither see nor cancel it
    assert hub.service("DELETE", f"api/reservations/{booked['id']}", ann).status_code in (
        403, 404)
    r = hub.service("DELETE", f"api/reservations/{booked['id']}", lee)
    assert r.status_code == 200 and r.json()["refund"] == "1.800000", r.text
    assert hub.service("GET", "api/balance", lee).json()["balance"] == "100.000000"


def test_within_the_lead_time_a_period_fits_beside_running_servers(hub):
    ann, lee = hub.token_for("ann", "ann-pw-12345"), hub.token_for("lee", "lee-pw-12345")
    for server in ("a", "b", "c"):
        r = hub.api("POST", f"users/ann/servers/{server}", ann,
                    {"user_options": {"profile": "slice"}})
        assert r.status_code in (201, 202), r.text
        hub.wait_server_ready("ann", ann, server)
    body = {"account": "user:lee", "profile": "slice", "units": 1}
    r = hub.service("POST", "api/reservations", lee, {**body, "start": _hour(1),
                                                       "end": _hour(2)})
    assert r.status_code == 409 and "reservation_lead_time" in r.text, r.text
    assert hub.service("GET", "api/balance", lee).json()["balance"] == "100.000000"
    r = hub.service("POST", "api/reservations", lee, {**body, "start": _hour(3),
                                                       "end": _hour(4)})
    assert r.status_code == 201, r.text
    hub.service("DELETE", f"api/reservations/{r.json()['id']}", lee)
    for server in ("a", "b", "c"):
        hub.api("DELETE", f"users/ann/servers/{server}", ann)
        hub.wait_server_stopped("ann", ann, server)
