import copy
import textwrap
from decimal import Decimal

import pytest

from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.gpu_models import KNOWN_MODELS
from gpulease.core.model.profiles import (
    SAMPLE_PROFILES,
    FieldError,
    GpuSpec,
    Profile,
    ProfileError,
    dump_profiles,
    load_profiles_file,
    parse_profile,
    parse_profiles_document,
    spot_usable_by,
    usable_by,
)
from gpulease.core.units import json_loads, load_yaml
from gpulease.images import shipped_catalog

CATALOG = shipped_catalog()

BASE = {
    "slug": "h200-1g",
    "display_name": "H200 slice",
    "description": "One seventh",
    "gpu": {"model": "H200", "mig": "1g.18gb"},
    "cpu": 4,
    "memory": "32Gi",
    "images": ["pytorch", "tensorrt-llm"],
    "price_per_hour": "1.20",
    "min_run": "10m",
    "idle_timeout": "30m",
    "max_runtime": 0,
    "groups": [],
    "enabled": True,
}


def with_(**changes):
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def problems(data, **kwargs) -> dict[str, str]:
    with pytest.raises(ProfileError) as info:
        parse_profile(data, CATALOG, **kwargs)
    return {error.field: error.message for error in info.value.errors}


def test_parse_full_profile():
    profile = parse_profile(BASE, CATALOG)
    assert profile == Profile(
        slug="h200-1g", display_name="H200 slice", description="One seventh",
        gpu=GpuSpec("H200", "1g.18gb", 1), cpu=Decimal(4), memory_bytes=32 * 2**30,
        images=("pytorch", "tensorrt-llm"), price_per_hour_ucr=1_200_000,
        min_run_s=600, idle_timeout_s=1800, max_runtime_s=0, groups=(), enabled=True,
    )
    assert not profile.is_cpu_only


def test_defaults():
    data = with_(description=..., min_run=..., idle_timeout=..., max_runtime=..., groups=...,
                 enabled=..., gpu=...)
    profile = parse_profile(data, CATALOG)
    assert (profile.description, profile.min_run_s, profile.idle_timeout_s,
            profile.max_runtime_s, profile.groups, profile.enabled) == ("", 600, 1800, 0, (), True)
    assert profile.is_cpu_only and profile.gpu is None


def test_gpu_spec_describe_and_device_request():
    assert GpuSpec("H200", "1g.18gb").describe() == "H200 slice 1g.18gb"
    assert GpuSpec("H200", count=2).describe() == "2× H200"
    assert GpuSpec("H200", "1g.18gb").device_request() == DeviceRequest("H200", "1g.18gb", 1)
    assert GpuSpec("A100-80GB", count=4).device_request() == DeviceRequest("A100-80GB", None, 4)


def test_slug_from_url_and_conflict():
    body = with_(slug=...)
    assert parse_profile(body, CATALOG, slug="h200-1g").slug == "h200-1g"
    assert "slug" in problems(with_(slug="other"), slug="h200-1g")
    assert "slug" in problems(body)


@pytest.mark.parametrize("slug", ["A", "-a", "a-", "a_b", "", "x" * 64, 5, "a.b", "é"])
def test_bad_slug(slug):
    assert "slug" in problems(with_(slug=slug))


@pytest.mark.parametrize("slug", ["a", "0", "h200-1g", "x" * 63])
def test_good_slug(slug):
    assert parse_profile(with_(slug=slug), CATALOG).slug == slug


def test_unknown_keys_are_errors():
    found = problems(with_(colour="red", gpu={"model": "H200", "mig": "1g.18gb", "vram": 1}))
    assert "unknown key" in found["colour"] and "display_name" in found["colour"]
    assert "unknown key" in found["gpu.vram"] and "model, mig, count" in found["gpu.vram"]


def test_mig_profile_not_valid_for_model():
    found = problems(with_(gpu={"model": "H200", "mig": "1g.10gb"}))
    assert "'1g.10gb' is not a MIG profile of H200" in found["gpu.mig"]
    assert "1g.18gb" in found["gpu.mig"] and "7g.141gb" in found["gpu.mig"]
    found = problems(with_(gpu={"model": "L40S", "mig": "1g.10gb"}))
    assert "L40S has no MIG profiles" in found["gpu.mig"]


