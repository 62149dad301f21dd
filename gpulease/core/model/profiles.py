"""Profiles: what a user may start (GPU, CPU, memory, images, price, limits).

Pure: parsing and validation of the profiles file and of API bodies, and the
file format written back by `gpulease profiles export`. Validation reports
every problem at once, field by field, so an admin fixes a file in one pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import yaml

from gpulease.core.model.catalog import Catalog, Image
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.gpu_models import KNOWN_MODELS, valid_mig_profiles
from gpulease.core.refusal import FieldError, Refusal
from gpulease.core.shown import shown
from gpulease.core.tiers import SPOT, Tier, registered, tier
from gpulease.core.units import (
    MAX_PRICE_PER_HOUR_UCR,
    credits_text,
    format_duration,
    format_quantity,
    load_yaml,
    parse_cpu,
    parse_credits,
    parse_duration,
    parse_quantity,
)

SAMPLE_PROFILES = Path(__file__).parent / "samples" / "profiles.yaml"

SLUG = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_GPU_COUNT = 8
KEYS = ("slug", "display_name", "description", "gpu", "cpu", "memory", "images",
        "price_per_hour", "spot_price_per_hour", "spot_groups", "reserved_price_per_hour",
        "min_run", "idle_timeout",
        "max_runtime", "groups", "enabled")
GPU_KEYS = ("model", "mig", "count")
# The price fields of the built-in tiers, each parsed by its own rule below and kept in
# its own attribute (price_per_hour_ucr...); a registered tier's is in `tier_prices`.
BUILT_IN_PRICES = ("price_per_hour", "spot_price_per_hour", "reserved_price_per_hour")
DEFAULTS = {"min_run": "10m", "idle_timeout": "30m", "max_runtime": "0"}
_ABSENT = object()  # a key the profile leaves out (not a null given)


@dataclass(frozen=True)
class GpuSpec:
    model: str
    mig: str | None = None
    count: int = 1

    def device_request(self, image: Image | None = None) -> DeviceRequest:
        """What this GPU spec asks for; with the image to run, on GPUs whose driver runs it."""
        return DeviceRequest(model=self.model, mig_profile=self.mig, count=self.count,
                             min_driver=image.min_driver if image else None,
                             image=image.name if image else None)

    def describe(self) -> str:
        if self.mig:
            return f"{self.model} slice {self.mig}"
        return f"{self.count}× {self.model}"


@dataclass(frozen=True)
class Profile:
    slug: str
    display_name: str
    description: str
    gpu: GpuSpec | None
    cpu: Decimal
    memory_bytes: int
    images: tuple[str, ...]  # () : the catalog's first image (Catalog.offered)
    price_per_hour_ucr: int
    min_run_s: int
    idle_timeout_s: int
    max_runtime_s: int
    groups: tuple[str, ...] = ()
    enabled: bool = True
    # The interruptible tier (None: not offered): a lower rate, preempted for on-demand.
    spot_price_per_hour_ucr: int | None = None
    spot_groups: tuple[str, ...] = ()  # () : everyone who may use the profile
    # Reservations (None: not offered): units held over a period, charged once at this
    # rate per unit and hour (gpulease/core/capacity/reservation_rules.py).
    reserved_price_per_hour_ucr: int | None = None
    # The prices of the tiers registered beyond the built-in three, by the tier's price
    # field ({"preview_price_per_hour": µcr}); a tier left out is not offered.
    tier_prices: Mapping[str, int] = field(default_factory=dict, hash=False)

    @property
    def is_cpu_only(self) -> bool:
        return self.gpu is None

    @property
    def prices(self) -> dict[str, int]:
        """Every price the profile gives, by price field (a tier's record names its own)."""
        built_in = zip(BUILT_IN_PRICES, (self.price_per_hour_ucr, self.spot_price_per_hour_ucr,
                                         self.reserved_price_per_hour_ucr), strict=True)
        return {name: price for name, price in (*built_in, *self.tier_prices.items())
                if price is not None}

    def price_of(self, tier_name: str) -> int | None:
        """The price per hour on tier `tier_name` (its record's price field); None: the
        profile does not offer the tier."""
        return self.prices.get(tier(tier_name).price_field)

    def offers(self, tier_name: str) -> bool:
        return self.price_of(tier_name) is not None

    @property
    def offers_spot(self) -> bool:
        return self.spot_price_per_hour_ucr is not None

    @property
    def offers_reservations(self) -> bool:
        return self.reserved_price_per_hour_ucr is not None

    def to_spec(self) -> dict:
        """The profile as in the profiles file; JSON-safe (no Decimal, no float)."""
        spec: dict = {"slug": self.slug, "display_name": self.display_name,
                      "description": self.description}
        if self.gpu is not None:
            more = {"mig": self.gpu.mig} if self.gpu.mig else {"count": self.gpu.count}
            spec["gpu"] = {"model": self.gpu.model, **more}
        cpu = self.cpu.normalize()
        spec["cpu"] = int(cpu) if cpu == cpu.to_integral_value() else format(cpu, "f")
        spec.update(
            memory=format_quantity(self.memory_bytes),
            **({"images": list(self.images)} if self.images else {}),
            price_per_hour=credits_text(self.price_per_hour_ucr),
            **({"spot_price_per_hour": credits_text(self.spot_price_per_hour_ucr)}
               if self.offers_spot else {}),
            **({"spot_groups": list(self.spot_groups)} if self.spot_groups else {}),
            **({"reserved_price_per_hour": credits_text(self.reserved_price_per_hour_ucr)}
               if self.offers_reservations else {}),
            **{name: credits_text(price) for name, price in self.tier_prices.items()},
            min_run=format_duration(self.min_run_s),
            idle_timeout=format_duration(self.idle_timeout_s),
            max_runtime=format_duration(self.max_runtime_s),
            groups=list(self.groups), enabled=self.enabled,
        )
        return spec


class ProfileError(Refusal, ValueError):
    """Profiles that cannot be used: every problem, each naming its field."""

    def __init__(self, errors: list[FieldError], message: str = ""):
        super().__init__(message or "\n".join(str(error) for error in errors), errors)


@dataclass
class _Problems:
    where: str
    errors: list[FieldError] = field(default_factory=list)

    def add(self, name: str, message: str) -> None:
        self.errors.append(FieldError(f"{self.where}: {name}" if self.where else name, message))


def _names(values) -> str:
    return ", ".join(values) or "(none)"


def _parse_gpu(value: object, p: _Problems) -> GpuSpec | None:
    if not isinstance(value, dict):
        p.add("gpu", f"must be a mapping like {{model: H200, mig: 1g.18gb}}, got {shown(value)}")
        return None
    for key in sorted(str(k) for k in value if k not in GPU_KEYS):
        p.add(f"gpu.{key}", f"unknown key; allowed: {_names(GPU_KEYS)}")
    model, mig, count = value.get("model"), value.get("mig"), value.get("count", 1)
    problems = len(p.errors)
    model_ok = isinstance(model, str) and model in KNOWN_MODELS
    if not model_ok:
        what = "is required" if model is None else f"{shown(model)} is not a known GPU model"
        p.add("gpu.model", f"{what}; known models: {_names(KNOWN_MODELS)}")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GPU_COUNT:
        p.add("gpu.count", f"must be a whole number from 1 to {MAX_GPU_COUNT}, got {shown(count)}")
    if mig is not None:
        valid = valid_mig_profiles(model) if model_ok else None
        if not isinstance(mig, str):
            p.add("gpu.mig", f"must be a MIG profile name like 1g.18gb, got {shown(mig)}")
        elif model_ok and valid is None:
            p.add("gpu.mig", f"{model} has no MIG profiles; omit mig to use whole GPUs")
        elif valid is not None and mig not in valid:
            p.add("gpu.mig",
                  f"{shown(mig)} is not a MIG profile of {model}; valid: {_names(valid)}")
        if isinstance(count, int) and count > 1:
            p.add("gpu.count", "a MIG profile gets one slice: use mig or count > 1, not both")
    return GpuSpec(model, mig, count) if len(p.errors) == problems else None


def _parse_images(value: object, catalog: Catalog, check: bool, p: _Problems) -> tuple | None:
    if value is _ABSENT:  # the catalog's first image, whatever the catalog is then
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        p.add("images", f"must be a non-empty list of image names from the catalog "
                        f"({_names(catalog.names())}), or left out for its first image; "
                        f"got {shown(value)}")
        return None
    twice = sorted({v for v in value if value.count(v) > 1})
    problems = [f"{shown(n)} is listed twice" for n in twice]
    if check:
        known = _names(catalog.names())
        problems += [f"{shown(n)} is not in the image catalog; known: {known}"
                     for n in value if catalog.get(n) is None]
    for message in problems:
        p.add("images", message)
    return None if problems else tuple(value)


def _parse_groups(value: object, p: _Problems, name: str = "groups") -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(g, str) and g for g in value):
        p.add(name, f"must be a list of group names ([] = everyone), got {shown(value)}")
        return None
    # A stray space or a comma-joined list would silently match no hub group.
    odd = [g for g in value if g != g.strip() or "," in g or not g.isprintable()]
    if odd:
        p.add(name, f"{', '.join(map(shown, odd))}: a group name has no surrounding spaces, "
                    "commas or control characters; list each group as its own item")
        return None
    if len(set(value)) != len(value):
        p.add(name, "lists a group twice")
        return None
    return tuple(value)


