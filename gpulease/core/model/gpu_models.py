"""GPU model facts: model keys, nominal memory, MIG profiles.

Profiles, the declared inventory file and every inventory adapter (NVML, GPU
feature discovery) speak in the same short model keys (`H200`, `A100-80GB`)
and MIG profile names (`1g.18gb`). This module is the one table of them, so
that supporting a new GPU is one entry here. Pure data and pure functions.
"""

from __future__ import annotations

import re

GiB = 1024**3

# Nominal memory of a full card. NVML reports the exact figure of a real
# card; this one fills in where a declared inventory omits `memory`.
GPU_MEMORY: dict[str, int] = {
    "A100-40GB": 40 * GiB,
    "A100-80GB": 80 * GiB,
    "H100-80GB": 80 * GiB,
    "H100-NVL": 94 * GiB,
    "H200": 141 * GiB,
    "L40S": 48 * GiB,
    "A10G": 24 * GiB,
    "T4": 16 * GiB,
}

KNOWN_MODELS: tuple[str, ...] = tuple(GPU_MEMORY)

# Model key -> every value GPU feature discovery writes to a whole card's
# `nvidia.com/gpu.product` label (the NVML name with hyphens for spaces). One
# key can be several products (SXM and PCIe boards), so a pod's node affinity
# for a model lists them all. Under the `single` MIG strategy GFD appends
# `-MIG-<profile>` to these.
GFD_PRODUCTS: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
    "H100-80GB": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"),
    "H100-NVL": ("NVIDIA-H100-NVL",),
    "H200": ("NVIDIA-H200",),
    "L40S": ("NVIDIA-L40S",),
    "A10G": ("NVIDIA-A10G",),
    "T4": ("Tesla-T4",),
}

# Model key -> every NVML name of a whole card of that model: what NVIDIA's DRA driver
# publishes as a device's `productName` attribute (gpulease/core/model/nvidia_dra.py),
# so a ResourceClaim's CEL selector for a model lists them all. The same boards as
# GFD_PRODUCTS, with NVML's spaces (GFD's labels replace them with hyphens).
NVML_PRODUCTS: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
    "H100-NVL": ("NVIDIA H100 NVL",),
    "H200": ("NVIDIA H200",),
    "L40S": ("NVIDIA L40S",),
    "A10G": ("NVIDIA A10G",),
    "T4": ("Tesla T4",),
}

# NVML name -> model key: the only names DRA mode counts as a model (its selectors ask for
# exactly these), so that what the inventory offers is what a claim can be allocated.
NVML_MODELS: dict[str, str] = {name: key for key, names in NVML_PRODUCTS.items()
                               for name in names}

_A100_80_PROFILES = {
    "1g.10gb": 7,
    "1g.10gb+me": 1,
    "1g.20gb": 4,
    "2g.20gb": 3,
    "3g.40gb": 2,
    "4g.40gb": 1,
    "7g.80gb": 1,
}

# Model key -> {MIG profile name: most instances of it on one GPU}.
MIG_PROFILES: dict[str, dict[str, int]] = {
    "A100-40GB": {
        "1g.5gb": 7,
        "1g.5gb+me": 1,
        "1g.10gb": 4,
        "2g.10gb": 3,
        "3g.20gb": 2,
        "4g.20gb": 1,
        "7g.40gb": 1,
    },
    "A100-80GB": dict(_A100_80_PROFILES),
    "H100-80GB": dict(_A100_80_PROFILES),
    "H200": {
        "1g.18gb": 7,
        "1g.18gb+me": 1,
        "1g.35gb": 4,
        "2g.35gb": 3,
        "3g.71gb": 2,
        "4g.71gb": 1,
        "7g.141gb": 1,
    },
    "H100-NVL": {
        "1g.12gb": 7,
        "1g.12gb+me": 1,
        "1g.24gb": 4,
        "2g.24gb": 3,
        "3g.47gb": 2,
        "4g.47gb": 1,
        "7g.94gb": 1,
    },
}

# Every MIG-capable GPU in the table has seven compute slices.
MIG_COMPUTE_SLICES_PER_GPU = 7

_PROFILE_RE = re.compile(r"^(\d+)g\.(\d+)gb(\+[a-z.]+)?$")


def _profile_parts(profile: str) -> tuple[int, int]:
    match = _PROFILE_RE.match(profile)
    if match is None:
        raise ValueError(f"{profile!r} is not a MIG profile name (like 1g.18gb)")
    return int(match.group(1)), int(match.group(2))


def mig_compute_slices(profile: str) -> int:
    """Compute slices of a MIG profile: the N in `Ng.Mgb` (`3g.71gb` -> 3)."""
    return _profile_parts(profile)[0]


def mig_memory_bytes(profile: str) -> int:
    """Nominal memory of a MIG profile, from its name (`1g.18gb` -> 18 GiB).

    The name rounds: a real device reports somewhat less (NVML has the exact
    figure). Gibibytes, to match the full cards' `141Gi`.
    """
    return _profile_parts(profile)[1] * GiB


