"""What a server asks of the GPUs: a MIG slice of one profile, or full cards of a model.

A profile makes one (gpulease/core/model/profiles.py); placement finds devices
for it (gpulease/core/capacity/placement.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceRequest:
    """A MIG slice of one profile (count 1), or `count` full cards on one node."""

    model: str
    mig_profile: str | None = None
    count: int = 1
    # The image's need (gpulease/core/model/drivers.py): GPUs with an older driver are passed over.
    min_driver: str | None = None
    image: str | None = None  # its catalog name, for the refusal

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be at least 1, not {self.count}")
        if self.mig_profile is not None and self.count != 1:
            raise ValueError("a MIG request is for exactly one slice (count 1)")

    def describe(self) -> str:
        if self.mig_profile is not None:
            return f"{self.model} slice {self.mig_profile}"
        return cards_text(self.count, self.model)


def cards_text(count: int, model: str) -> str:
    """"2× H200 (full cards)": how a count of full cards shows in messages."""
    return f"{count}× {model} (full card{'s' if count != 1 else ''})"
