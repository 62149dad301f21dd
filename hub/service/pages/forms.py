"""Pure shaping for the admin pages: form fields <-> API bodies, table rows, audit diffs.

HTML forms send every value as text; these functions turn a form into the
same body the JSON API takes, so that the page and the API share one
validation (`parse_profile`, the billing parsers). No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulease.core.model.catalog import Catalog
from gpulease.core.model.gpu_models import KNOWN_MODELS, MIG_PROFILES
from gpulease.core.model.profiles import BUILT_IN_PRICES, DEFAULTS, FieldError, Profile
from gpulease.core.refusal import Refusal
from gpulease.core.tiers import is_preemptible, registered
from gpulease.core.units import credits_text, format_duration, format_quantity
from gpulease.hub.service.billing_views import iso
from gpulease.store.audit import AuditEntry

# Form inputs of the profile editor, in the order they appear.
PROFILE_INPUTS = ("slug", "display_name", "description", "gpu_model", "gpu_mig", "gpu_count",
                  "cpu", "memory", "images", "default_image", "price_per_hour",
                  "spot_price_per_hour", "spot_groups", "reserved_price_per_hour", "min_run",
                  "idle_timeout", "max_runtime", "groups", "enabled")


def tier_price_inputs() -> list[tuple[str, str]]:
    """(input name, label) of the price of each tier registered beyond the built-in three:
    its Tier record's price field and label (gpulease/core/tiers.py)."""
    return [(t.price_field, t.label) for t in registered() if t.price_field not in BUILT_IN_PRICES]


def profile_inputs() -> tuple[str, ...]:
    """PROFILE_INPUTS, with the registered tiers' prices."""
    return PROFILE_INPUTS + tuple(name for name, _ in tier_price_inputs())


# parse_profile's error fields that name a part of an input rather than the input itself.
_ERROR_INPUT = {"gpu": "gpu_model", "gpu.model": "gpu_model", "gpu.mig": "gpu_mig",
                "gpu.count": "gpu_count"}
GPU_MODELS: tuple[str, ...] = KNOWN_MODELS
MIG_NAMES: tuple[str, ...] = tuple(sorted({n for names in MIG_PROFILES.values() for n in names}))

Form = Mapping[str, Sequence[str]]  # tornado's request.arguments, decoded


def first(form: Form, name: str, default: str = "") -> str:
    values = form.get(name) or []
    return values[0] if values else default


def split_groups(text: str) -> list[str]:
    """"vision, nlp ,," -> ["vision", "nlp"]: comma-separated, blanks dropped."""
    return [g.strip() for g in text.split(",") if g.strip()]


def profile_body(form: Form, catalog: Catalog, slug: str | None = None) -> tuple[dict, list]:
    """The API body for a submitted editor form, and errors only a form can make.

    `slug` is the profile being edited (None: the form creates one and names it).
    Values stay text: parse_profile parses text exactly as it parses the file.
    """
    errors: list[FieldError] = []
    body: dict[str, Any] = {
        "slug": slug if slug is not None else first(form, "slug").strip(),
        "display_name": first(form, "display_name").strip(),
        "description": first(form, "description").strip(),
    }
    model = first(form, "gpu_model").strip()
    mig = first(form, "gpu_mig").strip()
    count_text = first(form, "gpu_count").strip()
    if model:
        gpu: dict[str, Any] = {"model": model}
        if mig:
            gpu["mig"] = mig
        if count_text and not (mig and count_text == "1"):
            # Non-numbers go through as text so that parse_profile names them.
            gpu["count"] = int(count_text) if count_text.isdigit() else count_text
        body["gpu"] = gpu
    elif mig:
        errors.append(FieldError("gpu.model", "choose the GPU model of this MIG slice, or clear "
                                              "the MIG profile for a CPU-only profile"))
    for name in ("cpu", "memory", "price_per_hour", "spot_price_per_hour",
                 "reserved_price_per_hour", *(name for name, _ in tier_price_inputs())):
        value = first(form, name).strip()
        if value:  # an empty input is a missing key: parse_profile says what it needs
            body[name] = value
    for name, default in DEFAULTS.items():
        body[name] = first(form, name).strip() or default
    chosen = [n for n in form.get("images") or [] if n]
    default_image = first(form, "default_image").strip()
    ordered = [n for n in catalog.names() if n in chosen] + [
        n for n in chosen if n not in catalog.names()]  # unknown names: parse_profile says so
    if default_image:
        ordered = [default_image] + [n for n in ordered if n != default_image]
    if ordered:  # none ticked: left out, the catalog's first image
        body["images"] = ordered
    body["groups"] = split_groups(first(form, "groups"))
    if spot_groups := split_groups(first(form, "spot_groups")):
        body["spot_groups"] = spot_groups
    body["enabled"] = first(form, "enabled") in ("on", "true", "1", "yes")
    return body, errors


