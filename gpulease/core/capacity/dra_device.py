"""One GPU or MIG device as NVIDIA's DRA driver publishes it in a ResourceSlice: pure.

`device_from` reads one from a slice's device entry.

The record the DRA inventory (dra_inventory.py) keeps per device, and the
inventory page's device rows show (uuid, profile, holder).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulease.core.model import nvidia_dra as nv
from gpulease.core.model.gpu_models import NVML_MODELS
from gpulease.core.model.nvidia_dra import TYPE_MIG


@dataclass(frozen=True)
class DraDevice:
    name: str  # the device's name in its slice (unique in its pool)
    pool: str
    uuid: str
    type: str  # nvidia_dra.TYPE_GPU | TYPE_MIG
    model: str | None  # gpulease's model key, from productName
    profile: str | None = None  # a MIG device's profile
    driver_version: str = ""
    parent_uuid: str = ""  # a MIG device's GPU

    @property
    def resource(self) -> str:
        """The name the inventory counts it under: the device plugin's `mixed` names
        (nvidia.com/gpu for a full card, nvidia.com/mig-<profile> for a slice), so
        that every capacity decision reads a DRA node as it reads a device-plugin one;
        "" for a partitionable device of no kind sold (counted, never offered)."""
        if self.type == TYPE_MIG:
            return f"nvidia.com/mig-{self.profile}"
        return "nvidia.com/gpu" if self.type == nv.TYPE_GPU else ""


def attribute(device: dict, name: str) -> str:
    """A device attribute's value as text ({string|version|int|bool: value}); "" if none."""
    value = (device.get("attributes") or {}).get(name) or {}
    for key in ("string", "version", "int", "bool"):
        if key in value:
            return str(value[key])
    return ""


def device_from(pool: str, device: dict) -> DraDevice | None:
    """A published GPU or MIG device; None for other types (not sold)."""
    kind = attribute(device, nv.TYPE)
    if kind not in (nv.TYPE_GPU, nv.TYPE_MIG):
        return None
    product = attribute(device, nv.PRODUCT_NAME)
    profile = attribute(device, nv.MIG_PROFILE) if kind == nv.TYPE_MIG else ""
    if kind == nv.TYPE_MIG and not profile:
        return None  # a slice of no known profile can be asked for by no profile
    return DraDevice(device["name"], pool, attribute(device, nv.UUID) or device["name"], kind,
                     NVML_MODELS.get(product, product) if product else None, profile or None,
                     attribute(device, nv.DRIVER_VERSION), attribute(device, nv.PARENT_UUID))
