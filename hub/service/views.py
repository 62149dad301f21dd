"""JSON shapes of the gpulease service's API, as pure functions over plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpulease.core.capacity.cluster_availability import FREE, Availability
from gpulease.core.capacity.cluster_inventory import ClusterInventory
from gpulease.core.capacity.reservation_rules import Reservation
from gpulease.core.model.inventory import Inventory
from gpulease.core.model.profiles import Profile
from gpulease.store.assignments import Holder
from gpulease.store.queue_store import QueuedSpawn
from gpulease.store.reservations import kind_words


def inventory_view(
    inventory: Inventory, held: dict[str, Holder], queue: Sequence[QueuedSpawn] = (),
    isolation: dict | None = None, tiers: Mapping[tuple[str, str], str] | None = None,
    reservations: Sequence[Reservation] = (),
) -> dict[str, Any]:
    """`api/inventory` (docs/rest-api.yml): devices free, held (by whom), out of service or gone.

    `out_of_service`: the device's last server stopped but its cgroup could
    not be emptied; `holder` is that server. Also the queue. `tiers`: the tier
    of each running server's session ((user, server) -> on-demand | spot), so a
    holder says whether its devices may be preempted; a holder without an open
    session (starting, or out of service) has none. `reservations`: those holding
    capacity now, with their holder (account) and how many of their units run (a
    holder's device names its reservation).
    """
    tiers = tiers or {}
    present = inventory.device_uuids()
    nodes = []
    for node in inventory.nodes:
        gpus = []
        for gpu in node.gpus:
            if gpu.mig_enabled:
                units = [(d.uuid, d.profile, d.memory_bytes) for d in gpu.mig_devices]
            else:
                units = [(gpu.uuid, None, gpu.memory_bytes)]
            gpus.append(
                {
                    "model": gpu.model,
                    "uuid": gpu.uuid,
                    "index": gpu.index,
                    "mig": gpu.mig_enabled,
                    "memory_bytes": gpu.memory_bytes,
                    "driver": gpu.driver,
                    "devices": [_device(uuid, profile, mem, held, tiers)
                                for uuid, profile, mem in units],
                }
            )
        nodes.append({"name": node.name, "gpus": gpus})
    gone = [
        {**_device(uuid, None, None, held, tiers), "state": "gone"}
        for uuid in sorted(held)
        if uuid not in present
    ]
    return {
        "shape": "embedded",
        "source": inventory.source,
        "label": inventory.label,
        "nodes": nodes,
        "gone": gone,
        "queue": queue_view(queue),
        "isolation": isolation_view(isolation or {}),
        "reservations": reserved_view(reservations, held),
    }


def reserved_view(reservations: Sequence[Reservation],
                  held: dict[str, Holder]) -> list[dict[str, Any]]:
    servers: dict[int, set[tuple[str, str]]] = {}
    for h in held.values():
        if h.reservation_id is not None and h.state == "held":
            servers.setdefault(h.reservation_id, set()).add((h.user, h.server))
    return [{"id": r.id, "account": r.account, "profile": r.profile,
             "devices": kind_words(r.kind), "units": r.units,
             "in_use": len(servers.get(r.id, ())),
             "until": r.holds_until().isoformat() + "Z"} for r in reservations]


def cluster_inventory_view(inventory: ClusterInventory, listed_at: datetime, namespace: str,
                           queue: Sequence[QueuedSpawn] = ()) -> dict[str, Any]:
    """`api/inventory` in the cluster shape: per node and resource, counts and holders.

    The API server never says which device a pod got, so there are no device
    UUIDs here: `ClusterInventory.rows()`, each holder a gpulease server
    ({user, server, count}) or another pod ({pod: namespace/name, count}).
    """
    return {
        "shape": "cluster",
        "namespace": namespace,
        "listed_at": listed_at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z",
        "nodes": inventory.rows(),
        "queue": queue_view(queue),
    }


def queue_view(queue: Sequence[QueuedSpawn]) -> list[dict[str, Any]]:
    return [{"user": q.user, "server": q.server, "profile": q.profile,
             "position": q.position, "since": q.enqueued_at.isoformat() + "Z"} for q in queue]


def isolation_view(isolation: dict) -> dict[str, Any]:
    """How users are kept apart on this host (docs/security.md); unknown outside `gpulease up`."""
    return {
        "unix_accounts": bool(isolation.get("unix_accounts")),
        "limits": isolation.get("resource_limits", "unknown"),
        "device_control": bool(isolation.get("device_control")),
        "accounts_summary": isolation.get("accounts", ""),
        "limits_summary": isolation.get("limits", ""),
    }


def _device(uuid: str, profile: str | None, memory: int | None, held: dict[str, Holder],
            tiers: Mapping[tuple[str, str], str]):
    holder = held.get(uuid)
    shown_holder = None
    if holder:
        shown_holder = {"user": holder.user, "server": holder.server, "profile": holder.profile,
                        "since": holder.since.isoformat() + "Z"}
        tier = tiers.get((holder.user, holder.server))
        if tier is not None and holder.state == "held":
            shown_holder["tier"] = tier
        if holder.reservation_id is not None and holder.state == "held":
            shown_holder["reservation"] = holder.reservation_id
    return {
        "uuid": uuid,
        "profile": profile,
        "memory_bytes": memory,
        "state": holder.state if holder else "free",  # "held" | "out_of_service"
        "holder": shown_holder,
    }


def profile_view(
    profile: Profile, shown: Availability | None, *, admin: bool, queued: int = 0
) -> dict[str, Any]:
    """A profile as in the file, plus `availability` {free, total, queued, state}.

    `shown`: its GPUs as gpulease/core/capacity/cluster_availability.py counts them (this host's,
    or the cluster's); None for a profile without a GPU. `queued`: spawns of this profile waiting
    in the queue (QueueStore.waiting_by_profile).
    """
    spec = {"slug": profile.slug, **profile.to_spec()}
    if not admin:
        spec.pop("enabled", None)
    if shown is None:
        spec["availability"] = {"free": None, "total": None, "queued": queued, "state": FREE}
    else:
        spec["availability"] = {"free": shown.free, "total": shown.total, "queued": queued,
                                "state": shown.state}
        if shown.why:
            spec["availability"]["why"] = shown.why
    return spec
