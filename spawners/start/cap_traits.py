"""The traitlets of the CPU-only servers' per-user caps (GPULeaseHub's and LocalGPUSpawner's
`cpu_only_cpu_per_user` and `cpu_only_memory_per_user`), checked as they are set by the
caps' own parsers (gpulease/core/policy/cpu_totals.py), so a bad value names the option.
"""

from __future__ import annotations

from traitlets import TraitError, Unicode

from gpulease.core.policy.cpu_totals import parse_cores_cap, parse_memory_cap


class _CapText(Unicode):
    """A cap as text, checked by `parse` when set (its error names the option)."""

    @staticmethod
    def parse(value: object) -> object:
        raise NotImplementedError

    def validate(self, obj, value):
        value = super().validate(obj, value)
        try:
            self.parse(value)
        except ValueError as e:
            raise TraitError(f"{self.name}: {e}") from None
        return value


class CoresCap(_CapText):
    """A cores cap as text ("16", "0.5"; "0": none)."""

    info_text = "cores like 16 or 0.5, or 0 for no limit"
    parse = staticmethod(parse_cores_cap)


class MemoryCap(_CapText):
    """A memory cap as a quantity ("64Gi"; "0": none)."""

    info_text = "a quantity like 64Gi, or 0 for no limit"
    parse = staticmethod(parse_memory_cap)
