"""Right-sizing advice (issue 47, item 3): the pure rule in gpulease/core/policy/right_sizing.py."""

from __future__ import annotations

import dataclasses

import pytest

from gpulease.core.model.gpu_models import GiB
from gpulease.core.model.profiles import SAMPLE_PROFILES, GpuSpec, load_profiles_file
from gpulease.core.policy.right_sizing import (
    Offer,
    ProfileUse,
    SessionUse,
    Thresholds,
    advise,
    offer_from,
    profile_report,
)
from gpulease.images import shipped_catalog

HOUR = 3_600_000
CPU, SLICE, FULL = load_profiles_file(SAMPLE_PROFILES, shipped_catalog())


def h200(slug: str, mig: str | None, count: int, memory_gib: int, compute: int,
         credits_per_hour: float, usable: bool = True) -> Offer:
    return Offer(slug=slug, model="H200", mig=mig, count=count, memory_bytes=memory_gib * GiB,
                 compute=compute, rate_per_hour_ucr=int(credits_per_hour * 1_000_000),
                 usable=usable)


G1 = h200("g1", "1g.18gb", 1, 18, 1, 1.2)
G2 = h200("g2", "2g.35gb", 1, 35, 2, 2.4)
G3 = h200("g3", "3g.71gb", 1, 71, 3, 3.6)
FULL1 = h200("full1", None, 1, 141, 7, 8.0)
FULL2 = h200("full2", None, 2, 282, 14, 16.0)
OFFERS = [G3, G2, G1, FULL1, FULL2]


def use(profile: str, ms: int, mean: float | None, peak: float | None, memory: int | None,
        read: float = 1.0, **more) -> SessionUse:
    """A session whose readings stood for `read` of it (1.0: all of it)."""
    return SessionUse(profile, ms, mean, peak, memory, activity_read_ms=int(ms * read),
                      memory_read_ms=int(ms * read), **more)


def on(profile: str, *peaks_gib: float, ms: int = HOUR, activity: float | None = 5.0,
       **more):
    return [use(profile, ms, activity, activity, int(p * GiB), **more) for p in peaks_gib]


def test_offer_from_profiles():
    assert offer_from(CPU) is None  # nothing to right-size
    s = offer_from(SLICE)
    # What the slice really holds, not its name's 18: at most 7/8 of it where unlisted
    assert (s.memory_bytes, s.compute, s.rate_per_hour_ucr, s.usable) == (
        int(18 * GiB * 0.875), 1, 1_200_000, True)
    two = offer_from(dataclasses.replace(FULL, gpu=GpuSpec("H200", None, 2), enabled=False))
    assert (two.memory_bytes, two.compute, two.usable, two.label) == (
        2 * int(141 * GiB * 0.93), 14, False, "2× H200")
    assert offer_from(FULL, usable=False).usable is False


def test_advice_only_when_every_session_fits():
    # 20 GiB is over 90 % of 1g.18gb: 2g.35gb is the cheapest every session fits.
    assert advise(on("g3", 10, 10, 20), G3, OFFERS).profile == "g2"
    # One session over 2g.35gb's 31.5 GiB: nothing smaller fits them all.
    assert advise(on("g3", 10, 10, 32), G3, OFFERS) is None


def test_a_session_without_a_memory_reading_makes_advice_impossible():
    uses = [*on("g3", 5, 5), use("g3", HOUR, 5.0, 5.0, None)]
    assert advise(uses, G3, OFFERS) is None


def test_the_cheapest_fitting_candidate_usable_and_of_the_same_model():
    cheaper_elsewhere = Offer("a100-1g", "A100-80GB", "1g.10gb", 1, 10 * GiB, 1, 500_000)
    off = dataclasses.replace(G1, slug="g1-off", rate_per_hour_ucr=1_000_000, usable=False)
    advice = advise(on("g3", 4, 4, 4), G3, [G3, G2, cheaper_elsewhere, off, G1])
    assert advice.profile == "g1"


