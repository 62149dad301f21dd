"""Per-user totals of CPU-only servers: the cores and memory they have together.

A CPU-only start takes no device, so neither the GPU limits nor the queue
bound it: without a total, one user could start named servers until the
host's cores and memory were gone. A start is refused (409, naming the limit)
when the profiles' `cpu` or `memory` of the user's running and starting
CPU-only servers, with it, would exceed `GPULeaseHub.cpu_only_cpu_per_user`
or `cpu_only_memory_per_user`. GPU servers are bounded by the GPU limits and
are not counted here.

`cpu_only_refusal` is the pure decision; spawners/start/cap_traits.py's `CoresCap` and
`MemoryCap` the traitlets of the two caps (GPULeaseHub's and LocalGPUSpawner's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from gpulease.core.units import format_quantity, parse_cpu, parse_quantity

# The defaults, here only: GPULeaseHub's options and the spawner's traits use them.
CPU_ONLY_CPU_PER_USER = "16"
CPU_ONLY_MEMORY_PER_USER = "64Gi"
_CAP_HINT = "0 for no limit"


def parse_cores_cap(value: object) -> Decimal | None:
    """Cores ("16", "0.5", "500m"); "0": no limit (None)."""
    if value in ("0", 0):
        return None
    try:
        return parse_cpu(value)
    except ValueError as e:
        raise ValueError(f"{e} ({_CAP_HINT})") from None


def parse_memory_cap(value: object) -> int | None:
    """Bytes from a quantity ("64Gi"); "0": no limit (None)."""
    try:
        cap = parse_quantity(value)
    except ValueError as e:
        raise ValueError(f"{e} ({_CAP_HINT})") from None
    return cap or None


@dataclass(frozen=True)
class CpuOnlyServer:
    """One of the user's running or starting CPU-only servers, at its profile's size."""

    server: str
    cpu: Decimal
    memory_bytes: int


def _cores(n: Decimal) -> str:
    text = format(n.normalize(), "f")
    return f"{text} core" + ("" if n == 1 else "s")


def cpu_only_refusal(user: str, server: str, cpu: Decimal, memory_bytes: int,
                     others: Iterable[CpuOnlyServer], max_cpu: Decimal | None,
                     max_memory_bytes: int | None) -> str | None:
    """Why this CPU-only start (`cpu` cores, `memory_bytes`) would go over the user's
    totals, or None. `others`: the user's other running and starting CPU-only servers
    (the server being started is left out: a restart gives up what it had)."""
    mine = [o for o in others if o.server != server]
    held_cpu = sum((o.cpu for o in mine), Decimal(0))
    held_memory = sum(o.memory_bytes for o in mine)
    over = []
    if max_cpu is not None and held_cpu + cpu > max_cpu:
        over.append(f"cpu_only_cpu_per_user {_cores(max_cpu)}: {_cores(held_cpu)} held, "
                    f"this start asks for {_cores(cpu)} more")
    if max_memory_bytes is not None and held_memory + memory_bytes > max_memory_bytes:
        over.append(f"cpu_only_memory_per_user {format_quantity(max_memory_bytes)}: "
                    f"{format_quantity(held_memory)} held, this start asks for "
                    f"{format_quantity(memory_bytes)} more")
    if not over:
        return None
    by = ", ".join(f"{user}/{o.server or '(default)'}" for o in mine) or "none"
    return (f"Over the CPU-only limit of user:{user} (all their CPU-only servers together): "
            f"{'; '.join(over)}. Held by: {by}. Stop a CPU-only server, choose a smaller "
            "profile, or ask an admin to raise the limit.")
