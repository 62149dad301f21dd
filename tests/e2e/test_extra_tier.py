"""End to end: a deployment's own tier (GPULeaseHub.extra_tiers) on a real hub.

The hub's configuration names a fourth tier, `preview`, and the profiles file prices a
slice on it. The hub and the gpulease service both register it: the service lists the
profile with its price, a researcher's REST start on it runs at that price, the
inventory and the session say its name, the usage report by tier shows its label, and a
tier the hub does not know is refused naming the ones it does. Servers are JupyterHub's
mock single-user server (tests/support/isolation_env.py).
"""

from __future__ import annotations

import math

import pytest

from tests.support.hubproc import HubOptions

pytestmark = pytest.mark.e2e

PREVIEW = {"name": "preview", "price_field": "preview_price_per_hour", "label": "Preview",
           "queue_rank": 15, "preemptible": True}
PROFILES = {"profiles": [
    {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
     "cpu": 1, "memory": "2Gi", "images": ["mock"], "price_per_hour": "3.6",
     "preview_price_per_hour": "1.8", "min_run": "1m"},
]}
INVENTORY = {"nodes": [{"name": "local", "gpus": [
    {"model": "H200", "memory": "141Gi", "driver": "580.159", "mig": ["1g.18gb"]},
]}]}


@pytest.fixture(scope="module")
def hub_options() -> HubOptions:
    return HubOptions(profiles=PROFILES, inventory=INVENTORY, mock_catalog=True,
                      config=f"c.GPULeaseHub.extra_tiers = [{PREVIEW!r}]\n",
                      args=["--GPULeaseHub.culler_enabled=False"])


def test_a_start_on_the_deployments_own_tier_runs_at_its_price(hub, admin):
    listed = hub.service("GET", "api/profiles", admin).json()["profiles"]
    (slice_,) = [p for p in listed if p["slug"] == "slice"]  # the service knows the tier
    assert slice_["preview_price_per_hour"] == "1.8", slice_
    token = hub.add_user(admin, "pia")
    r = hub.api("POST", "users/pia/server", token,
                {"user_options": {"profile": "slice", "tier": "cheapest"}})
    assert r.status_code == 400 and "on-demand, spot, preview" in r.json()["message"], r.text
    r = hub.api("POST", "users/pia/server", token,
                {"user_options": {"profile": "slice", "tier": "preview"}})
    assert r.status_code in (201, 202), r.text
    hub.wait_server_ready("pia", token)
    holders = [d["holder"] for n in hub.service("GET", "api/inventory", admin).json()["nodes"]
               for g in n["gpus"] for d in g["devices"] if d["holder"]]
    assert [h["tier"] for h in holders] == ["preview"], holders
    assert hub.api("DELETE", "users/pia/server", token).status_code in (202, 204)
    hub.wait_server_stopped("pia", token)
    (session,) = hub.service("GET", "api/usage", token).json()["sessions"]
    assert session["tier"] == "preview" and session["billed_ms"] > 0, session
    # 1.8 credits an hour: 0.5 µcr a millisecond, not the profile's 3.6
    assert session["cost"] == f"{math.ceil(session['billed_ms'] / 2) / 1e6:.6f}", session
    report = hub.service("GET", "admin/report?by=tier", admin)
    assert report.status_code == 200 and "Preview" in report.text, report.text[-2000:]
