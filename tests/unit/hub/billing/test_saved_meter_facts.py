"""A server found running with no session after a hub restart is metered from what is
saved (hub/billing/server_control.py saved_meter_facts): on its reservation only while its user
still holds it."""

import datetime as dt
from types import SimpleNamespace

from gpulease.core.capacity.reservation_rules import Reservation
from gpulease.core.model.profiles import parse_profile
from gpulease.hub.billing.server_control import saved_meter_facts
from gpulease.images import shipped_catalog
from gpulease.store.assignments import Holder

T0 = dt.datetime(2026, 12, 7, 9)
PROFILE = parse_profile({"slug": "slice", "display_name": "Slice",
                         "gpu": {"model": "H200", "mig": "1g.18gb"}, "cpu": 1,
                         "memory": "1Gi", "price_per_hour": "3.6",
                         "reserved_price_per_hour": "1.8"}, shipped_catalog())
LAB = Reservation(4, "group:lab", "slice", ("H200", "1g.18gb"), 1, 1, T0,
                  T0 + dt.timedelta(hours=2), 1_800_000)


def _ctx(active):
    held = {"MIG-1": Holder("lee", "", "slice", T0, tier="reserved", reservation_id=4)}
    return SimpleNamespace(
        profiles=SimpleNamespace(get=lambda slug: PROFILE if slug == "slice" else None,
                                 get_default_profile=lambda user: None),
        assignments=SimpleNamespace(held=lambda: held),
        reservations=SimpleNamespace(active=lambda: active))


def test_a_member_goes_on_on_the_reservation_and_a_former_member_on_demand():
    options = {"profile": "slice"}
    assert saved_meter_facts(_ctx([LAB]), "lee", options, "", {"lab"}) == (
        "slice", "group:lab", 0, "reserved", 4)
    # left the group since (attack pass: kept running unbilled until the end)
    assert saved_meter_facts(_ctx([LAB]), "lee", options, "", set()) == (
        "slice", "user:lee", 3_600_000, "on-demand", None)
    # the reservation is over
    assert saved_meter_facts(_ctx([]), "lee", options, "", {"lab"})[3] == "on-demand"
