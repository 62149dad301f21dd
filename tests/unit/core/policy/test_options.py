import dataclasses

import pytest

from gpulease.core.model.catalog import Catalog
from gpulease.core.model.profiles import SAMPLE_PROFILES, load_profiles_file
from gpulease.core.policy.options import (
    ALLOWED_KEYS,
    OptionsRefused,
    ServerChoice,
    options_summary,
    price_text,
    resolve_user_options,
    resolved_options,
)
from gpulease.images import shipped_catalog

CATALOG = shipped_catalog()
CPU, SLICE, FULL = load_profiles_file(SAMPLE_PROFILES, CATALOG)
STAFF_ONLY = dataclasses.replace(FULL, slug="staff-full", groups=("staff", "ml"))
OFF = dataclasses.replace(SLICE, slug="off", enabled=False)
PROFILES = [FULL, SLICE, CPU, STAFF_ONLY, OFF]


def resolve(options, *, groups=(), profiles=PROFILES, default=None, catalog=CATALOG, **kwargs):
    return resolve_user_options(
        options, user="alice", user_groups=set(groups), profiles=profiles, catalog=catalog,
        default_profile=default, **kwargs,
    )


def refused(options, **kwargs) -> OptionsRefused:
    with pytest.raises(OptionsRefused) as info:
        resolve(options, **kwargs)
    error = info.value
    assert error.message and str(error) == error.message
    assert error.errors and error.errors[0].message == error.message
    return error


def test_allowed_keys():
    assert ALLOWED_KEYS == ("profile", "image", "account", "tier")


def test_full_request():
    choice = resolve({"profile": "h200-1g", "image": "tensorrt-llm"})
    assert choice == ServerChoice(SLICE, CATALOG.get("tensorrt-llm"), "user:alice", "request")


def test_default_image_is_the_first_offered():
    assert resolve({"profile": "h200-full"}).image.name == "pytorch"


def test_a_profile_without_images_starts_the_catalogs_first_and_offers_only_it():
    bare = dataclasses.replace(SLICE, images=())
    assert resolve({"profile": "h200-1g"}, profiles=[bare]).image == CATALOG.images[0]
    error = refused({"profile": "h200-1g", "image": "cuda"}, profiles=[bare])
    assert f"choose one of: {CATALOG.images[0].name}" in error.message
    error = refused({"profile": "h200-1g"}, profiles=[bare], catalog=Catalog(()))
    assert error.status == 400 and "'(none)'" in error.message  # never "got None"


def test_form_lists_of_one_string_are_accepted():
    choice = resolve({"profile": ["h200-1g"], "image": ["tensorrt-llm"], "account": ["user:alice"]})
    assert (choice.profile, choice.image.name, choice.account) == (SLICE, "tensorrt-llm",
                                                                   "user:alice")


@pytest.mark.parametrize("options", [{}, None, {"profile": ""}, {"profile": [""]}])
def test_empty_request_gets_cheapest_cpu_profile(options):
    choice = resolve(options)
    assert choice.profile == CPU and choice.chosen_by == "cheapest CPU-only profile"
    assert choice.image.name == "pytorch" and choice.account == "user:alice"


def test_cheapest_cpu_profile_ties_broken_by_slug():
    a = dataclasses.replace(CPU, slug="b-cpu")
    b = dataclasses.replace(CPU, slug="a-cpu")
    dear = dataclasses.replace(CPU, slug="0-cpu", price_per_hour_ucr=CPU.price_per_hour_ucr + 1)
    assert resolve({}, profiles=[dear, a, b, FULL]).profile.slug == "a-cpu"


def test_empty_request_uses_default_profile_when_usable():
    choice = resolve({}, default="h200-1g")
    assert choice.profile == SLICE and choice.chosen_by == "default profile"
    # A default the user can no longer use falls back to CPU only, never elsewhere.
    for default in ("staff-full", "off", "deleted"):
        choice = resolve({}, default=default)
        assert choice.profile == CPU and choice.chosen_by == "cheapest CPU-only profile"
    assert resolve({}, default="staff-full", groups={"ml"}).profile == STAFF_ONLY


