"""GPUKubeSpawner, the cluster shape: one pod per server, placed by kube-scheduler, and
the watches and runners around it.

`gpulease.spawners.kube.GPUKubeSpawner` is the class path configurations name; importing this
package imports nothing until that name is asked for (spawner.py holds the class).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "GPUKubeSpawner":
        from gpulease.spawners.kube.spawner import GPUKubeSpawner

        return GPUKubeSpawner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
