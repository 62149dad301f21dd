"""The reservations page's pure parts: a form sends the API's body, a price row says what
one unit is (tests/e2e/test_reservation_pages.py plays the page on a real hub).
"""

from __future__ import annotations

from gpulease.hub.service.pages.reservations import form_body, price_row


def test_a_form_sends_the_apis_body():
    values = {"account": "user:lee", "profile": "slice", "units": "3", "start": "s",
              "end": "e", "on_end": "continue", "note": ""}
    assert form_body(values)["units"] == 3
    for text in ("two", "", "²", "1.5", "9" * 12):  # the API's check names these
        assert form_body({**values, "units": text})["units"] == text


def test_a_price_row_says_what_one_unit_is():
    from gpulease.core.model.profiles import parse_profile
    from gpulease.images import shipped_catalog
    spec = {"slug": "pair", "display_name": "Pair", "gpu": {"model": "H200", "count": 2},
            "cpu": 1, "memory": "1Gi", "images": ["pytorch"], "price_per_hour": "8",
            "reserved_price_per_hour": "5"}
    profile = parse_profile(spec, shipped_catalog())
    row = price_row(profile, {("H200", None): [5]})
    assert row["unit"] == "2 H200 full cards" and row["reserved"] == "5.000000"
    assert row["units_in_all"] == 2  # whole units: 5 cards hold two pairs
    # a unit is on one node: two nodes of 3 cards hold two pairs, not three
    assert price_row(profile, {("H200", None): [3, 3]})["units_in_all"] == 2
    assert price_row(profile, None)["units_in_all"] == ""