def test_empty_request_with_only_gpu_profiles_is_refused_listing_them():
    error = refused({}, profiles=[FULL, SLICE, OFF])
    assert error.status == 400
    assert error.message == ("No profile chosen and no CPU-only profile is available to you; "
                             "choose one of: h200-1g (GPU), h200-full (GPU)")
    assert error.errors[0].field == "profile"


def test_cpu_profile_of_other_groups_is_not_a_fallback():
    restricted_cpu = dataclasses.replace(CPU, groups=("staff",))
    error = refused({}, profiles=[restricted_cpu, SLICE])
    assert error.status == 400 and "h200-1g (GPU)" in error.message and "cpu" not in error.message
    assert resolve({}, profiles=[restricted_cpu, SLICE], groups={"staff"}).profile == restricted_cpu


def test_no_profile_at_all():
    error = refused({}, profiles=[OFF, STAFF_ONLY])
    assert error.status == 403 and "No profile is available to you" in error.message


@pytest.mark.parametrize("options", [[], "h200-1g", 5, ["profile"]])
def test_not_a_mapping(options):
    error = refused(options)
    assert error.status == 400
    assert "must be a JSON object with keys profile, image, account" in error.message


def test_unknown_keys_are_named_with_the_allowed_ones():
    error = refused({"profile": "cpu", "gpus": "2", "colour": "red"})
    assert error.status == 400
    assert "colour, gpus" in error.message and "allowed: profile, image, account" in error.message


@pytest.mark.parametrize("value", [5, None, True, ["a", "b"], [], {"x": 1}, [5]])
@pytest.mark.parametrize("key", ALLOWED_KEYS)
def test_values_must_be_strings(key, value):
    error = refused({key: value})
    assert error.status == 400 and key in error.message and error.errors[0].field == key


def test_unknown_or_disabled_profile_lists_usable_ones():
    for slug, what in (("nope", "does not exist"), ("off", "is disabled")):
        error = refused({"profile": slug})
        assert error.status == 400 and what in error.message
        assert error.message.endswith("choose one of: cpu, h200-1g (GPU), h200-full (GPU)")
    error = refused({"profile": "nope"}, groups={"staff"})
    assert "staff-full (GPU)" in error.message


def test_profile_of_other_groups_is_forbidden():
    error = refused({"profile": "staff-full"}, groups={"physics"})
    assert error.status == 403
    assert "only for members of group(s) staff, ml" in error.message
    assert "profiles you may use: cpu, h200-1g (GPU), h200-full (GPU)" in error.message
    assert resolve({"profile": "staff-full"}, groups={"staff"}).profile == STAFF_ONLY


def test_image_not_offered_lists_the_profiles_images():
    error = refused({"profile": "h200-1g", "image": "cuda"})
    assert error.status == 400 and error.errors[0].field == "image"
    assert "choose one of: pytorch, tensorrt-llm" in error.message
    error = refused({"profile": "cpu", "image": "nope"})
    assert "choose one of: pytorch, cuda" in error.message


def test_image_retired_from_catalog():
    smaller = Catalog(tuple(i for i in CATALOG.images if i.name != "pytorch"))
    # The default image skips what the catalog lost.
    assert resolve({"profile": "h200-1g"}, catalog=smaller).image.name == "tensorrt-llm"
    error = refused({"profile": "h200-1g", "image": "pytorch"}, catalog=smaller)
    assert error.status == 400 and "not in the image catalog" in error.message
    assert "choose one of: tensorrt-llm" in error.message
    empty = Catalog(())
    assert refused({"profile": "cpu"}, catalog=empty).status == 400