def test_unknown_and_missing_model_lists_known_ones():
    found = problems(with_(gpu={"model": "B300"}))
    assert "'B300' is not a known GPU model" in found["gpu.model"]
    assert all(model in found["gpu.model"] for model in KNOWN_MODELS)
    assert "is required" in problems(with_(gpu={"count": 1}))["gpu.model"]
    assert "gpu" in problems(with_(gpu="H200"))


@pytest.mark.parametrize("count", [0, 9, -1, "2", True, Decimal("1.5")])
def test_bad_count(count):
    assert "gpu.count" in problems(with_(gpu={"model": "H200", "count": count}))


def test_mig_and_count_are_exclusive():
    found = problems(with_(gpu={"model": "H200", "mig": "1g.18gb", "count": 2}))
    assert "not both" in found["gpu.count"]
    profile = parse_profile(with_(gpu={"model": "H200", "count": 8}), CATALOG)
    assert profile.gpu == GpuSpec("H200", None, 8)


@pytest.mark.parametrize("cpu", [0, -1, "0", "lots", 1.5, None, True, "0.0001"])
def test_bad_cpu(cpu):
    assert "cpu" in problems(with_(cpu=cpu))


@pytest.mark.parametrize("cpu, cores", [("500m", Decimal("0.5")), (Decimal("0.5"), Decimal("0.5"))])
def test_fractional_cpu(cpu, cores):
    assert parse_profile(with_(cpu=cpu), CATALOG).cpu == cores


@pytest.mark.parametrize("memory", ["32GB", "0", 0, "-1Gi", "lots", None, 1.5])
def test_bad_quantity(memory):
    assert "memory" in problems(with_(memory=memory))


@pytest.mark.parametrize("images, needle", [
    (["nope"], "'nope' is not in the image catalog; known: pytorch, cuda, tensorrt-llm, cuda-12.8"),
    ([], "non-empty list"),
    ("pytorch", "non-empty list"),
    (["pytorch", "pytorch"], "'pytorch' is listed twice"),
    ([1], "non-empty list"),
])
def test_bad_images(images, needle):
    assert needle in problems(with_(images=images))["images"]


def test_image_check_can_be_relaxed_for_stored_profiles():
    data = with_(images=["retired", "pytorch"])
    assert "images" in problems(data)
    assert parse_profile(data, CATALOG, check_catalog=False).images == ("retired", "pytorch")


@pytest.mark.parametrize("price, needle", [
    ("-1", "must not be negative"),
    ("1.0000001", "more than 6 decimals"),
    (1.2, "float"),
    ("1e2", "not an amount"),
    ("NaN", "not an amount"),
    (Decimal("Infinity"), "not a finite"),
    (True, "not an amount"),
    ("1000000.000001", "at most 1000000 credits per hour"),  # a charge must fit 64 bits
])
def test_bad_price(price, needle):
    assert needle in problems(with_(price_per_hour=price))["price_per_hour"]


def test_the_highest_price_is_allowed():
    assert parse_profile(with_(price_per_hour="1000000"), CATALOG).price_per_hour_ucr == 10**12


def test_price_exact_from_yaml_and_json():
    unquoted = load_yaml("p: 1.2\n")["p"]
    assert parse_profile(with_(price_per_hour=unquoted), CATALOG).price_per_hour_ucr == 1_200_000
    body = json_loads('{"price_per_hour": 1.2}')
    price = parse_profile(with_(**body), CATALOG).price_per_hour_ucr
    assert price == 1_200_000
    assert parse_profile(with_(price_per_hour=0), CATALOG).price_per_hour_ucr == 0


@pytest.mark.parametrize("field", ["min_run", "idle_timeout", "max_runtime"])
@pytest.mark.parametrize("value", ["10", 600, "1d", "-5m", "", None, "1.5h"])
def test_bad_duration(field, value):
    message = problems(with_(**{field: value}))[field]
    assert "durations look like 90s, 30m, 2h, 1h30m or 0" in message


def test_min_run_longer_than_max_runtime():
    assert "min_run" in problems(with_(min_run="2h", max_runtime="1h"))
    assert parse_profile(with_(min_run="1h", max_runtime="1h"), CATALOG).max_runtime_s == 3600


@pytest.mark.parametrize("field, value", [
    ("groups", "staff"), ("groups", [""]), ("groups", ["a", "a"]), ("groups", [1]),
    ("enabled", "yes"), ("enabled", 1), ("display_name", ""), ("display_name", "  "),
    ("display_name", None), ("description", 5),
])
def test_bad_other_fields(field, value):
    assert field in problems(with_(**{field: value}))