def test_memory_just_over_90_percent_refuses():
    limit = 18 * GiB * 9 // 10  # 17394617548.8 bytes: floor fits, one more byte does not
    at = [use("g3", HOUR, 5.0, 5.0, limit)] * 3
    over = [*at[:2], use("g3", HOUR, 5.0, 5.0, limit + 1)]
    assert advise(at, G3, [G3, G1]).profile == "g1"
    assert advise(over, G3, [G3, G1]) is None


def test_savings_exact_in_ucr_each_bill_rounded_as_billed():
    uses = [use("g3", ms, 10.0, 20.0, 2 * GiB) for ms in (3_600_001, 1_234_567, 2_000_000)]
    advice = advise(uses, G3, OFFERS)
    # At 3.60/h: 6_834_568 µcr; at 1.20/h, each ceil(ms / 3): 2_278_191. (One ms_cost of
    # the rate difference would give 4_556_380.)
    assert advice.saved_ucr == 4_556_377
    assert (advice.sessions, advice.fitted) == (3, 3)
    assert advice.hours == pytest.approx(6_834_568 / HOUR)
    assert advice.text == ("Your last 3 sessions on H200 3g.71gb peaked at 2.0 GiB of GPU memory,"
                           " and averaged at most 10 % of its compute: H200 1g.18gb would have"
                           " fitted and saved 4.556377 credits.")


def test_activity_unknown_says_how_much_slower_it_may_run():
    advice = advise(on("g3", 4, 4, 4, activity=None), G3, OFFERS)
    assert (advice.profile, advice.slower_up_to, advice.speed_known) == ("g1", 3.0, False)
    assert "fits in memory; may run up to 3× slower" in advice.text
    # One session unread among quiet ones: speed still cannot be judged.
    mixed = [*on("g3", 4, 4), *on("g3", 4, activity=None)]
    assert advise(mixed, G3, OFFERS).slower_up_to == 3.0


def test_activity_scaled_under_the_threshold_is_not_slower():
    advice = advise(on("g3", 4, 4, 4, activity=25.0), G3, OFFERS)  # 25 % × 3 = 75 %
    assert (advice.profile, advice.slower_up_to, advice.speed_known) == ("g1", None, True)
    assert "slower" not in advice.text


def test_activity_scaled_over_the_threshold_passes_the_candidate_over():
    advice = advise(on("g3", 4, 4, 4, activity=30.0), G3, OFFERS)  # 90 % on 1g, 45 % on 2g
    assert (advice.profile, advice.slower_up_to, advice.speed_known) == ("g2", None, True)
    assert advise(on("g3", 4, 4, 4, activity=60.0), G3, OFFERS) is None  # 90 % on 2g too


