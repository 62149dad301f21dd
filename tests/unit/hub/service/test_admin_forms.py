"""The admin pages' pure parts, without a hub: a profile form to the API's body and back,
its parse errors on their inputs, the audit's diff and paging, the inventory's rows
(tests/e2e/test_admin_pages.py plays the pages on a real hub).
"""

from __future__ import annotations

from gpulease.hub.service.pages import forms as af
from tests.support.pages import profile_form


def _as_form(data: dict) -> dict[str, list[str]]:
    return {k: v if isinstance(v, list) else [v] for k, v in data.items()}


def _catalog():
    from gpulease.images import shipped_catalog
    return shipped_catalog()


def test_form_to_body_keeps_text_for_parse_profile():
    body, errors = af.profile_body(_as_form(profile_form(gpu_count="two", groups=" a, b ,,")), _catalog())
    assert errors == []
    assert body["gpu"] == {"model": "H200", "mig": "1g.18gb", "count": "two"}
    assert body["groups"] == ["a", "b"] and body["images"][0] == "cuda"
    cpu_only, _ = af.profile_body(_as_form(profile_form(gpu_model="", gpu_mig="")), _catalog())
    assert "gpu" not in cpu_only
    _, errors = af.profile_body(_as_form(profile_form(gpu_model="")), _catalog())
    assert [e.field for e in errors] == ["gpu.model"]
    unchecked, _ = af.profile_body(_as_form(profile_form(enabled=None, cpu="")), _catalog(), slug="x")
    assert unchecked["enabled"] is False and "cpu" not in unchecked and unchecked["slug"] == "x"
    none_ticked, errors = af.profile_body(_as_form(profile_form(images=None, default_image="")), _catalog())
    assert "images" not in none_ticked and errors == []  # left out: the catalog's first


def test_the_spot_inputs_round_trip_and_their_errors_land_on_them():
    from gpulease.core.model.profiles import FieldError, parse_profile
    form = profile_form(spot_price_per_hour="0.40", spot_groups="students, lab")
    body, errors = af.profile_body(_as_form(form), _catalog())
    assert errors == [] and body["spot_price_per_hour"] == "0.40"
    assert body["spot_groups"] == ["students", "lab"]
    profile = parse_profile(body, _catalog())
    values = af.profile_form_values(profile)
    assert values["spot_price_per_hour"] == "0.4" and values["spot_groups"] == "students, lab"
    assert af.profile_row(profile)["spot_price"] == "0.4"
    plain, _ = af.profile_body(_as_form(profile_form()), _catalog())
    assert "spot_price_per_hour" not in plain and "spot_groups" not in plain
    by_input, _ = af.field_errors([FieldError("spot_price_per_hour", "too high")])
    assert by_input == {"spot_price_per_hour": ["too high"]}


def test_a_profile_without_images_is_listed_as_offering_the_catalogs_first():
    from gpulease.core.model.profiles import parse_profile
    body, _ = af.profile_body(_as_form(profile_form(images=None, default_image="")), _catalog())
    assert af.profile_row(parse_profile(body, _catalog()))["images"] == "(the catalog's first)"


def test_parse_errors_land_on_their_inputs():
    from gpulease.core.model.profiles import FieldError
    by_input, other = af.field_errors([FieldError("gpu.mig", "bad"), FieldError("memory", "m"),
                                       FieldError("odd", "?")])
    assert by_input == {"gpu_mig": ["bad"], "memory": ["m"]} and other == ["odd: ?"]


def test_audit_diff_and_paging():
    changes = af.diff({"a": 1, "gpu": {"model": "H200", "count": 1}, "gone": "x"},
                      {"a": 1, "gpu": {"model": "H200", "count": 2}, "new": [1]})
    assert [(c.key, c.before, c.after) for c in changes] == [
        ("gone", "x", ""), ("gpu.count", "1", "2"), ("new", "", "[1]")]
    paging = af.Paging(offset=50, limit=50, total=120)
    assert (paging.prev_offset, paging.next_offset) == (0, 100)
    assert (paging.first_shown, paging.last_shown) == (51, 100)
    assert af.Paging(0, 50, 0).prev_offset is None and af.Paging(0, 50, 0).next_offset is None
    assert af.parse_offset("-3") == 0 and af.parse_offset("x") == 0 and af.parse_offset("7") == 7
    # Unicode digits that int() refuses (a 500 of the audit page once) or reads (١٢ = 12)
    assert af.parse_offset("²") == 0 and af.parse_offset("١٢") == 0


def test_inventory_rows_without_a_queue_key():
    view = {"nodes": [{"name": "n", "gpus": [{"model": "H200", "index": 0, "uuid": "G",
                                              "devices": [{"uuid": "G", "profile": None,
                                                           "state": "free", "holder": None}]}]}],
            "gone": [{"uuid": "M", "state": "gone", "holder": {"user": "u", "server": ""}}]}
    rows = af.inventory_rows(view)
    assert [r["device"] for r in rows] == ["full card", ""]
    assert af.inventory_counts(rows) == {"free": 1, "held": 0, "out_of_service": 0, "gone": 1}
    assert af.queue_rows(view) == []
    assert af.queue_rows({"queue": [{"user": "a", "server": "", "profile": "p"}]})[0][
        "position"] == 1