@pytest.mark.parametrize("field", ["display_name", "cpu", "memory", "price_per_hour"])
def test_required_fields(field):
    assert field in problems(with_(**{field: ...}))


def test_a_profile_without_images_offers_the_catalogs_first_and_exports_without_them():
    profile = parse_profile(with_(images=...), CATALOG)
    assert profile.images == ()
    assert CATALOG.offered(profile.images) == (CATALOG.images[0].name,)
    assert "images" not in profile.to_spec()  # so an export stays what the admin wrote
    assert parse_profile(profile.to_spec(), CATALOG) == profile
    assert CATALOG.offered(("cuda",)) == ("cuda",)


@pytest.mark.parametrize("images", [[], None])
def test_images_given_empty_or_null_is_refused_saying_it_may_be_left_out(images):
    assert "or left out for its first image" in problems(with_(images=images))["images"]


def test_every_problem_collected_with_where_prefix():
    data = with_(slug="Bad", gpu={"model": "H200", "mig": "9g.9gb"}, cpu=0, memory="x",
                 images=["nope"], price_per_hour="-1", min_run="x", enabled="no", extra=1)
    with pytest.raises(ProfileError) as info:
        parse_profile(data, CATALOG, where="f.yaml: profiles[2] (Bad)")
    fields = [e.field for e in info.value.errors]
    for name in ("slug", "gpu.mig", "cpu", "memory", "images", "price_per_hour", "min_run",
                 "enabled", "extra"):
        assert f"f.yaml: profiles[2] (Bad): {name}" in fields
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.errors) >= 9
    assert lines[0] == str(info.value.errors[0])
    assert str(FieldError("gpu.mig", "m")) == "gpu.mig: m"


def test_not_a_mapping():
    assert "profile" in problems(["x"])


# --- documents -----------------------------------------------------------------


def test_document_collects_errors_across_profiles_and_duplicate_slugs():
    doc = {"profiles": [BASE, with_(cpu=0), copy.deepcopy(BASE), with_(slug="ok", memory="x")]}
    with pytest.raises(ProfileError) as info:
        parse_profiles_document(doc, CATALOG, "p.yaml")
    fields = {e.field: e.message for e in info.value.errors}
    assert fields["p.yaml: profiles[1] (h200-1g): cpu"]
    assert "duplicate slug, also profiles[0]" in fields["p.yaml: profiles[1] (h200-1g): slug"]
    assert "duplicate slug" in fields["p.yaml: profiles[2] (h200-1g): slug"]
    assert fields["p.yaml: profiles[3] (ok): memory"]
    assert len(info.value.errors) == 4


@pytest.mark.parametrize("doc, field", [
    (None, "p.yaml: profiles"), ([BASE], "p.yaml: profiles"),
    ({"profiles": {}}, "p.yaml: profiles"),
    ({"profiles": [BASE], "extra": 1}, "p.yaml: extra"),
    ({"profiles": ["x"]}, "p.yaml: profiles[0]: profile"),
])
def test_document_shape(doc, field):
    with pytest.raises(ProfileError) as info:
        parse_profiles_document(doc, CATALOG, "p.yaml")
    assert field in [e.field for e in info.value.errors]


def test_sample_profiles():
    profiles = load_profiles_file(SAMPLE_PROFILES, CATALOG)
    by_slug = {p.slug: p for p in profiles}
    assert list(by_slug) == ["cpu", "h200-1g", "h200-full"]
    cpu, slice_, full = by_slug["cpu"], by_slug["h200-1g"], by_slug["h200-full"]
    assert cpu.is_cpu_only and cpu.cpu == 2 and cpu.memory_bytes == 8 * 2**30
    assert cpu.price_per_hour_ucr == 100_000 and cpu.images == ("pytorch", "cuda")
    assert slice_.gpu == GpuSpec("H200", "1g.18gb") and slice_.price_per_hour_ucr == 1_200_000
    assert slice_.cpu == 4 and slice_.memory_bytes == 32 * 2**30
    assert slice_.images == ("pytorch", "tensorrt-llm")
    assert full.gpu == GpuSpec("H200", None, 1) and full.price_per_hour_ucr == 8_000_000
    assert full.cpu == 16 and full.memory_bytes == 128 * 2**30
    assert full.images == ("pytorch", "tensorrt-llm", "cuda")