def test_too_few_sessions_or_hours():
    assert advise(on("g3", 4, 4), G3, OFFERS) is None  # 2 sessions
    assert advise(on("g3", 4, 4, 4, ms=HOUR // 4), G3, OFFERS) is None  # 0.75 h
    assert advise(on("g3", 4, 4, 4, ms=HOUR // 3), G3, OFFERS).profile == "g1"  # 1 h
    # Sessions on other profiles are not counted.
    assert advise([*on("g3", 4, 4), *on("g2", 4, 4)], G3, OFFERS) is None


def test_no_smaller_offer():
    assert advise(on("g1", 1, 1, 1), G1, OFFERS) is None
    dearer = dataclasses.replace(G1, rate_per_hour_ucr=G3.rate_per_hour_ucr)
    assert advise(on("g3", 1, 1, 1), G3, [G3, dearer]) is None


def test_full_cards_two_to_one():
    advice = advise(on("full2", 100, 90, 120, activity=30.0), FULL2, OFFERS)  # 60 % on one card
    assert (advice.profile, advice.slower_up_to, advice.speed_known) == ("full1", None, True)
    assert advice.saved_ucr == 3 * 8_000_000
    assert "2× H200" in advice.text and "1× H200 would have fitted" in advice.text
    assert advise(on("full2", 100, 90, 127, activity=30.0), FULL2, OFFERS) is None  # > 126.9 GiB
    assert advise(on("full2", 100, 90, 120, activity=45.0), FULL2, OFFERS) is None  # 90 % busy


def test_a_lower_fit_share_counts_only_the_sessions_that_fit():
    t = Thresholds(fit_share=0.75)
    advice = advise(on("g3", 4, 4, 4, 40), G3, OFFERS, t)
    assert (advice.profile, advice.fitted, advice.saved_ucr) == ("g1", 3, 3 * 2_400_000)
    assert "would have fitted 3 of them" in advice.text
    with pytest.raises(ValueError):
        Thresholds(memory_headroom=1.5)


def test_admin_report_shares():
    uses = {
        # Two idle (under 5 %), one busy, one unread; three fit 1g.18gb, one 32 GiB fits none.
        "g3": [*on("g3", 4, 4, activity=1.0), *on("g3", 4, activity=90.0),
               *on("g3", 32, activity=None)],
        "g1": on("g1", 10, 10, 10, activity=50.0),
        "cpu": [use("cpu", HOUR, None, None, None)],  # no offer: left out
    }
    report = profile_report(uses, OFFERS)
    assert [r.profile for r in report] == ["g1", "g3"]
    g1, g3 = report
    assert g3 == ProfileUse(profile="g3", sessions=4, hours=4.0, mean_activity=pytest.approx(92 / 3),
                            p95_activity=90.0, idle_share=pytest.approx(2 / 3),
                            fits_smaller_share=0.75, advice=None)
    assert (g1.idle_share, g1.fits_smaller_share, g1.advice) == (0.0, 0.0, None)
    quiet = profile_report({"g3": on("g3", 4, 4, 4, activity=2.0)}, OFFERS)[0]
    assert (quiet.idle_share, quiet.fits_smaller_share, quiet.advice) == (1.0, 1.0, "g1")


def test_only_sessions_the_readings_covered_are_counted():
    # One reading of a long session says little: under half of it read, it is not counted.
    assert advise(on("g3", 4, 4, 4, read=0.49), G3, OFFERS) is None
    assert advise(on("g3", 4, 4, 4, read=0.5), G3, OFFERS).profile == "g1"
    # Three well read, one barely: advice counts the three and says so.
    advice = advise([*on("g3", 4, 4, 4), *on("g3", 4, read=0.1)], G3, OFFERS)
    assert (advice.profile, advice.sessions, advice.saved_ucr) == ("g1", 3, 3 * 2_400_000)
    assert advice.text.startswith("3 of your last 4 sessions on H200 3g.71gb (those the GPU "
                                  "readings covered) peaked at 4.0 GiB")
    # ...but a barely read session whose reading already shows it would not fit 1g.18gb
    # (17 GiB > 16.2) speaks against 1g: 2g.35gb is the advice.
    advice = advise([*on("g3", 4, 4, 4), *on("g3", 17, read=0.1)], G3, OFFERS)
    assert advice.profile == "g2"
    # Activity read too little: the speed is not known, whatever its mean.
    thin = [SessionUse("g3", HOUR, 90.0, 90.0, 4 * GiB, activity_read_ms=0,
                       memory_read_ms=HOUR)] * 3
    slow = advise(thin, G3, OFFERS)
    assert (slow.profile, slow.speed_known, slow.slower_up_to) == ("g1", False, 3.0)


def test_a_busy_peak_says_its_busiest_moments_may_be_slower():
    # Mean 20 % × 3 = 60 %: keeps up on average; a peak of 50 % × 3 = 150 % does not.
    uses = [use("g3", HOUR, 20.0, 50.0, 4 * GiB)] * 3
    advice = advise(uses, G3, OFFERS)
    assert (advice.profile, advice.speed_known, advice.slower_up_to) == ("g1", True, 3.0)
    assert "(its busiest moments may run up to 3× slower)" in advice.text
    assert "averaged at most 20 % of its compute" in advice.text


def test_the_saving_is_of_what_each_session_was_billed_on_its_tier():
    spot_g3 = dataclasses.replace(G3, tier_rates=(("spot", 1_800_000),))
    spot_g1 = dataclasses.replace(G1, tier_rates=(("spot", 600_000),))
    offers = [spot_g3, G2, spot_g1]
    spot = on("g3", 4, 4, 4, tier="spot", rate_per_hour_ucr=1_800_000)
    # Billed 1.80/h on spot; 1g.18gb on spot is 0.60/h: 1.20 saved an hour, not 2.40.
    assert advise(spot, spot_g3, offers).saved_ucr == 3 * 1_200_000
    # A rate fixed at start is what was billed, whatever the offer says today.
    old = on("g3", 4, 4, 4, rate_per_hour_ucr=3_000_000)
    assert advise(old, G3, OFFERS).saved_ucr == 3 * (3_000_000 - 1_200_000)
    # Reserved units are paid for by their reservation: nothing saved by the millisecond.
    assert advise(on("g3", 4, 4, 4, tier="reserved", rate_per_hour_ucr=0), G3, OFFERS) is None
    # A candidate without a spot price: its on-demand price is what it would have cost.
    advice = advise(spot, spot_g3, [spot_g3, G1])
    assert advice.saved_ucr == 3 * (1_800_000 - 1_200_000)


def test_offer_from_a_profile_carries_its_other_tiers_prices():
    spot = dataclasses.replace(SLICE, spot_price_per_hour_ucr=400_000)
    offer = offer_from(spot)
    assert offer.tier_rates == (("spot", 400_000),)
    assert (offer.rate_on("spot"), offer.rate_on("on-demand")) == (400_000, 1_200_000)


def test_admin_report_says_nothing_of_fit_where_nothing_was_read():
    report = profile_report({"g3": [use("g3", HOUR, None, None, None)] * 2}, OFFERS)[0]
    assert (report.fits_smaller_share, report.mean_activity, report.idle_share) == (None, None, None)


def test_a_slice_is_judged_by_what_it_really_holds_not_its_name():
    """An H200 1g.18gb holds 16.00 GiB (nvidia-smi mig -lgip): 90 % of its name's 18 GiB
    (16.2) would let a 16.1 GiB peak be told it fits."""
    one_g = offer_from(SLICE)  # the sample profiles' H200 1g.18gb
    two_g = dataclasses.replace(one_g, slug="g2", mig="2g.35gb", compute=2,
                                memory_bytes=offer_from(dataclasses.replace(
                                    SLICE, gpu=GpuSpec("H200", "2g.35gb", 1))).memory_bytes,
                                rate_per_hour_ucr=2_400_000)
    assert one_g.memory_bytes < 16 * GiB
    uses = [use("g2", HOUR, 5.0, 5.0, int(16.1 * GiB))] * 3
    assert advise(uses, two_g, [two_g, one_g]) is None
    # Where the listing is published (H100 80GB), its figure: 1g.10gb holds 9.75 GiB.
    h100 = offer_from(dataclasses.replace(SLICE, gpu=GpuSpec("H100-80GB", "1g.10gb", 1)))
    assert h100.memory_bytes == int(9.75 * GiB)


def test_a_busy_session_whose_memory_was_not_read_still_rules_out_a_slower_slice():
    """Activity read throughout at 95 % (say, DCGM without its memory series): that
    session is not counted, but 7× fewer slices would plainly have been slower."""
    counted = on("full1", 4, 4, 4, activity=5.0)
    busy = SessionUse("full1", HOUR, 95.0, 99.0, None, activity_read_ms=HOUR, memory_read_ms=0)
    assert advise(counted, FULL1, OFFERS).profile == "g1"
    assert advise([*counted, busy], FULL1, OFFERS) is None


def test_a_whole_card_counts_for_what_a_program_gets():
    """nvidia-smi's total where published (an A10G's 23028 MiB of its 24 GiB), an H100 as
    its 7g.80gb instance (79.25 GiB), else 93 % of the nominal size."""
    from gpulease.core.model.gpu_models import card_usable_bytes

    assert card_usable_bytes("A10G") == 23028 * 2**20
    assert card_usable_bytes("H100-80GB") == int(79.25 * GiB)
    assert card_usable_bytes("H200") == int(141 * GiB * 0.93)
    assert card_usable_bytes("no-such-card") is None
