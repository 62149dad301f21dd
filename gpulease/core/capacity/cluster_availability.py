"""What users are shown of a profile's GPUs: free now, would queue, or never fits here. Pure.

The start form (spawners/start/spawn_page.py) and `api/profiles` show, per GPU
profile, how many devices of its kind are free and what a start would meet.
In the cluster shape that is the cluster's answer, decided here over the
same ClusterInventory and the same rules as admission
(spawners/kube/cluster_runner.py): the fair queue's `plan_cluster` with the
starts admitted but not yet bound given room first, and the starts already
waiting served before this one. Limits and credit are the user's own and are
shown elsewhere. In the embedded shape the host's devices are counted the
same way (`host_availability`, placement's `place`).

Counts are devices (cards or slices of the kind), summed over the nodes that
offer the kind; `free` only counts schedulable nodes. A 2-GPU profile with
two cards free on two different nodes shows "2 of 16 free" yet would queue:
`state` says which.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpulease.core.capacity.cluster_inventory import ClusterInventory, kinds_offered
from gpulease.core.capacity.cluster_queue import plan_cluster
from gpulease.core.capacity.partitioned_fit import with_admitted
from gpulease.core.capacity.placement import NoFit, availability, place
from gpulease.core.capacity.queue import Waiting
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory

FREE = "free"  # a start would be admitted now
QUEUE = "queue"  # it would wait in the queue (no room now, or others wait first)
NEVER = "never"  # no node here can ever run it (`why` says what exists)
UNKNOWN = "unknown"  # the cluster could not be read (`why`)


@dataclass(frozen=True)
class Availability:
    """A profile's GPUs as a user is shown them."""

    free: int  # devices of its kind free now
    total: int  # devices of its kind here
    state: str  # FREE | QUEUE | NEVER | UNKNOWN
    why: str = ""  # NEVER, UNKNOWN: the reason, for the user


def unknown(why: str) -> Availability:
    return Availability(0, 0, UNKNOWN, why)


def cluster_availability(request: DeviceRequest, inventory: ClusterInventory,
                         admitted: Sequence[DeviceRequest] = (),
                         waiting: Sequence[DeviceRequest] = ()) -> Availability:
    """`request`'s kind counted over `inventory` (the nodes the spawner may use), and what
    a start would meet now: after room for `admitted` starts whose pods are not bound yet,
    and behind the `waiting` ones (the queue's order), as the cluster runner decides."""
    kind = (request.model, request.mig_profile)
    # DynamicMIG: the admitted starts take their devices first, and what is left is what
    # the fit rule could still carve (a 3g admitted takes room from 1g's too)
    carving = inventory.partitioned
    room = (with_admitted(inventory, admitted) if carving else inventory).free()
    total = free = 0
    for node in inventory.nodes:
        for offered, resource in kinds_offered(node):
            if offered == kind:
                total += node.allocatable[resource]
                if node.schedulable:
                    free += max(room[node.name][resource], 0)
    if not carving:
        free -= sum(r.count for r in admitted if (r.model, r.mig_profile) == kind)
    me = object()
    queue = [Waiting(i, r) for i, r in enumerate(waiting)] + [Waiting(me, request)]
    plan = plan_cluster(queue, inventory, tuple(admitted))
    never = dict(plan.never)
    if me in never:
        return Availability(max(free, 0), total, NEVER, never[me])
    state = FREE if me in dict(plan.start) else QUEUE
    return Availability(max(free, 0), total, state)


def host_availability(inventory: Inventory, held: Collection[str],
                      request: DeviceRequest) -> Availability:
    """The embedded shape's: this host's devices of the kind, and whether `place` finds
    room now (503: the queue) or never could (422)."""
    free, total = availability(inventory, held, request)
    try:
        place(request, inventory, held)
    except NoFit as nofit:
        if nofit.status == 422:
            return Availability(free, total, NEVER, nofit.message)
        return Availability(free, total, QUEUE)
    return Availability(free, total, FREE)