def test_load_file_keeps_unquoted_price_exact_and_reports_bad_yaml(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""
        profiles:
          - {slug: c, display_name: C, cpu: 1, memory: 1Gi, images: [cuda], price_per_hour: 0.30}
    """), encoding="utf-8")
    assert load_profiles_file(path, CATALOG)[0].price_per_hour_ucr == 300_000
    path.write_text("profiles: [\n", encoding="utf-8")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profiles_file(path, CATALOG)
    path.write_text("profiles:\n  - {slug: a, slug: b}\n", encoding="utf-8")
    with pytest.raises(ProfileError, match="duplicate key"):
        load_profiles_file(path, CATALOG)


def test_round_trip_dump_then_parse():
    profiles = load_profiles_file(SAMPLE_PROFILES, CATALOG) + [
        parse_profile(with_(slug="odd", cpu="0.25", memory="1500M", price_per_hour="0.000001",
                            min_run="1h30m15s", idle_timeout=0, max_runtime="12h",
                            groups=["ml", "staff"], enabled=False,
                            gpu={"model": "A100-80GB", "count": 3}, images=["cuda"]), CATALOG)
    ]
    text = dump_profiles(profiles)
    again = parse_profiles_document(load_yaml(text), CATALOG, "export")
    assert again == profiles
    assert dump_profiles(again) == text
    assert "price_per_hour: '1.2'" in text and "memory: 32Gi" in text


def test_to_spec_is_file_format_and_json_safe():
    spec = parse_profile(with_(cpu="0.5"), CATALOG).to_spec()
    assert spec["gpu"] == {"model": "H200", "mig": "1g.18gb"}
    assert spec["cpu"] == "0.5" and spec["price_per_hour"] == "1.2"
    assert spec["memory"] == "32Gi" and spec["min_run"] == "10m" and spec["max_runtime"] == "0"
    import json

    assert json_loads(json.dumps(spec)) == spec


def test_usable_by():
    everyone = parse_profile(BASE, CATALOG)
    staff = parse_profile(with_(groups=["staff", "ml"]), CATALOG)
    assert usable_by(everyone, set())
    assert usable_by(staff, {"ml"})
    assert not usable_by(staff, set())
    assert not usable_by(staff, {"physics"})


def _spot(**changes):
    base = {"slug": "slice", "display_name": "Slice", "gpu": {"model": "H200", "mig": "1g.18gb"},
            "cpu": 4, "memory": "32Gi", "price_per_hour": "1.20"}
    return {**base, **changes}


def test_a_profile_offers_spot_below_its_price_and_exports_it():
    profile = parse_profile(_spot(spot_price_per_hour="0.40", spot_groups=["students"]),
                            shipped_catalog())
    assert profile.offers_spot and profile.spot_price_per_hour_ucr == 400_000
    assert profile.spot_groups == ("students",)
    spec = profile.to_spec()
    assert spec["spot_price_per_hour"] == "0.4" and spec["spot_groups"] == ["students"]
    assert parse_profile(spec, shipped_catalog()) == profile
    plain = parse_profile(_spot(), shipped_catalog())
    assert not plain.offers_spot and "spot_price_per_hour" not in plain.to_spec()
    assert spot_usable_by(profile, {"students"}) and not spot_usable_by(profile, {"staff"})
    assert not spot_usable_by(plain, {"students"})


@pytest.mark.parametrize("changes, field, said", [
    ({"spot_price_per_hour": "1.20"}, "spot_price_per_hour", "must be below price_per_hour"),
    ({"spot_price_per_hour": "2"}, "spot_price_per_hour", "must be below price_per_hour"),
    ({"spot_price_per_hour": "-1"}, "spot_price_per_hour", "must not be negative"),
    ({"spot_price_per_hour": "lots"}, "spot_price_per_hour", "lots"),
    ({"spot_price_per_hour": "0.05", "gpu": None}, "spot_price_per_hour", "GPU profiles"),
    ({"spot_groups": ["students"]}, "spot_groups", "set spot_price_per_hour too"),
    ({"spot_price_per_hour": "0.4", "spot_groups": "students"}, "spot_groups",
     "must be a list of group names"),
])
def test_a_spot_price_or_spot_groups_that_cannot_work_are_refused(changes, field, said):
    data = {k: v for k, v in _spot(**changes).items() if v is not None}
    with pytest.raises(ProfileError) as info:
        parse_profile(data, shipped_catalog())
    fields = {e.field: e.message for e in info.value.errors}
    assert field in fields and said in fields[field], fields