# What a MIG device really holds, where it has been published: `nvidia-smi mig -lgip`'s
# "Memory GiB" column. H100 80GB: jbarrow.ai/field_notes/nvidia-mig (driver listing,
# 2026-06-11). The name rounds up, by as much as 1g.18gb's 18 for 16.00 GiB on an H200.
MIG_USABLE_GIB: dict[str, dict[str, float]] = {
    "H100-80GB": {"1g.10gb": 9.75, "1g.20gb": 19.62, "2g.20gb": 19.62, "3g.40gb": 39.50,
                  "4g.40gb": 39.50, "7g.80gb": 79.25},
}
# Elsewhere, this share of the name's memory: below every published listing's ratio
# (the lowest known, an H200 1g.18gb's 16.00 / 18, is 0.889).
MIG_USABLE_SHARE = 0.875


def mig_usable_bytes(model: str, profile: str) -> int:
    """Memory a program can count on in a `model` MIG device of `profile`: the published
    listing's, else `MIG_USABLE_SHARE` of the name's (never more than it really has)."""
    base = profile.split("+", 1)[0]
    listed = MIG_USABLE_GIB.get(model, {}).get(base)
    if listed is not None:
        return int(listed * GiB)
    return int(mig_memory_bytes(profile) * MIG_USABLE_SHARE)


# A whole card's memory as nvidia-smi totals it, where published (MiB): A10G and L40S
# (public `nvidia-smi` listings). A program gets somewhat less than the box says.
CARD_TOTAL_MIB: dict[str, int] = {"A10G": 23028, "L40S": 46068}
# Elsewhere, this share of the nominal size: below the listed ratios (A10G's 23028 MiB of
# 24 GiB is 0.937; an H100 in MIG mode gives its 7g.80gb 79.25 of 80 GiB).
CARD_USABLE_SHARE = 0.93


def card_usable_bytes(model: str) -> int | None:
    """Memory a program can count on in one whole card of `model`: a whole H100 80GB as
    its 7g.80gb instance, else nvidia-smi's published total, else CARD_USABLE_SHARE of the
    nominal size (never more than it really has); None for a model gpulease does not know."""
    listed = MIG_USABLE_GIB.get(model, {}).get(f"{MIG_COMPUTE_SLICES_PER_GPU}g."
                                               f"{GPU_MEMORY.get(model, 0) // GiB}gb")
    if listed is not None:
        return int(listed * GiB)
    if model in CARD_TOTAL_MIB:
        return CARD_TOTAL_MIB[model] * 1024**2
    nominal = GPU_MEMORY.get(model)
    return None if nominal is None else int(nominal * CARD_USABLE_SHARE)


def valid_mig_profiles(model: str) -> list[str] | None:
    """MIG profile names of `model`; None if it has no MIG or is unknown."""
    profiles = MIG_PROFILES.get(model)
    return list(profiles) if profiles is not None else None


def mig_profile_from_attributes(model: str, slices: int, memory_mib: int) -> str | None:
    """The profile of `model` with `slices` compute slices nearest `memory_mib`.

    For MIG devices whose NVML name carries no profile. `+me` variants have the
    same slices and memory as their base profile, so the base one is returned.
    """
    candidates = [
        p for p in MIG_PROFILES.get(model, {}) if "+" not in p and mig_compute_slices(p) == slices
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda p: abs(mig_memory_bytes(p) - memory_mib * 1024**2))


# Product names (vendor prefix and MIG suffix removed, hyphens or spaces) ->
# model key. Checked in order; the first match wins.
_NAME_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), key)
    for pattern, key in (
        (r"^A100\b.*\b40GB\b", "A100-40GB"),
        (r"^A100\b.*\b80GB\b", "A100-80GB"),
        (r"^H100[ -]NVL$", "H100-NVL"),
        (r"^H100([ -].*\b80GB\b.*|[ -]PCIe|[ -]SXM5?)$", "H100-80GB"),
        (r"^H200([ -]141GB\b.*)?$", "H200"),
    )
)


def _known_key(product: str) -> str | None:
    short = re.sub(r"^(NVIDIA|Tesla)[ -]", "", product.strip(), flags=re.IGNORECASE)
    for pattern, key in _NAME_RULES:
        if pattern.match(short):
            return key
    for key in KNOWN_MODELS:
        if short.upper() == key.upper():
            return key
    return None


def model_key_from_nvml_name(name: str) -> str:
    """Model key for an NVML device name; an unknown name passes through unchanged.

    'NVIDIA H200' -> 'H200', 'NVIDIA A100-SXM4-80GB' -> 'A100-80GB'. A MIG
    device's name ('NVIDIA H200 MIG 1g.18gb') maps to its GPU's key.
    """
    product = re.sub(r"\s+MIG\s+\S+$", "", name.strip())
    return _known_key(product) or name


def model_key_from_gfd_product(label: str) -> tuple[str, str | None]:
    """(model key, MIG profile or None) for a GFD `nvidia.com/gpu.product` label.

    GFD writes the NVML name with hyphens for spaces, adds `-MIG-<profile>`
    under the single MIG strategy and `-SHARED` under time-slicing:
    'NVIDIA-H200-MIG-1g.18gb' -> ('H200', '1g.18gb'). Unknown products pass
    through unchanged (without the suffixes).
    """
    product, _, profile = label.strip().partition("-MIG-")
    product = re.sub(r"-SHARED$", "", product)
    profile = re.sub(r"-SHARED$", "", profile)
    return _known_key(product.replace("-", " ")) or product, profile or None
