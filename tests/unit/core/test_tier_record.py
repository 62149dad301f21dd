"""One more Tier record, registered, drives every place a tier matters (issue "One way
down"): its price, the queue's order, preemption, the pod's label and PriorityClass,
sessions and the usage report (its database part in
tests/integration/database/test_tier_sessions.py). Each check fails where the code still spells the three
built-in tiers instead of reading the record."""

from __future__ import annotations

import dataclasses

import pytest
from traitlets.config import Config

from gpulease.core.capacity.cluster_inventory import ClusterInventory, ClusterNode, hold_from_pod
from gpulease.core.capacity.preemption import plan_preemptions, spot_holdings
from gpulease.core.capacity.queue import Waiting, plan, position, served_order
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import parse_declared_inventory
from gpulease.core.model.profiles import (
    SAMPLE_PROFILES,
    ProfileError,
    load_profiles_file,
    parse_profile,
)
from gpulease.core.policy.options import OptionsRefused, options_summary, resolve_user_options
from gpulease.core.tiers import (
    ALL_TIERS,
    REQUESTABLE,
    TIER_LABEL,
    Tier,
    UnknownTier,
    may_preempt,
    register,
    registered_tier,
    tier,
)
from gpulease.hub.config.cluster_shape import banner_lines
from gpulease.hub.service import billing_views as bv
from gpulease.images import shipped_catalog
from gpulease.spawners.kube.pod_spec import tier_pod, unmapped_priority_classes
from gpulease.spawners.start.options_form import FormData, render_options_form

PREVIEW = Tier("preview", price_field="preview_price_per_hour", label="Preview",
               queue_rank=15, preemptible=True, priority_class="preview")
CATALOG = shipped_catalog()
_, SLICE_PROFILE, FULL_PROFILE = load_profiles_file(SAMPLE_PROFILES, CATALOG)
CARD = DeviceRequest("H200")
TWO_CARDS = parse_declared_inventory(
    {"nodes": [{"name": "a", "gpus": [{"model": "H200"}, {"model": "H200"}]}]}, "test")


def _card(i: int) -> str:
    return f"GPU-declared-a-{i}"


@pytest.fixture(autouse=True)
def preview():
    with registered_tier(PREVIEW) as record:
        yield record
    assert "preview" not in ALL_TIERS  # unregistered again: other tests see three tiers


def _preview_profile(price: str = "0.70", **more) -> dict:
    spec = FULL_PROFILE.to_spec()
    return {**spec, "slug": "h200-preview", "preview_price_per_hour": price, **more}


def test_the_registry_names_it_with_the_built_in_tiers():
    assert tier("preview") is PREVIEW
    assert list(ALL_TIERS) == ["on-demand", "spot", "reserved", "preview"]
    assert list(REQUESTABLE) == ["on-demand", "spot", "preview"]
    assert may_preempt(tier("on-demand"), PREVIEW) and may_preempt(PREVIEW, tier("spot"))
    assert not may_preempt(PREVIEW, PREVIEW) and not may_preempt(tier("spot"), PREVIEW)
    with pytest.raises(UnknownTier, match="allowed: on-demand, spot, reserved, preview"):
        tier("gold")
    with pytest.raises(ValueError, match="registered already"):
        register(PREVIEW)
    with pytest.raises(ValueError, match="tier spot's"):
        register(dataclasses.replace(PREVIEW, name="other", price_field="spot_price_per_hour"))


def test_its_price_field_is_parsed_and_a_start_on_it_is_charged_its_price():
    profile = parse_profile(_preview_profile(), CATALOG)
    assert profile.price_of("preview") == 700_000 and profile.offers("preview")
    assert profile.to_spec()["preview_price_per_hour"] == "0.7"
    assert parse_profile(profile.to_spec(), CATALOG) == profile
    choice = resolve_user_options({"profile": "h200-preview", "tier": "preview"}, user="al",
                                  user_groups=set(), profiles=[profile], catalog=CATALOG,
                                  default_profile=None)
    assert choice.tier == "preview" and choice.rate_per_hour_ucr == 700_000
    assert "preview: may be interrupted" in options_summary(choice)
    # preemptible, as spot: below the on-demand price, and on GPU profiles only
    with pytest.raises(ProfileError, match="preview is the cheaper, interruptible tier"):
        parse_profile(_preview_profile("9.00"), CATALOG)
    with pytest.raises(OptionsRefused, match="offers no preview tier"):
        resolve_user_options({"profile": SLICE_PROFILE.slug, "tier": "preview"}, user="al",
                             user_groups=set(), profiles=[SLICE_PROFILE], catalog=CATALOG,
                             default_profile=None)


