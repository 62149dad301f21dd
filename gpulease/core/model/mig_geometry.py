"""Where a MIG slice can sit on its GPU: NVML's placements, and the counters NVIDIA's
DRA driver derives from them in DynamicMIG mode. Pure facts.

Every MIG-capable GPU gpulease sells (A100, H100, H200) has 8 memory slices and 7
compute slices. A GPU instance of a profile occupies `size` consecutive memory
slices from one of its allowed `starts` (NVML's GetGpuInstancePossiblePlacements,
`nvidia-smi mig -lgipp`); two instances never share a memory slice. The table
below is those placements, per profile shape: compute slices and memory slices.

In DynamicMIG mode the driver (kubernetes-sigs/dra-driver-nvidia-gpu,
cmd/gpu-kubelet-plugin/partitions.go and mig.go at 9593204) publishes, per GPU:
- one counter set `gpu-<minor>-counter-set`: a counter per capacity, its value
  the largest of any profile's (the 7g's), named in DNS form (`multiprocessors`,
  `copy-engines`, `decoders`, `encoders`, `jpeg-engines`, `ofa-engines`,
  `memory`), and `memory-slice-0` ... `memory-slice-7` of 1 each;
- the full GPU `gpu-<minor>`, consuming all of it;
- every placement of every profile as a device
  `gpu-<minor>-mig-<profile without dots>-<GI profile id>-<start>`, consuming its
  capacities and its memory slices.
kube-scheduler then never allocates two devices that overlap.

The per-profile capacities here are the memory of its memory slices and 16 SMs
(H100/H200) or 14 (A100) a compute slice, as `nvidia-smi mig -lgip` lists them
to within rounding; only the memory slices ever decide a fit (a 7g's figures
are at least the sum of any set of disjoint placements'). `+me` profiles
(one per GPU, with the media engines) are not placed by gpulease.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulease.core.model.gpu_models import (
    GPU_MEMORY,
    MIG_PROFILES,
    mig_compute_slices,
    mig_memory_bytes,
)

MEMORY_SLICES = 8

# (compute slices, memory slices) -> (NVML GPU-instance profile id, allowed starts)
_SHAPES: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {
    (1, 1): (19, (0, 1, 2, 3, 4, 5, 6)),
    (1, 2): (15, (0, 2, 4, 6)),
    (2, 2): (14, (0, 2, 4)),
    (3, 4): (9, (0, 4)),
    (4, 4): (5, (0,)),
    (7, 8): (0, (0,)),
}
# Streaming multiprocessors per compute slice; the 7g has the GPU's all.
_SMS_PER_SLICE = {"A100-40GB": 14, "A100-80GB": 14}
_SMS_FULL = {"A100-40GB": 98, "A100-80GB": 98}


@dataclass(frozen=True)
class Placement:
    profile: str  # e.g. "3g.71gb"
    gi_profile_id: int
    start: int  # first memory slice
    size: int  # memory slices

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)


def memory_slices_of(model: str, profile: str) -> int:
    """How many of the GPU's 8 memory slices a profile occupies (from its memory)."""
    share = GPU_MEMORY[model] / MEMORY_SLICES
    return max(1, round(mig_memory_bytes(profile) / share))


def placements(model: str) -> dict[str, list[Placement]]:
    """Every profile of `model` (but `+me`) and its placements, in NVML's start order;
    {} for a model without MIG."""
    out: dict[str, list[Placement]] = {}
    for profile in MIG_PROFILES.get(model, {}):
        if "+" in profile:
            continue
        shape = (mig_compute_slices(profile), memory_slices_of(model, profile))
        if shape not in _SHAPES:
            raise ValueError(f"{model} {profile}: no known MIG placement for {shape}")
        gi_id, starts = _SHAPES[shape]
        out[profile] = [Placement(profile, gi_id, s, shape[1]) for s in starts]
    return out


def capacities(model: str, profile: str | None) -> dict[str, int]:
    """The counters a profile's placement consumes besides its memory slices (None: the
    full GPU's, which are also its counter set's values), in the driver's DNS names."""
    compute = mig_compute_slices(profile) if profile else 7
    if compute == 7:  # the 7g is the whole GPU's figures (the driver's maxima are its)
        profile = None
    if profile is None:
        sms = _SMS_FULL.get(model, 132)
        memory = GPU_MEMORY[model]
    else:
        sms = compute * _SMS_PER_SLICE.get(model, 16)
        memory = memory_slices_of(model, profile) * (GPU_MEMORY[model] // MEMORY_SLICES)
    return {"multiprocessors": sms, "copy-engines": compute, "decoders": compute,
            "encoders": 0, "jpeg-engines": compute, "ofa-engines": 0 if profile else 1,
            "memory": memory}


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def device_name(minor: int, placement: Placement) -> str:
    """The driver's name for a placement's device (mig.go ToCanonicalName)."""
    pname = placement.profile.replace(".", "").replace("+", "-")
    return f"gpu-{minor}-mig-{pname}-{placement.gi_profile_id}-{placement.start}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"
