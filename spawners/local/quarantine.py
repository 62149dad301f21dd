"""Devices out of service, and their return once nothing of their last server is left.

A stopped server's devices go back to the pool only when its cgroup is
empty (LocalGPUSpawner._release, gpulease.spawners.local.cgroup_kill). When it
cannot be emptied, the devices are out of service (AssignmentStore
.take_out_of_service) and `recheck`, on every heartbeat of the hub, kills
what is left again and returns them once the cgroup is empty. An admin may
return one sooner (`POST api/inventory/{uuid}/return`, `gpulease inventory
return UUID`): the service refuses while the cgroup still has processes,
unless the admin forces it (`leftover_pids` says what is there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpulease.spawners.local.cgroup_kill import Emptied, cgroup_pids
from gpulease.store.assignments import AssignmentStore, OutOfService

log = logging.getLogger(__name__)


def leftover_pids(record: OutOfService) -> list[int]:
    """The processes still in the cgroup that keeps `record`'s device (read only)."""
    return sorted(cgroup_pids(record.cgroup.get("dirs") or ()))


def recheck(store: AssignmentStore,
            cleanup: Callable[[dict], Emptied | None]) -> list[str]:
    """Try each out-of-service cgroup again; return the devices of those now empty.

    `cleanup` is isolation.cleanup (kill what is left, remove the folders).
    Returns the uuids back in service.
    """
    records = store.out_of_service()
    returned: list[str] = []
    tried: dict[str, bool] = {}  # one cgroup may keep several devices
    for uuid, record in records.items():
        key = repr(sorted(record.cgroup.items()))
        if key not in tried:
            try:
                emptied = cleanup(record.cgroup)
            except Exception:  # a broken record must not stop the others
                log.exception("cannot check the cgroup of out-of-service device %s", uuid)
                emptied = None
                tried[key] = False
            else:
                tried[key] = emptied is None or emptied.empty
                if not tried[key]:
                    log.warning("device %s stays out of service: %s", uuid, emptied.describe())
        if tried[key] and store.return_to_service(uuid, "emptied") is not None:
            log.warning("device %s is back in service: the cgroup of %s/%s is empty", uuid,
                        record.user, record.server or "(default)")
            returned.append(uuid)
    return returned