def _price(p: _Problems, data: dict, name: str, price: int | None) -> int | None:
    """A price already parsed from data[name], checked against the bounds every price has."""
    if price is not None and price < 0:
        p.add(name, f"must not be negative, got {shown(data[name])}")
    elif price is not None and price > MAX_PRICE_PER_HOUR_UCR:
        p.add(name, f"must be at most {credits_text(MAX_PRICE_PER_HOUR_UCR)} "
                    f"credits per hour, got {shown(data[name])}")
    else:
        return price
    return None


def _parse_tier_price(record: Tier, data: dict, price: int | None, gpu: object,
                      p: _Problems) -> int | None:
    """The price of tier `record` (its price field; None: left out, or wrong). A
    preemptible tier's is below price_per_hour, on GPU profiles only."""
    name = record.price_field
    if data.get(name) is None:
        return None
    value = _price(p, data, name, _attempt(p, name, parse_credits, data[name]))
    if value is None or not record.preemptible:
        return value
    if gpu is None:
        p.add(name, f"{record.name} is for GPU profiles (it is preempted to free GPUs); "
                    "leave it out of a CPU-only profile")
    elif price is not None and value >= price:
        p.add(name, f"must be below price_per_hour ({credits_text(price)}), got "
                    f"{shown(data[name])}: {record.name} is the cheaper, interruptible tier")
    else:
        return value
    return None


