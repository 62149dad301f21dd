"""gpulease's own database: tables, engine, migrations.

gpulease keeps its state (profiles, device assignments, local accounts, the
billing ledger and sessions) in its own database, separate from JupyterHub's, so
that it can live on PostgreSQL in the cluster shape (`billing_db_url`) and so
that its schema evolves through its own Alembic migrations.

Times are stored as naive UTC datetimes (both SQLite and PostgreSQL then
compare them the same way); `utcnow()` is the one clock used for them.

Transactions: `engine.begin()` is for work that writes. On SQLite it starts
with BEGIN IMMEDIATE (the write lock up front), so a check-then-insert is
serialised and waits up to busy_timeout behind another writer. A pure read
uses `reading(engine)` instead: a deferred BEGIN, a WAL snapshot that never
waits for a writer; the connection is query-only, so a write slipped into it
fails at once instead of failing to upgrade its lock later. PostgreSQL needs
neither (MVCC readers never wait for writers): there both are plain
transactions. The hub and the service run every database call off their event
loop (asyncio.to_thread), so a writer that waits blocks only its own request.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import Connection, Engine

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# Profiles as admins define them. `spec` is the profile as in the profiles
# file (JSON text, prices as decimal strings) so that export/apply round-trips.
profiles = Table(
    "profiles",
    metadata,
    Column("slug", String(63), primary_key=True),
    Column("spec", Text, nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

# Small key/value facts, e.g. the hash of the profiles file last applied.
settings = Table(
    "settings",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", Text, nullable=False),
)

# Who holds which device. A row is open while `released_at` is NULL; the
# partial unique index makes it impossible for two open rows to name the same
# device, whatever the isolation level of the database.
assignments = Table(
    "assignments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("device_uuid", String(128), nullable=False),
    Column("node", String(253), nullable=False),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False),
    Column("profile_slug", String(63), nullable=False),
    Column("claimed_at", DateTime, nullable=False),
    Column("released_at", DateTime, nullable=True),
    Column("release_reason", String(64), nullable=True),
    # on-demand | spot | reserved: what the claim was for (reservations withhold capacity
    # from on-demand starts: gpulease/core/capacity/reserved_pool.py); reserved: on which
    # reservation.
    Column("tier", String(16), nullable=False, server_default="on-demand"),
    Column("reservation_id", Integer, nullable=True),
)
Index(
    "uq_assignments_open_device",
    assignments.c.device_uuid,
    unique=True,
    sqlite_where=assignments.c.released_at.is_(None),
    postgresql_where=assignments.c.released_at.is_(None),
)
Index("ix_assignments_holder", assignments.c.user_name, assignments.c.server_name)

# Devices kept from placement because their last server's cgroup could not be
# emptied (something of that server may still use them). Open while
# `returned_at` is NULL; it closes when the cgroup empties ('emptied') or an
# admin returns the device ('admin:NAME'). `cgroup` is JSON: kind, unit, dirs.
out_of_service = Table(
    "out_of_service",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("device_uuid", String(128), nullable=False),
    Column("node", String(253), nullable=False),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False),
    Column("profile_slug", String(63), nullable=False),
    Column("cgroup", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("since", DateTime, nullable=False),
    Column("returned_at", DateTime, nullable=True),
    Column("returned_by", String(255), nullable=True),
)
Index(
    "uq_out_of_service_open_device",
    out_of_service.c.device_uuid,
    unique=True,
    sqlite_where=out_of_service.c.returned_at.is_(None),
    postgresql_where=out_of_service.c.returned_at.is_(None),
)

# Local accounts of the embedded shape: argon2id hashes, never a password.
local_accounts = Table(
    "local_accounts",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("password_hash", Text, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

# Per-user preferences: the default profile for empty-body starts.
user_prefs = Table(
    "user_prefs",
    metadata,
    Column("user_name", String(255), primary_key=True),
    Column("default_profile", String(63), nullable=True),
)


# Identities from a sign-in provider (OpenID Connect, GitHub): (issuer, subject)
# is who someone is; `user_name` the hub name given at their first login, kept
# when their e-mail or preferred name changes; no two identities share one.
identities = Table(
    "identities",
    metadata,
    Column("issuer", String(255), primary_key=True),
    Column("subject", String(255), primary_key=True),
    Column("user_name", String(255), nullable=False, unique=True),
    Column("email", String(320), nullable=True),
    Column("preferred_username", String(255), nullable=True),
    Column("created_at", DateTime, nullable=False),
    # the provider last confirmed this identity (a login or a refresh)
    Column("verified_at", DateTime, nullable=False),
)

# --- billing -------------------------------------------------------------------
# The ledger is append-only: grants (+), charges (-) and adjustments (±) in
# integer micro-credits. A balance is a sum of rows, never a stored counter.
ledger_entries = Table(
    "ledger_entries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("account", String(255), nullable=False),  # user:NAME or group:NAME
    # grant | charge | adjustment | reservation (its one charge) | refund (a cancellation's)
    Column("kind", String(16), nullable=False),
    Column("amount_ucr", BigInteger, nullable=False),
    Column("note", Text, nullable=False, default=""),
    Column("actor", String(255), nullable=False),  # who: an admin, or "metering"
    Column("user_name", String(255), nullable=True),  # charges: the member who ran it
    Column("session_id", Integer, nullable=True, unique=True),  # charges: one per session
    Column("created_at", DateTime, nullable=False),
    Column("reservation_id", Integer, nullable=True),  # reservation and refund rows
)
Index("ix_ledger_account_time", ledger_entries.c.account, ledger_entries.c.created_at)

# One row per run of a server: opened when it first answers HTTP, confirmed on
# every heartbeat, closed (with a reason, and its charge) when its devices go.
# Times are on the millisecond; `billed_ms`, written at the close beside the
# charge, is what the charge was for: ended - started, or for sessions closed
# before metering went to the millisecond (migration 0006), the whole seconds
# they were billed, times 1000.
sessions = Table(
    "sessions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False),
    Column("profile_slug", String(63), nullable=False),
    Column("account", String(255), nullable=False),
    Column("rate_per_hour_ucr", BigInteger, nullable=False),  # fixed at start
    Column("started_at", DateTime, nullable=False),
    Column("last_confirmed_at", DateTime, nullable=False),
    Column("ended_at", DateTime, nullable=True),
    Column("end_reason", String(32), nullable=True),
    Column("requested_end_reason", String(32), nullable=True),  # set by api/stop
    Column("billed_ms", BigInteger, nullable=True),  # NULL while open
    # on-demand | spot: the price tier it was started on (its rate is that tier's)
    Column("tier", String(16), nullable=False, server_default="on-demand"),
    # A spot session being preempted: it runs until then, billed up to then at most
    # (kept so that a hub restart keeps the deadline its user was told).
    Column("preempted_until", DateTime, nullable=True),
    Column("preempt_why", String(500), nullable=True),
    # tier reserved: the reservation whose unit it ran on (not billed by the millisecond)
    Column("reservation_id", Integer, nullable=True),
    # What its GPU did, from the idle culler's readings while it was open (0013,
    # gpulease/store/gpu_stats.py): readings with an activity, their sum (mean =
    # sum / samples), the peaks, and the latest source named (nvml, gpm, dcgm).
    Column("gpu_activity_samples", Integer, nullable=False, server_default="0"),
    Column("gpu_activity_sum", Float, nullable=True),
    Column("gpu_activity_peak", Float, nullable=True),
    Column("gpu_memory_peak_bytes", BigInteger, nullable=True),
    Column("gpu_reading_source", String(16), nullable=True),
    # How much of the session those readings covered (0014): each folded reading adds
    # its pusher's interval, so the right-sizing rule judges only well-read sessions.
    Column("gpu_activity_read_ms", BigInteger, nullable=False, server_default="0"),
    Column("gpu_memory_read_ms", BigInteger, nullable=False, server_default="0"),
    # The hub's start of the run it bills (JupyterHub's `started`; 0014), the same across
    # the sessions of one run (a reservation's end, a repair): what a GPU reading names.
    Column("run_started_at", DateTime, nullable=True),
)
Index(
    "uq_sessions_open_server",
    sessions.c.user_name,
    sessions.c.server_name,
    unique=True,
    sqlite_where=sessions.c.ended_at.is_(None),
    postgresql_where=sessions.c.ended_at.is_(None),
)
Index("ix_sessions_user_started", sessions.c.user_name, sessions.c.started_at)
Index("ix_sessions_account_started", sessions.c.account, sessions.c.started_at)
Index("ix_sessions_started", sessions.c.started_at)

# Reservations: `units` of a profile held for an account over [starts_at, ends_at),
# whole UTC hours, paid once when made (a `reservation` ledger row); the kind of
# device is kept so that capacity is counted even if the profile changes later.
# A cancellation sets cancelled_at (and writes a `refund` row); rows are never deleted.
reservations = Table(
    "reservations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("account", String(255), nullable=False),
    Column("profile_slug", String(63), nullable=False),
    Column("model", String(64), nullable=False),
    Column("mig_profile", String(32), nullable=True),
    Column("per_unit", Integer, nullable=False),
    Column("units", Integer, nullable=False),
    Column("starts_at", DateTime, nullable=False),
    Column("ends_at", DateTime, nullable=False),
    Column("rate_per_hour_ucr", BigInteger, nullable=False),
    Column("cost_ucr", BigInteger, nullable=False),
    Column("on_end", String(16), nullable=False),  # continue | suspend
    Column("note", Text, nullable=False, default=""),
    Column("created_at", DateTime, nullable=False),
    Column("created_by", String(255), nullable=False),
    Column("cancelled_at", DateTime, nullable=True),
    Column("cancelled_by", String(255), nullable=True),
    Column("end_noticed_at", DateTime, nullable=True),  # its servers were first told of its end
)
Index("ix_reservations_period", reservations.c.starts_at, reservations.c.ends_at)

# Per-member monthly caps on a group account.
account_caps = Table(
    "account_caps",
    metadata,
    Column("account", String(255), primary_key=True),
    Column("user_name", String(255), primary_key=True),
    Column("monthly_ucr", BigInteger, nullable=False),
)

# Which hub process meters this database: two hubs must never both do it.
meter_lease = Table(
    "meter_lease",
    metadata,
    Column("id", Integer, primary_key=True),  # always 1
    Column("holder", String(255), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("expires_at", DateTime, nullable=False),
)

# --- notices and notifications (idle culler, credit enforcer, queue) ----------
# What a user is told about a server: warnings before a suspend or a stop, and
# what happened. A row is open while `cleared_at` is NULL; at most one open row
# per (user, server, kind), so a repeated warning replaces the last one.
notices = Table(
    "notices",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("deadline", DateTime, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("cleared_at", DateTime, nullable=True),
)
Index(
    "uq_notices_open",
    notices.c.user_name,
    notices.c.server_name,
    notices.c.kind,
    unique=True,
    sqlite_where=notices.c.cleared_at.is_(None),
    postgresql_where=notices.c.cleared_at.is_(None),
)

# How each user wants to be told: 'none', 'email' (address) or 'webhook' (the
# admin's one webhook; address is the name to mention there, empty = user name).
notification_prefs = Table(
    "notification_prefs",
    metadata,
    Column("user_name", String(255), primary_key=True),
    Column("channel", String(16), nullable=False),
    Column("address", String(320), nullable=False, default=""),
)


# --- admin: audit log, limits, spawn queue -----------------------------------
# Every admin change: who, when, what, and the object before and after (JSON
# text; NULL before a creation and after a deletion). Append-only; rows older
# than the retention (`audit_retention`) are pruned.
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime, nullable=False, index=True),
    Column("actor", String(255), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(255), nullable=False),
    Column("before", Text, nullable=True),
    Column("after", Text, nullable=True),
)

# Concurrent GPU limits per `user:NAME` or `group:NAME`; NULL = no limit.
limits = Table(
    "limits",
    metadata,
    Column("subject", String(255), primary_key=True),
    Column("max_gpus", Integer, nullable=True),
    Column("max_slices", Integer, nullable=True),
)

# Spawns waiting for capacity, one row per waiting server; the row goes when
# the spawn is placed, refused, cancelled or gives up.
spawn_queue = Table(
    "spawn_queue",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False),
    Column("profile", String(63), nullable=False),
    Column("enqueued_at", DateTime, nullable=False),
)
Index("uq_spawn_queue_server", spawn_queue.c.user_name, spawn_queue.c.server_name, unique=True)


# Starts that the server's own code failed (it exited before it answered, or did
# not answer within http_timeout), counted to ration repeated ones per user and
# profile (gpulease.store.failed_starts). Rows are only appended; an admin's clear
# stamps `cleared_at` on the ones it forgives, so the history stays.
failed_starts = Table(
    "failed_starts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_name", String(255), nullable=False),
    Column("server_name", String(255), nullable=False),
    Column("profile", String(63), nullable=False),
    Column("at", DateTime, nullable=False),
    Column("why", Text, nullable=False),
    Column("cleared_at", DateTime, nullable=True),
    Column("cleared_by", String(255), nullable=True),
    # the last lines its server wrote, as shown (gpulease.core.server_log.shown_tail)
    Column("log_tail", Text, nullable=True),
)
Index("ix_failed_starts_user_profile_at", failed_starts.c.user_name, failed_starts.c.profile,
      failed_starts.c.at)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the hub, the gpulease service and the CLI read while one writes;
    # busy_timeout makes writers wait for each other instead of failing.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


# The execution option that marks a connection as read-only (set by `reading`).
READ_ONLY = "gpulease_read_only"


def _sqlite_begin(conn: Connection) -> None:
    # The one place that decides how a transaction begins on SQLite. A writer:
    # pysqlite's deferred BEGIN lets two writers both read, then one fails to
    # upgrade its lock; BEGIN IMMEDIATE takes the write lock up front, so a
    # check-then-insert transaction is serialised. A reader: deferred, so it
    # reads a WAL snapshot without queueing behind writers; query_only makes a
    # write in it fail at once (it could not take the write lock safely).
    read_only = bool(conn.get_execution_options().get(READ_ONLY))
    info = conn.connection.info
    if info.get(READ_ONLY, False) != read_only:
        conn.exec_driver_sql(f"PRAGMA query_only={'ON' if read_only else 'OFF'}")
        info[READ_ONLY] = read_only
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A connection for a pure read: on SQLite it takes no write lock and never waits
    for a writer (see the module docstring). Only reads may run in it."""
    with engine.connect() as conn:
        conn.execution_options(**{READ_ONLY: True})
        yield conn


def make_engine(url: str, **kwargs) -> Engine:
    """Create an engine for gpulease's database (SQLite or PostgreSQL)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30, "isolation_level": None},
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    if url.startswith("postgresql"):
        # Fail fast when the server is unreachable instead of hanging a spawn.
        kwargs.setdefault("connect_args", {"connect_timeout": 5})
    return create_engine(url, **kwargs)


MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database schema to the newest Alembic revision (or `revision`)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)


def open_database(url: str) -> Engine:
    """Engine for `url`, migrated to the current schema."""
    engine = make_engine(url)
    upgrade(engine)
    return engine


def sqlite_url(path: str | os.PathLike) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def ping(engine: Engine) -> None:
    with reading(engine) as conn:
        conn.execute(text("SELECT 1"))