def test_the_queue_serves_it_between_on_demand_and_spot():
    queue = [Waiting("spot", CARD, tier="spot"), Waiting("preview", CARD, tier="preview"),
             Waiting("paying", CARD)]
    assert [w.key for w in served_order(queue)] == ["paying", "preview", "spot"]
    assert position(queue, "preview") == 2
    # one card free: the on-demand start gets it, then the preview start the next
    decided = plan(queue, TWO_CARDS, {_card(0)})
    assert [key for key, _ in decided.start] == ["paying"]
    assert plan(queue[:2], TWO_CARDS, {_card(0)}).start[0][0] == "preview"
    # a preemptible tier's start is withheld nothing by reservations (it yields to them)
    assert Waiting("p", CARD, tier="preview").yields and not Waiting("o", CARD).yields


def test_preemption_by_rank_the_lowest_tier_first():
    held = {_card(0): ("s", 1.0), _card(1): ("p", 2.0)}
    holdings = spot_holdings(held, TWO_CARDS, {"s", "p"}, {"s": "spot", "p": "preview"})
    # on demand: the spot server goes first, though the preview one started later
    chosen = plan_preemptions([("od", CARD)], TWO_CARDS, set(held), holdings).chosen
    assert [p.victims for _, p in chosen] == [("s",)]
    # a preview start preempts the spot server; never another preview server
    chosen = plan_preemptions([("pv", CARD)], TWO_CARDS, set(held), holdings,
                              tier_of={"pv": "preview"}).chosen
    assert [p.victims for _, p in chosen] == [("s",)]
    only_preview = [h for h in holdings if h.key == "p"]
    assert plan_preemptions([("pv", CARD)], TWO_CARDS, set(held), only_preview,
                            tier_of={"pv": "preview"}).chosen == []
    chosen = plan_preemptions([("od", CARD)], TWO_CARDS, set(held), only_preview).chosen
    assert [p.victims for _, p in chosen] == [("p",)]


def test_its_pod_carries_its_label_priority_class_and_time_to_save():
    pod = tier_pod("preview", "lab-on-demand", "lab-spot", 120,
                   priority_classes={"preview": "lab-preview"})
    assert pod.priority_class == "lab-preview" and pod.labels == {TIER_LABEL: "preview"}
    assert pod.pre_stop_sleep_s == 120 and pod.termination_grace_s == 130
    # the cluster reads it back from the label, and it yields to on-demand pods
    manifest = {"metadata": {"namespace": "ns", "name": "jupyter-al",
                             "labels": {TIER_LABEL: "preview",
                                        "hub.jupyter.org/username": "al"}},
                "spec": {"nodeName": "n1", "containers": [
                    {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    hold = hold_from_pod(manifest, "ns")
    assert hold.tier == "preview" and hold.preemptible
    node = ClusterNode("n1", "H200", "mixed", "", {"nvidia.com/gpu": 1})
    inventory = ClusterInventory((node,), (hold,))
    assert inventory.yielding_to("on-demand").free()["n1"]["nvidia.com/gpu"] == 1
    assert inventory.yielding_to("preview").free()["n1"]["nvidia.com/gpu"] == 0


def test_the_usage_report_by_tier_shows_its_label():
    rows = bv.report_view([{"key": "preview", "sessions": 1, "billed_seconds": 3600,
                            "billed_ms": 3_600_000, "cost": 700_000}], "tier")
    assert rows[0]["label"] == "Preview" and rows[0]["cost"] == "0.700000"
    # (a session on it, recorded and reported from the database:
    # tests/integration/database/test_tier_sessions.py)


def test_the_spawn_form_offers_it_by_its_label_and_price():
    profile = parse_profile(_preview_profile(), CATALOG)
    html = render_options_form(FormData(profiles=[profile], images={},
                                        tiers={profile.slug: ("preview",)}))
    assert '<select name="tier_h200-preview"' in html
    assert '<option value="on-demand" selected>On demand — ' in html
    assert '<option value="preview">Preview — 0.70 credits/h: may be interrupted' in html


def test_a_cluster_that_names_no_priority_class_for_it_is_warned_at_start():
    config = Config()
    config.GPUKubeSpawner.on_demand_priority_class = "gl-on-demand"
    config.GPUKubeSpawner.spot_priority_class = "gl-spot"
    warned = [line for line in banner_lines("gl", config) if line.startswith("Warning:")]
    assert warned == ["Warning: tier preview's pods take the cluster's default priority: "
                      "GPUKubeSpawner.tier_priority_classes names no PriorityClass for "
                      "'preview' (its record's priority_class)"]
    config.GPUKubeSpawner.tier_priority_classes = {"preview": "gl-preview"}
    assert not [line for line in banner_lines("gl", config) if line.startswith("Warning:")]
    # a cluster without PriorityClasses at all: every pod takes the default, nothing to warn
    assert unmapped_priority_classes("", "", {}) == []
    # spot's own class unset while on demand's is: spot's pods are warned of too
    assert [w.split("'s")[0] for w in unmapped_priority_classes("gl-on-demand", "", {})] == [
        "tier spot", "tier preview"]
