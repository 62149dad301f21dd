"""A deployment's own tiers, as an admin writes them (GPULeaseHub.extra_tiers): each entry
read into a Tier record with a clear refusal naming what is wrong, registered all or
nothing, and a preemptible tier always below on-demand (tests/e2e/test_extra_tier.py
starts a hub with one)."""

from __future__ import annotations

import pytest

from gpulease.core.tiers import (
    ON_DEMAND,
    Tier,
    as_config,
    register_all,
    registered,
    tier,
    tier_from_config,
    unregister,
)

PREVIEW = {"name": "preview", "price_field": "preview_price_per_hour", "label": "Preview",
           "queue_rank": 15, "preemptible": True, "priority_class": "preview"}


@pytest.fixture
def clean_registry():
    before = registered()
    yield
    for record in registered():
        if record not in before:
            unregister(record.name)


def test_an_entry_is_read_into_its_record_and_back():
    record = tier_from_config(PREVIEW)
    assert record == Tier("preview", "preview_price_per_hour", "Preview", 15,
                          preemptible=True, priority_class="preview")
    assert tier_from_config(as_config(record)) == record


@pytest.mark.parametrize("entry, words", [
    ("preview", "a tier is a mapping of name, price_field"),
    ({**PREVIEW, "rank": 1}, "unknown key(s) rank; allowed: name, price_field, label"),
    ({"name": "x", "label": "X"}, "missing price_field, queue_rank (required: name,"),
    ({**PREVIEW, "queue_rank": "15"}, "queue_rank takes int, got '15'"),
    ({**PREVIEW, "queue_rank": True}, "queue_rank takes int, got True"),
    ({**PREVIEW, "preemptible": "yes"}, "preemptible takes bool, got 'yes'"),
    ({**PREVIEW, "priority_class": 3}, "priority_class takes str or null, got 3"),
])
def test_a_bad_entry_is_refused_naming_what_is_wrong(entry, words):
    with pytest.raises(ValueError) as refused:
        tier_from_config(entry)
    assert words in str(refused.value)


def test_the_list_is_registered_all_or_nothing(clean_registry):
    clash = {**PREVIEW, "name": "other", "price_field": "spot_price_per_hour"}
    with pytest.raises(ValueError, match=r"tier 'other': price field "
                       r"'spot_price_per_hour' is tier spot's"):
        register_all([PREVIEW, clash])
    assert "preview" not in [t.name for t in registered()]  # nothing half-registered
    with pytest.raises(ValueError, match=r"tier 2: unknown key"):
        register_all([PREVIEW, {**PREVIEW, "x": 1}])
    assert "preview" not in [t.name for t in registered()]


def test_registering_the_same_list_again_keeps_it(clean_registry):
    """The hub and a service built in the same process (tests) register it twice."""
    assert register_all([PREVIEW]) == register_all([PREVIEW]) == [tier("preview")]
    with pytest.raises(ValueError, match="registered already"):
        register_all([{**PREVIEW, "label": "Another"}])


def test_a_preemptible_tier_ranks_below_on_demand(clean_registry):
    rank = tier(ON_DEMAND).queue_rank
    with pytest.raises(ValueError, match=rf"ranks below on-demand \(queue_rank below "
                       rf"{rank}\), got {rank}"):
        register_all([{**PREVIEW, "queue_rank": rank}])
    register_all([{**PREVIEW, "queue_rank": rank, "preemptible": False}])  # not preemptible
