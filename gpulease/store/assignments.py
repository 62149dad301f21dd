"""Who holds which device: the database adapter around `placement.place`.

A claim reads the open assignments, places, and records the result in ONE
transaction, serialised across processes (the hub, the gpulease service and
the CLI all open this database): SQLite takes its write lock up front
(`make_engine` issues BEGIN IMMEDIATE), PostgreSQL takes a transaction-level
advisory lock before reading. The partial unique index on open rows is the
last guard: should two claims still pick the same device, the second fails
with IntegrityError and is retried from the start.

A device whose last server's cgroup could not be emptied is *out of service*
(`take_out_of_service`): its assignment closes, an `out_of_service` row opens
in the same transaction, and `held()` and every claim count it as taken
until it returns (`return_to_service`: its cgroup emptied, or an admin).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from gpulease.core.capacity.placement import NoFit, Placement, free_summary
from gpulease.core.capacity.reserved_pool import HeldBy, place_keeping_units, withholding
from gpulease.core.clock import utcnow
from gpulease.core.model.device_request import DeviceRequest
from gpulease.core.model.inventory import Inventory
from gpulease.core.tiers import ON_DEMAND, RESERVED, yields_to
from gpulease.store.db import assignments, out_of_service, reading
from gpulease.store.reservations import active_in

log = logging.getLogger(__name__)

# Any fixed 64-bit number, the same in every process: "gpulease assignments".
ADVISORY_LOCK_KEY = 0x6770_756C_6561_7365 & 0x7FFF_FFFF_FFFF_FFFF
CLAIM_ATTEMPTS = 5

_open = assignments.c.released_at.is_(None)
_out = out_of_service.c.returned_at.is_(None)
HELD, OUT_OF_SERVICE = "held", "out_of_service"


@dataclass(frozen=True)
class Holder:
    """Who holds a device; for an out-of-service device, the server whose cgroup kept it."""

    user: str
    server: str
    profile: str
    since: dt.datetime
    state: str = HELD  # HELD | OUT_OF_SERVICE
    tier: str = ON_DEMAND  # what the claim was for (gpulease/core/capacity/reserved_pool.py)
    reservation_id: int | None = None

    def held_by(self) -> HeldBy:
        # An out-of-service device is nobody's reserved unit: it narrows on-demand room.
        tier = self.tier if self.state == HELD else ON_DEMAND
        return HeldBy(tier, (self.user, self.server), self.reservation_id)


def held_by(held: dict[str, Holder]) -> dict[str, HeldBy]:
    return {uuid: holder.held_by() for uuid, holder in held.items()}


@dataclass(frozen=True)
class OutOfService:
    device_uuid: str
    user: str
    server: str
    profile: str
    cgroup: dict  # kind, unit, dirs (gpulease.spawners.local.cgroup_kill.Emptied.state)
    detail: str  # what was left in it
    since: dt.datetime


@dataclass
class ReconcileReport:
    """Open assignments after a reconcile, as (device uuid, holder) pairs.

    `released`: closed now (reason 'server_died', or 'device_gone' for those
    also in `gone`). `gone`: devices no longer in the inventory, whether their
    row was released (server stopped) or kept (server still running, so the
    device is never handed out again while it is held).
    """

    kept: list[tuple[str, Holder]] = field(default_factory=list)
    released: list[tuple[str, Holder]] = field(default_factory=list)
    gone: list[tuple[str, Holder]] = field(default_factory=list)


def _holder(row: Any) -> Holder:
    return Holder(row.user_name, row.server_name, row.profile_slug, row.claimed_at,
                  tier=row.tier, reservation_id=row.reservation_id)


class AssignmentStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def _lock(self, conn: Connection) -> None:
        # SQLite already holds its write lock (BEGIN IMMEDIATE); PostgreSQL
        # needs one so that claims do not read the same free devices.
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})

    def claim(
        self, user: str, server: str, profile: str, request: DeviceRequest, inventory: Inventory,
        *, tier: str = ON_DEMAND, reservation_id: int | None = None,
    ) -> Placement:
        """Place `request` and record it; a server's earlier devices are released first.

        On a host with reservations active, what they withhold is checked in the same
        transaction (gpulease/core/capacity/reserved_pool.py): NoFit 503 when this start's tier may
        not have the devices now."""
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                with self.engine.begin() as conn:
                    self._lock(conn)
                    now = utcnow()
                    # A (re)start re-places: what this server held is free for it.
                    self._release_in(conn, user, server, "restart", now)
                    taken = self._held_in(conn)
                    withheld = withholding(inventory, held_by(taken), active_in(conn, now))
                    # a tier whose servers yield to holders is withheld nothing (spot's)
                    yields = yields_to(tier, RESERVED)
                    why = withheld.refusal(request, reservation_id, spot=yields)
                    if why is not None:
                        raise NoFit(503, f"No {request.describe()} for this start: {why}. "
                                         f"Free now: {free_summary(inventory, taken)}")
                    placement = place_keeping_units(request, inventory, taken, withheld,
                                                    reservation_id, spot=yields)
                    conn.execute(insert(assignments), [
                        {"device_uuid": d.uuid, "node": d.node, "user_name": user,
                         "server_name": server, "profile_slug": profile, "claimed_at": now,
                         "tier": tier, "reservation_id": reservation_id}
                        for d in placement.devices
                    ])
                return placement
            except IntegrityError as exc:
                log.warning("claim for %s/%s collided on a device (attempt %d): %s",
                            user, server, attempt, exc.orig)
        raise NoFit(503, f"Could not claim {request.describe()}: concurrent claims took the "
                         f"same devices {CLAIM_ATTEMPTS} times. Try again.")

    def retier(self, user: str, server: str, tier: str) -> None:
        """A running server's claim goes on at another tier (its reservation ended)."""
        mine = _open & (assignments.c.user_name == user) & (assignments.c.server_name == server)
        with self.engine.begin() as conn:
            self._lock(conn)
            conn.execute(update(assignments).where(mine)
                         .values(tier=tier, reservation_id=None))

    @staticmethod
    def _release_in(conn: Connection, user: str, server: str, reason: str,
                    now: dt.datetime) -> list[str]:
        mine = _open & (assignments.c.user_name == user) & (assignments.c.server_name == server)
        uuids = list(conn.execute(
            select(assignments.c.device_uuid).where(mine).order_by(assignments.c.id)
        ).scalars())
        if uuids:
            conn.execute(update(assignments).where(mine)
                         .values(released_at=now, release_reason=reason))
        return uuids

    def release(self, user: str, server: str, reason: str) -> list[str]:
        """Release a server's devices; returns them ([] if it held none)."""
        with self.engine.begin() as conn:
            return self._release_in(conn, user, server, reason, utcnow())

    @staticmethod
    def _held_in(conn: Connection) -> dict[str, Holder]:
        rows = conn.execute(select(assignments).where(_open).order_by(assignments.c.id))
        taken = {row.device_uuid: _holder(row) for row in rows}
        for row in conn.execute(select(out_of_service).where(_out)):
            taken.setdefault(row.device_uuid, Holder(
                row.user_name, row.server_name, row.profile_slug, row.since,
                OUT_OF_SERVICE))
        return taken

    def held(self) -> dict[str, Holder]:
        """Devices that are not free, by uuid: open assignments, and those out of service."""
        with reading(self.engine) as conn:
            return self._held_in(conn)

    # --- out of service ------------------------------------------------------------

    def take_out_of_service(self, user: str, server: str, reason: str, cgroup: dict,
                            detail: str) -> list[str]:
        """Close a server's assignments (`reason`) and keep its devices from placement.

        One transaction, under the claim lock: no claim sees them free in between.
        """
        with self.engine.begin() as conn:
            self._lock(conn)
            now = utcnow()
            mine = _open & (assignments.c.user_name == user) & (assignments.c.server_name == server)
            rows = list(conn.execute(select(assignments).where(mine).order_by(assignments.c.id)))
            if not rows:
                return []
            conn.execute(update(assignments).where(mine)
                         .values(released_at=now, release_reason=reason))
            already = set(conn.execute(
                select(out_of_service.c.device_uuid).where(_out)).scalars())
            new = [{"device_uuid": r.device_uuid, "node": r.node, "user_name": user,
                    "server_name": server, "profile_slug": r.profile_slug,
                    "cgroup": json.dumps(cgroup), "detail": detail, "since": now}
                   for r in rows if r.device_uuid not in already]
            if new:
                conn.execute(insert(out_of_service), new)
        uuids = [r.device_uuid for r in rows]
        log.error("devices %s of %s/%s are out of service: %s", ", ".join(uuids), user,
                  server or "(default)", detail)
        return uuids

    def out_of_service(self) -> dict[str, OutOfService]:
        """Open out-of-service records by device uuid."""
        with reading(self.engine) as conn:
            rows = conn.execute(select(out_of_service).where(_out).order_by(out_of_service.c.id))
            return {r.device_uuid: OutOfService(
                r.device_uuid, r.user_name, r.server_name, r.profile_slug, json.loads(r.cgroup),
                r.detail, r.since) for r in rows}

    def return_to_service(self, uuid: str, by: str) -> OutOfService | None:
        """Put a device back in the pool; None if it was not out of service."""
        with self.engine.begin() as conn:
            row = conn.execute(select(out_of_service).where(
                _out, out_of_service.c.device_uuid == uuid)).first()
            if row is None:
                return None
            conn.execute(update(out_of_service).where(out_of_service.c.id == row.id)
                         .values(returned_at=utcnow(), returned_by=by))
        log.warning("device %s is back in service (%s)", uuid, by)
        return OutOfService(row.device_uuid, row.user_name, row.server_name, row.profile_slug,
                            json.loads(row.cgroup), row.detail, row.since)

    def devices_of(self, user: str, server: str) -> list[str]:
        with reading(self.engine) as conn:
            return list(conn.execute(
                select(assignments.c.device_uuid)
                .where(_open, assignments.c.user_name == user, assignments.c.server_name == server)
                .order_by(assignments.c.id)
            ).scalars())

    def reconcile(
        self, inventory: Inventory, running: Callable[[str, str], bool]
    ) -> ReconcileReport:
        """Match open assignments with the inventory and the servers still running.

        `running(user, server)` is asked outside any transaction (it may be
        slow); each release then applies only if the row is still open.
        """
        with reading(self.engine) as conn:
            rows = list(conn.execute(select(assignments).where(_open).order_by(assignments.c.id)))
        present = inventory.device_uuids()
        alive: dict[tuple[str, str], bool] = {}
        report = ReconcileReport()
        to_release: list[tuple[int, str]] = []
        for row in rows:
            key = (row.user_name, row.server_name)
            if key not in alive:
                alive[key] = running(*key)
            entry = (row.device_uuid, _holder(row))
            gone = row.device_uuid not in present
            if gone:
                report.gone.append(entry)
            if alive[key]:
                report.kept.append(entry)
            else:
                report.released.append(entry)
                to_release.append((row.id, "device_gone" if gone else "server_died"))
        if to_release:
            now = utcnow()
            with self.engine.begin() as conn:
                for row_id, reason in to_release:
                    conn.execute(update(assignments)
                                 .where(_open, assignments.c.id == row_id)
                                 .values(released_at=now, release_reason=reason))
        for uuid, holder in report.gone:
            log.warning("device %s held by %s/%s is no longer in the inventory (%s)",
                        uuid, holder.user, holder.server, inventory.label)
        return report

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        """The latest assignments, open and closed, newest first."""
        with reading(self.engine) as conn:
            rows = conn.execute(select(assignments).order_by(assignments.c.id.desc()).limit(limit))
            return [
                {"device_uuid": r.device_uuid, "node": r.node, "user": r.user_name,
                 "server": r.server_name, "profile": r.profile_slug, "claimed_at": r.claimed_at,
                 "released_at": r.released_at, "release_reason": r.release_reason}
                for r in rows
            ]