def field_errors(errors: Iterable[FieldError]) -> tuple[dict[str, list[str]], list[str]]:
    """Errors by form input name, and those that name no input (shown above the form)."""
    by_input: dict[str, list[str]] = {}
    other: list[str] = []
    for error in errors:
        name = _ERROR_INPUT.get(error.field, error.field)
        if name in profile_inputs():
            by_input.setdefault(name, []).append(error.message)
        else:
            other.append(str(error))
    return by_input, other


def refusal_by_input(refusal: Refusal) -> dict[str, list[str]]:
    """A refusal of a credit, limit or reservation form as messages by input name (a
    message that names no input goes to "", shown above the form)."""
    by_input: dict[str, list[str]] = {}
    for item in refusal.errors or [FieldError("", refusal.message)]:
        by_input.setdefault(item.field, []).append(item.message)
    return by_input


def profile_form_values(profile: Profile | None) -> dict[str, Any]:
    """What the editor's inputs show for a stored profile (None: a new one's defaults)."""
    if profile is None:
        return {"slug": "", "display_name": "", "description": "", "gpu_model": "",
                "gpu_mig": "", "gpu_count": "1", "cpu": "", "memory": "", "images": [],
                "default_image": "", "price_per_hour": "", "spot_price_per_hour": "",
                "spot_groups": "", "reserved_price_per_hour": "", "groups": "", "enabled": True,
                **DEFAULTS, **{name: "" for name, _ in tier_price_inputs()}}
    spec = profile.to_spec()
    gpu = spec.get("gpu") or {}
    return {
        "slug": profile.slug, "display_name": profile.display_name,
        "description": profile.description, "gpu_model": gpu.get("model", ""),
        "gpu_mig": gpu.get("mig", ""), "gpu_count": str(gpu.get("count", 1)),
        "cpu": str(spec["cpu"]), "memory": spec["memory"], "images": list(profile.images),
        "default_image": profile.images[0] if profile.images else "",
        "price_per_hour": spec["price_per_hour"],
        "spot_price_per_hour": spec.get("spot_price_per_hour", ""),
        "spot_groups": ", ".join(profile.spot_groups),
        "reserved_price_per_hour": spec.get("reserved_price_per_hour", ""),
        "min_run": spec["min_run"],
        "idle_timeout": spec["idle_timeout"], "max_runtime": spec["max_runtime"],
        "groups": ", ".join(profile.groups), "enabled": profile.enabled,
        **{name: spec.get(name, "") for name, _ in tier_price_inputs()},
    }


def submitted_values(form: Form, slug: str | None) -> dict[str, Any]:
    """The inputs as the admin typed them, to show again next to the errors."""
    values: dict[str, Any] = {name: first(form, name) for name in profile_inputs()}
    values["images"] = [n for n in form.get("images") or [] if n]
    values["enabled"] = first(form, "enabled") in ("on", "true", "1", "yes")
    if slug is not None:
        values["slug"] = slug
    return values


def profile_row(profile: Profile) -> dict[str, Any]:
    """One line of the profiles table."""
    return {
        "slug": profile.slug,
        "display_name": profile.display_name,
        "gpu": profile.gpu.describe() if profile.gpu else "CPU only",
        "cpu": str(profile.to_spec()["cpu"]),
        "memory": format_quantity(profile.memory_bytes),
        "images": ", ".join(profile.images) or "(the catalog's first)",
        "price": credits_text(profile.price_per_hour_ucr),
        "spot_price": (credits_text(profile.spot_price_per_hour_ucr)
                       if profile.offers_spot else ""),
        "min_run": format_duration(profile.min_run_s),
        "idle_timeout": format_duration(profile.idle_timeout_s),
        "max_runtime": format_duration(profile.max_runtime_s),
        "groups": ", ".join(profile.groups) or "everyone",
        "enabled": profile.enabled,
    }


# --- inventory --------------------------------------------------------------------

