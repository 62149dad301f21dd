"""What the hub, its spawners and the gpulease service share in one process.

The spawners' layer: it assembles the stores (gpulease/store), this host's
inventory (gpulease/host) and the catalog; the hub creates it and sets its
meter, the spawners and the service read it.

One `GPULeaseContext` per (database, inventory, catalog) holds the engine and
the stores built on it, so that every spawner of a hub reuses one connection
pool and one inventory reading instead of opening its own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from functools import cached_property

from sqlalchemy.engine import Engine

from gpulease.core.billing.holds import AdmissionHolds
from gpulease.core.billing.ports import Meter
from gpulease.core.model.catalog import Catalog, load_catalog
from gpulease.core.model.inventory import Inventory
from gpulease.host.gpus import discover_inventory
from gpulease.images import CATALOG_PATH
from gpulease.store.accounts import LocalAccountStore
from gpulease.store.assignments import AssignmentStore
from gpulease.store.audit import AuditLog
from gpulease.store.db import open_database
from gpulease.store.ledger import Ledger
from gpulease.store.limits import LimitStore
from gpulease.store.notices import NoticeStore
from gpulease.store.profiles import ProfileStore
from gpulease.store.queue_store import QueueStore
from gpulease.store.reservations import ReservationStore

log = logging.getLogger("gpulease")


@dataclass(eq=False)
class GPULeaseContext:
    db_url: str
    inventory_file: str = ""
    catalog_file: str = ""
    node_name: str = "local"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Set by the hub process (GPULeaseHub), which makes it (hub/billing/metering.py): the
    # metering of its servers, as gpulease.core.billing.ports declares what spawners use.
    # None where no hub meters (a spawner driven by a test, `gpulease` commands).
    meter: Meter | None = None
    # Credit held by starts in flight in this process (gpulease.core.billing.holds); made
    # with the context, not lazily, so that concurrent first starts share one.
    holds: AdmissionHolds = field(default_factory=AdmissionHolds, repr=False)

    @cached_property
    def engine(self) -> Engine:
        return open_database(self.db_url)

    @cached_property
    def catalog(self) -> Catalog:
        return load_catalog(self.catalog_file or CATALOG_PATH)

    @cached_property
    def inventory(self) -> Inventory:
        return discover_inventory(self.inventory_file or None, self.node_name)

    @cached_property
    def profiles(self) -> ProfileStore:
        return ProfileStore(self.engine, self.catalog)

    @cached_property
    def assignments(self) -> AssignmentStore:
        return AssignmentStore(self.engine)

    @cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.engine)

    @cached_property
    def reservations(self) -> ReservationStore:
        return ReservationStore(self.engine)

    @cached_property
    def notices(self) -> NoticeStore:
        return NoticeStore(self.engine)

    @cached_property
    def accounts(self) -> LocalAccountStore:
        return LocalAccountStore(self.engine)

    @cached_property
    def audit(self) -> AuditLog:
        return AuditLog(self.engine)

    @cached_property
    def queue(self) -> QueueStore:
        return QueueStore(self.engine)

    @cached_property
    def limits(self) -> LimitStore:
        return LimitStore(self.engine)


_contexts: dict[tuple[str, str, str, str], GPULeaseContext] = {}
_contexts_lock = threading.Lock()


def get_context(
    db_url: str, inventory_file: str = "", catalog_file: str = "", node_name: str = "local"
) -> GPULeaseContext:
    key = (db_url, inventory_file, catalog_file, node_name)
    with _contexts_lock:
        if key not in _contexts:
            _contexts[key] = GPULeaseContext(db_url, inventory_file, catalog_file, node_name)
        return _contexts[key]