def _parse_spot(data: dict, price: int | None, gpu: object,
                p: _Problems) -> tuple[int | None, tuple[str, ...]]:
    """spot_price_per_hour (below price_per_hour, GPU profiles only) and spot_groups."""
    spot = _parse_tier_price(tier(SPOT), data, price, gpu, p)
    groups = _parse_groups(data.get("spot_groups", []), p, "spot_groups")
    if groups and data.get("spot_price_per_hour") is None:
        p.add("spot_groups", "names who may use spot, but the profile offers none: set "
                             "spot_price_per_hour too, or leave spot_groups out")
    return spot, groups or ()


def _parse_tier_prices(data: dict, price: int | None, gpu: object,
                       p: _Problems) -> dict[str, int]:
    """The prices of the tiers registered beyond the built-in three, by price field."""
    prices = {}
    for record in registered():
        if record.price_field not in BUILT_IN_PRICES:
            value = _parse_tier_price(record, data, price, gpu, p)
            if value is not None:
                prices[record.price_field] = value
    return prices


def _parse_reserved(data: dict, price: int | None, gpu: object, p: _Problems) -> int | None:
    """reserved_price_per_hour: GPU profiles only, at most price_per_hour."""
    if data.get("reserved_price_per_hour") is None:
        return None
    reserved = _price(p, data, "reserved_price_per_hour", _attempt(
        p, "reserved_price_per_hour", parse_credits, data["reserved_price_per_hour"]))
    if reserved is not None and gpu is None:
        p.add("reserved_price_per_hour", "reservations hold GPUs; leave it out of a CPU-only "
                                         "profile")
    elif reserved is not None and price is not None and reserved > price:
        p.add("reserved_price_per_hour",
              f"must be at most price_per_hour ({credits_text(price)}), got "
              f"{shown(data['reserved_price_per_hour'])}: a reservation is paid up front, "
              "at a discount")
    return reserved


