"""One GPU or MIG device as NVIDIA's DRA driver publishes it in a ResourceSlice: pure.

The record the DRA inventory (dra_inventory.py) keeps per device, and the
inventory page's device rows show (uuid, profile, holder).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        that every capacity decision reads a DRA node as it reads a device-plugin one."""
        return f"nvidia.com/mig-{self.profile}" if self.type == TYPE_MIG else "nvidia.com/gpu"