def test_accounts():
    assert resolve({"account": "user:alice"}).account == "user:alice"
    error = refused({"account": "user:bob"})
    assert error.status == 403 and "accounts you may charge: user:alice" in error.message
    error = refused({"account": "group:ml"}, groups={"ml"})
    assert error.status == 400 and "unknown account group:ml" in error.message
    choice = resolve({"account": "group:ml"}, groups={"ml"}, group_accounts={"ml", "physics"})
    assert choice.account == "group:ml"
    error = refused({"account": "group:physics"}, groups={"ml"}, group_accounts={"ml", "physics"})
    assert error.status == 403 and "not a member of group physics" in error.message
    assert "accounts you may charge: user:alice, group:ml" in error.message
    for bad in ("alice", "group:", "user:", "team:x", ":"):
        error = refused({"account": bad})
        assert error.status == 400 and "user:NAME or group:NAME" in error.message


def test_checks_happen_in_order_keys_first():
    error = refused({"profile": "nope", "bogus": "1"})
    assert "bogus" in error.message


def test_options_summary():
    choice = resolve({"profile": "h200-1g"})
    assert options_summary(choice) == (
        "profile h200-1g (H200 slice 1g.18gb, 1.20 credits/h), image pytorch")
    assert options_summary(resolve({})) == "profile cpu (CPU only, 0.10 credits/h), image pytorch"
    two = dataclasses.replace(FULL, gpu=dataclasses.replace(FULL.gpu, count=2))
    group = resolve({"profile": "h200-full", "account": "group:ml"}, profiles=[two],
                    groups={"ml"}, group_accounts={"ml"})
    assert options_summary(group) == (
        "profile h200-full (2× H200, 8.00 credits/h), image pytorch, account group:ml")


@pytest.mark.parametrize("ucr, text", [
    (1_200_000, "1.20"), (100_000, "0.10"), (8_000_000, "8.00"), (1_234_500, "1.2345"),
    (1, "0.000001"), (0, "0.00"),
])
def test_price_text(ucr, text):
    assert price_text(ucr) == text


SPOT_SLICE = dataclasses.replace(SLICE, spot_price_per_hour_ucr=400_000)
SPOT_STAFF = dataclasses.replace(FULL, slug="spot-staff", spot_price_per_hour_ucr=2_000_000,
                                 spot_groups=("staff",))


def test_the_spot_tier_is_chosen_by_name_and_billed_at_its_price():
    profiles = [SPOT_SLICE, CPU, SPOT_STAFF]
    choice = resolve({"profile": "h200-1g", "tier": "spot"}, profiles=profiles)
    assert choice.tier == "spot" and choice.rate_per_hour_ucr == 400_000
    assert resolved_options(choice)["tier"] == "spot"
    assert options_summary(choice) == ("profile h200-1g (H200 slice 1g.18gb, 0.40 credits/h, "
                                       "spot: may be interrupted), image pytorch")
    on_demand = resolve({"profile": "h200-1g", "tier": "on-demand"}, profiles=profiles)
    assert on_demand.tier == "on-demand" and on_demand.rate_per_hour_ucr == 1_200_000
    assert resolve({"profile": "h200-1g"}, profiles=profiles).tier == "on-demand"
    assert resolve({}, profiles=profiles).tier == "on-demand"
    staff = resolve({"profile": "spot-staff", "tier": "spot"}, profiles=profiles,
                    groups={"staff"})
    assert staff.rate_per_hour_ucr == 2_000_000


@pytest.mark.parametrize("options, status, said", [
    ({"profile": "h200-1g", "tier": "cheap"}, 400, "unknown tier 'cheap'; allowed: on-demand, spot"),
    ({"profile": "h200-full", "tier": "spot"}, 400, "profile h200-full offers no spot tier"),
    ({"profile": "cpu", "tier": "spot"}, 400, "profile cpu offers no spot tier"),
    ({"profile": "spot-staff", "tier": "spot"}, 403, "only for members of group(s) staff"),
    ({"profile": "h200-1g", "tier": ["spot", "x"]}, 400, "must be a string"),
])
def test_a_tier_that_is_not_offered_or_not_allowed_is_refused_naming_what_is(options, status,
                                                                             said):
    error = refused(options, profiles=[SPOT_SLICE, FULL, CPU, SPOT_STAFF])
    assert error.status == status and said in error.message, error.message
    assert error.errors[0].field == "tier" or "must be a string" in said