def profile_keys() -> tuple[str, ...]:
    """A profile's keys: KEYS, and the price field of each tier registered beyond them."""
    return KEYS + tuple(t.price_field for t in registered() if t.price_field not in KEYS)


def _attempt(p: _Problems, name: str, parse, value: object):
    try:
        return parse(value)
    except ValueError as exc:
        p.add(name, str(exc))
        return None


def _required(p: _Problems, data: dict, name: str, parse, hint: str):
    if name not in data:
        p.add(name, f"is required ({hint})")
        return None
    return _attempt(p, name, parse, data[name])


def parse_profile(
    data: object, catalog: Catalog, *, slug: str | None = None, where: str = "",
    check_catalog: bool = True,
) -> Profile:
    """Validate one profile (a file entry, or an API body with `slug` from the URL).

    `check_catalog=False` lets a stored profile whose image left the catalog
    still be read; new and changed profiles are always checked.
    """
    p = _Problems(where)
    keys = profile_keys()
    if not isinstance(data, dict):
        p.add("profile", f"must be a mapping of {_names(keys)}, got {shown(data)}")
        raise ProfileError(p.errors)
    for key in sorted(str(k) for k in data if k not in keys):
        p.add(key, f"unknown key; allowed: {_names(keys)}")
    given = data.get("slug", slug)
    if slug is not None and given != slug:
        p.add("slug", f"{shown(given)} differs from the profile being written, {shown(slug)}")
    if not isinstance(given, str) or not SLUG.fullmatch(given):
        p.add("slug", "is required: 1-63 lower-case letters, digits and '-', starting and ending"
                      f" with a letter or digit (got {shown(given)})")
    display_name = data.get("display_name")
    if not isinstance(display_name, str) or not display_name.strip():
        p.add("display_name", f"is required: a non-empty string (got {shown(display_name)})")
    description = data.get("description", "")
    if not isinstance(description, str):
        p.add("description", f"must be a string, got {shown(description)}")
    gpu = data.get("gpu")
    gpu_spec = _parse_gpu(gpu, p) if gpu is not None else None
    cpu = _required(p, data, "cpu", parse_cpu, "cores, like 4 or 0.5")
    if (memory := _required(p, data, "memory", parse_quantity, "a quantity like 32Gi")) == 0:
        p.add("memory", "must be more than 0")
    images = _parse_images(data.get("images", _ABSENT), catalog, check_catalog, p)
    price = _price(p, data, "price_per_hour", _required(
        p, data, "price_per_hour", parse_credits, 'credits per hour like "1.20"'))
    spot_price, spot_groups = _parse_spot(data, price, gpu, p)
    reserved_price = _parse_reserved(data, price, gpu, p)
    tier_prices = _parse_tier_prices(data, price, gpu, p)
    durations = {
        name: _attempt(p, name, parse_duration, data.get(name, default))
        for name, default in DEFAULTS.items()
    }
    if durations["max_runtime"] and (durations["min_run"] or 0) > durations["max_runtime"]:
        p.add("min_run", "is longer than max_runtime: no start could ever run that long")
    groups = _parse_groups(data.get("groups", []), p)
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        p.add("enabled", f"must be true or false, got {shown(enabled)}")
    if p.errors:
        raise ProfileError(p.errors)
    return Profile(
        slug=given, display_name=display_name, description=description, gpu=gpu_spec, cpu=cpu,
        memory_bytes=memory, images=images, price_per_hour_ucr=price,
        min_run_s=durations["min_run"], idle_timeout_s=durations["idle_timeout"],
        max_runtime_s=durations["max_runtime"], groups=groups, enabled=enabled,
        spot_price_per_hour_ucr=spot_price, spot_groups=spot_groups,
        reserved_price_per_hour_ucr=reserved_price, tier_prices=tier_prices,
    )


