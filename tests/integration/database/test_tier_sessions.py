"""A session on one more registered Tier record (issue "One way down"): recorded at its
price, listed and reported by tier with its label, on SQLite and PostgreSQL (the rest of
what the record drives: tests/unit/core/test_tier_record.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from gpulease.core.billing.rules import BillingError
from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file, parse_profile
from gpulease.core.policy.options import resolve_user_options
from gpulease.core.tiers import Tier, registered_tier
from gpulease.hub.service import billing_views as bv
from gpulease.images import shipped_catalog
from gpulease.store.billing_reports import report, usage
from gpulease.store.sessions import SessionLedger

# (as tests/unit/core/test_tier_record.py registers it)
PREVIEW = Tier("preview", price_field="preview_price_per_hour", label="Preview",
               queue_rank=15, preemptible=True, priority_class="preview")
CATALOG = shipped_catalog()
FULL_PROFILE = load_profiles_file(SAMPLE_PROFILES, CATALOG)[2]
T0 = dt.datetime(2024, 3, 1)


@pytest.fixture
def preview():
    with registered_tier(PREVIEW) as record:
        yield record


def test_a_session_on_it_is_recorded_and_reported_with_its_label(engine, preview):
    spec = {**FULL_PROFILE.to_spec(), "slug": "h200-preview", "preview_price_per_hour": "0.70"}
    profile = parse_profile(spec, CATALOG)
    choice = resolve_user_options({"profile": profile.slug, "tier": "preview"}, user="al",
                                  user_groups=set(), profiles=[profile], catalog=CATALOG,
                                  default_profile=None)
    meter = SessionLedger(engine)
    opened = meter.open("al", "", profile.slug, "user:al", choice.rate_per_hour_ucr, T0,
                        tier=choice.tier)
    assert opened.tier == "preview"
    meter.close(opened.id, T0 + dt.timedelta(hours=1), "user")
    od = meter.open("bo", "", profile.slug, "user:bo", profile.price_per_hour_ucr, T0)
    meter.close(od.id, T0 + dt.timedelta(hours=1), "user")
    listed = usage(engine, user="al").sessions
    assert [(s["tier"], s["cost"]) for s in listed] == [("preview", 700_000)]
    rows = bv.report_view(report(engine, since=None, until=None, group_by="tier"), "tier")
    assert [(r["key"], r["label"], r["cost"]) for r in rows] == [
        ("on-demand", "On demand", "8.000000"), ("preview", "Preview", "0.700000")]


def test_a_tier_no_record_is_registered_under_is_refused(engine):
    with pytest.raises(BillingError, match="'preview' is not one of on-demand, spot, reserved"):
        SessionLedger(engine).open("al", "", "p", "user:al", 1, T0, tier="preview")
