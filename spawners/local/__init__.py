"""LocalGPUSpawner, the embedded shape: one process per server, as the researcher's Unix
account in its own cgroup, forked warm or started cold.

`gpulease.spawners.local.LocalGPUSpawner` is the class path configurations name; importing this
package imports nothing until that name is asked for (spawner.py holds the class).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "LocalGPUSpawner":
        from gpulease.spawners.local.spawner import LocalGPUSpawner

        return LocalGPUSpawner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
