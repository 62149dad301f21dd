"""The spawners' options for admission: the queue and the per-user limits.

A mixin of GPULeaseSpawnCore, so of both shapes' spawners (as GPULeaseOptions is
of GPULeaseHub), kept apart so that the spawn path's module stays about its
behaviour. `gpulease up` sets each
from the GPULeaseHub option of that name (hub_config); docs/config.md lists
them under LocalGPUSpawner (tests/checks/test_docs.py checks).
"""

from __future__ import annotations

from traitlets import Float, Integer
from traitlets.config import Configurable

from gpulease.core.capacity.queue import QUEUE_PLACES_PER_USER
from gpulease.core.policy.cpu_totals import CPU_ONLY_CPU_PER_USER, CPU_ONLY_MEMORY_PER_USER
from gpulease.spawners.queueing.spot_preemption import SPOT_GRACE_S
from gpulease.spawners.start.cap_traits import CoresCap, MemoryCap


class AdmissionOptions(Configurable):
    queue_max_wait = Float(
        1800.0,
        config=True,
        help="Seconds a GPU start may wait in the queue for a free device; 0: refuse at once "
        "(503, naming what is free). Set by `gpulease up` from GPULeaseHub.queue_max_wait.",
    )
    queue_max_length = Integer(
        500, config=True, help="Most spawns waiting in the queue; beyond, a start is refused (503)."
    )
    spot_grace_period = Float(
        SPOT_GRACE_S,
        config=True,
        help="Seconds a spot server gets to save its work once it is preempted for an "
        "on-demand start (told at once in JupyterLab and on the hub's pages); it is then "
        "suspended with reason preempted and billed up to then. An on-demand server "
        "displaced from reserved capacity by a holder's start gets as long.",
    )
    queue_poll_interval = Float(
        5.0,
        config=True,
        help="Seconds between passes over the queue while spawns wait (releases in this hub "
        "also wake it at once).",
    )
    # Per-user limits, each refused with 409 naming it.
    queue_places_per_user = Integer(
        QUEUE_PLACES_PER_USER, config=True,
        help="Most places one user holds in the queue at once; 0: no limit. Set by `gpulease "
        "up` from GPULeaseHub.queue_places_per_user.",
    )
    cpu_only_cpu_per_user = CoresCap(
        CPU_ONLY_CPU_PER_USER, config=True,
        help="Cores all of one user's running and starting CPU-only servers may have "
        "together; 0: no limit. Set by `gpulease up` from GPULeaseHub.cpu_only_cpu_per_user.",
    )
    cpu_only_memory_per_user = MemoryCap(
        CPU_ONLY_MEMORY_PER_USER, config=True,
        help="Memory all of one user's running and starting CPU-only servers may have "
        "together; 0: no limit. Set by `gpulease up` from GPULeaseHub.cpu_only_memory_per_user.",
    )