def parse_profiles_document(data: object, catalog: Catalog, source: str) -> list[Profile]:
    """Every profile of a loaded profiles file; all problems raised together."""
    top = _Problems(source)
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), list):
        top.add("profiles", "the file must be a mapping with a list under 'profiles'")
        raise ProfileError(top.errors)
    for key in sorted(str(k) for k in data if k != "profiles"):
        top.add(key, "unknown top-level key; allowed: profiles")
    errors, profiles, seen = top.errors, [], {}
    for index, entry in enumerate(data["profiles"]):
        slug = entry.get("slug") if isinstance(entry, dict) else None
        where = f"{source}: " * bool(source) + f"profiles[{index}]"
        where += f" ({slug})" if isinstance(slug, str) else ""
        if isinstance(slug, str) and slug in seen:
            message = f"duplicate slug, also profiles[{seen[slug]}]"
            errors.append(FieldError(f"{where}: slug", message))
        elif isinstance(slug, str):
            seen[slug] = index
        try:
            profiles.append(parse_profile(entry, catalog, where=where))
        except ProfileError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ProfileError(errors)
    return profiles


def parse_profiles_text(text: str, catalog: Catalog, source: str) -> list[Profile]:
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ProfileError([FieldError(source, f"not valid YAML: {exc}")]) from exc
    return parse_profiles_document(data, catalog, source)


def load_profiles_file(path: str | Path, catalog: Catalog) -> list[Profile]:
    """Read and validate a profiles file; prices stay exact (YAML floats read as Decimal)."""
    return parse_profiles_text(Path(path).read_text(encoding="utf-8"), catalog, str(path))


def dump_profiles(profiles: list[Profile]) -> str:
    """The profiles file for `profiles` (what `gpulease profiles export` prints)."""
    specs = {"profiles": [profile.to_spec() for profile in profiles]}
    return yaml.safe_dump(specs, sort_keys=False, allow_unicode=True)


def usable_by(profile: Profile, user_groups: set[str]) -> bool:
    """Whether a user in `user_groups` may use `profile` (no groups: everyone)."""
    return not profile.groups or bool(set(profile.groups) & set(user_groups))


def tier_usable_by(profile: Profile, tier_name: str, user_groups: set[str]) -> bool:
    """Whether a user in `user_groups` may start `profile` on tier `tier_name`: the profile
    has a price in the tier's field and the user may use it (spot: and is in spot_groups,
    where the profile names any: the one tier with groups of its own)."""
    if not profile.offers(tier_name) or not usable_by(profile, user_groups):
        return False
    return (tier_name != SPOT or not profile.spot_groups
            or bool(set(profile.spot_groups) & set(user_groups)))


def spot_usable_by(profile: Profile, user_groups: set[str]) -> bool:
    """Whether a user in `user_groups` may start `profile` on the spot tier."""
    return tier_usable_by(profile, SPOT, user_groups)


def option_value(user_options: object, key: str) -> str | None:
    """One value of a server's saved `user_options` (a form saves lists of one string)."""
    if not isinstance(user_options, dict):
        return None
    value = user_options.get(key)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) and value else None


def saved_profile(user_options: object) -> str | None:
    """The profile slug a server's saved `user_options` name, if any."""
    return option_value(user_options, "profile")


def servers_saving(users: list[dict], slug: str) -> list[dict]:
    """Servers whose saved options name profile `slug`, from hub user models.

    `users` are JupyterHub user models fetched with `include_stopped_servers`;
    each result is {"user", "server", "running"}, sorted by user then server.
    """
    found = []
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            if saved_profile((server or {}).get("user_options")) == slug:
                running = not server.get("stopped", False) or bool(server.get("pending"))
                found.append({"user": user.get("name"), "server": name, "running": running})
    return sorted(found, key=lambda s: (str(s["user"]), s["server"]))