def inventory_rows(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """api/inventory's nested nodes -> one row per device (a MIG slice or a full card)."""
    rows = []
    for node in view.get("nodes") or []:
        for gpu in node.get("gpus") or []:
            for device in gpu.get("devices") or []:
                holder = device.get("holder") or {}
                rows.append({
                    "node": node.get("name", ""),
                    "gpu": f"{gpu.get('model', '')} #{gpu.get('index', '')}".strip(" #"),
                    "gpu_uuid": gpu.get("uuid", ""),
                    "device": device.get("profile") or "full card",
                    "uuid": device.get("uuid", ""),
                    "state": device.get("state", ""),
                    "user": holder.get("user", ""),
                    "server": holder.get("server", ""),
                    "profile": holder.get("profile", ""),
                    "tier": holder.get("tier", ""),
                    "since": holder.get("since", ""),
                })
    for device in view.get("gone") or []:
        holder = device.get("holder") or {}
        rows.append({"node": "", "gpu": "(not in the inventory)", "gpu_uuid": "",
                     "device": "", "uuid": device.get("uuid", ""), "state": "gone",
                     "user": holder.get("user", ""), "server": holder.get("server", ""),
                     "profile": holder.get("profile", ""), "tier": holder.get("tier", ""),
                     "since": holder.get("since", "")})
    return rows


def inventory_counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts = {"free": 0, "held": 0, "out_of_service": 0, "gone": 0}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return counts


def cluster_node_tables(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """api/inventory's cluster form -> one table per node: resource, allocatable, free, holders.

    A holder reads `user/server ×count` (`(default)` for the default server; `, spot`
    after a spot server's count), or `namespace/pod ×count` for a pod that is not
    gpulease's.
    """
    tables = []
    for node in view.get("nodes") or []:
        rows = []
        for r in node.get("resources") or []:
            holders = []
            for h in r.get("holders") or []:
                who = (f"{h['user']}/{h.get('server') or '(default)'}" if h.get("user")
                       else f"{h.get('pod', '')} (not gpulease's)")
                spot = f", {h['tier']}" if is_preemptible(h.get("tier", "")) else ""
                holders.append(f"{who} ×{h.get('count', 0)}{spot}")
            rows.append({"resource": r.get("resource", ""), "allocatable": r.get("allocatable", 0),
                         "free": r.get("free", 0), "holders": holders})
        tables.append({"name": node.get("name", ""), "model": node.get("model") or "(no GPU model)",
                       "mig_strategy": node.get("mig_strategy", ""),
                       "driver": node.get("driver") or "unknown",
                       "schedulable": bool(node.get("schedulable")), "rows": rows,
                       "devices": [dra_device_row(d) for d in node.get("devices") or []],
                       "carved": [carved_gpu_row(g) for g in node.get("gpus") or []]})
    return tables


def _holder_text(h: Mapping[str, Any] | None) -> str:
    if not h:
        return "free"
    if h.get("user"):
        tier = f", {h['tier']}" if is_preemptible(h.get("tier", "")) else ""
        return f"{h['user']}/{h.get('server') or '(default)'}{tier}"
    return f"{h.get('pod', '')} (not gpulease's)"


def carved_gpu_row(gpu: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamicMIG GPU (api/inventory's `gpus`): the slices carved on it now, each with
    its memory slices' start and holder; "nothing carved" when idle."""
    slices = [{"device": c.get("device", ""),
               "what": f"MIG {c['profile']}" if c.get("profile") else "whole GPU",
               "at": c.get("first_memory_slice"), "holder": _holder_text(c.get("holder"))}
              for c in gpu.get("carved") or []]
    return {"gpu": gpu.get("gpu", ""), "slices": slices}


def dra_device_row(device: Mapping[str, Any]) -> dict[str, str]:
    """A DRA node's device (api/inventory's `devices`): its uuid, what it is, its holder."""
    holder = _holder_text(device.get("holder"))
    return {"uuid": device.get("uuid", ""), "name": device.get("name", ""),
            "what": (f"MIG {device.get('profile')}" if device.get("type") == "mig"
                     else "full card"), "holder": holder}


def queue_rows(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The queue of api/inventory, if the service has one (older views lack the key)."""
    rows = []
    for i, item in enumerate(view.get("queue") or [], start=1):
        if isinstance(item, Mapping):
            rows.append({"position": item.get("position", i), "user": item.get("user", ""),
                         "server": item.get("server", ""), "profile": item.get("profile", ""),
                         "enqueued": item.get("enqueued_at") or item.get("since") or ""})
    return rows


# --- audit ------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    key: str
    before: str
    after: str


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k in sorted(value, key=str):
            out.update(_flatten(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix or "(value)": value}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[Change]:
    """Keys whose value changed (nested keys dotted); "" for a side where a key is absent."""
    old, new = _flatten(before or {}), _flatten(after or {})
    keys = sorted(set(old) | set(new))
    return [Change(k, _text(old[k]) if k in old else "", _text(new[k]) if k in new else "")
            for k in keys if old.get(k, ...) != new.get(k, ...)]


def pretty(value: Any) -> str:
    return "" if value is None else json.dumps(value, indent=2, sort_keys=True, default=str,
                                               ensure_ascii=False)


def audit_row(entry: AuditEntry) -> dict[str, Any]:
    """One audit entry for the page: changed keys for an update, the whole side otherwise."""
    both = entry.before is not None and entry.after is not None
    return {
        "at": iso(entry.at), "actor": entry.actor, "action": entry.action,
        "target": entry.target,
        "changes": diff(entry.before, entry.after) if both else [],
        "before": "" if both else pretty(entry.before),
        "after": "" if both else pretty(entry.after),
    }


@dataclass(frozen=True)
class Paging:
    offset: int
    limit: int
    total: int

    @property
    def prev_offset(self) -> int | None:
        return max(0, self.offset - self.limit) if self.offset > 0 else None

    @property
    def next_offset(self) -> int | None:
        return self.offset + self.limit if self.offset + self.limit < self.total else None

    @property
    def first_shown(self) -> int:
        return min(self.offset + 1, self.total)

    @property
    def last_shown(self) -> int:
        return min(self.offset + self.limit, self.total)


def parse_offset(text: str | None) -> int:
    """A page offset from the query; anything not a non-negative integer is the first page."""
    # isascii: "²" is a digit to str.isdigit, but not to int()
    return int(text) if text and text.isascii() and text.isdigit() and len(text) < 10 else 0

