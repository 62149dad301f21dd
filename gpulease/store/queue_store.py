"""The admission queue as rows of the `spawn_queue` table (blocking calls).

The hub process decides the queue in memory (gpulease.spawners.queueing.runner);
these rows mirror it so that other processes — the gpulease service, the CLI —
can show who waits, in which order, for which profile. A row exists exactly
while its spawn waits: it is removed when the spawn is placed, refused,
cancelled or gives up. The rows outlive the hub: one killed leaves them, one
stopping (Ctrl-C, SIGTERM) keeps them (`keep_rows`), and the next hub starts
those spawns again in their order (gpulease.hub.servers.queue_resume).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import Engine, and_, delete, func, insert, select

from gpulease.core.clock import utcnow
from gpulease.store.db import reading, spawn_queue


@dataclass(frozen=True)
class QueuedSpawn:
    user: str
    server: str
    profile: str
    position: int  # 1 = next to be served
    enqueued_at: dt.datetime  # naive UTC
    # The row itself: a spawn of the same server queued since has another (remove_row).
    row_id: int | None = field(default=None, compare=False)


class QueueStore:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.kept = False  # the hub is stopping: its waiting spawns stay queued

    def keep_rows(self) -> None:
        """The hub is stopping: from now on a spawn leaving the queue (cancelled as the
        hub ends) keeps its row, for the next hub to start it again."""
        self.kept = True

    @staticmethod
    def _this(user: str, server: str):
        return and_(spawn_queue.c.user_name == user, spawn_queue.c.server_name == server)

    def add(self, user: str, server: str, profile: str) -> int:
        """Record a waiting spawn (replacing a leftover row of that server); its row id."""
        with self.engine.begin() as conn:
            conn.execute(delete(spawn_queue).where(self._this(user, server)))
            return conn.execute(
                insert(spawn_queue).values(user_name=user, server_name=server, profile=profile,
                                           enqueued_at=utcnow())
                .returning(spawn_queue.c.id)
            ).scalar_one()

    def remove(self, user: str, server: str) -> bool:
        """The spawn no longer waits; True when it had a row (never once `kept`)."""
        if self.kept:
            return False
        with self.engine.begin() as conn:
            return conn.execute(delete(spawn_queue).where(self._this(user, server))).rowcount > 0

    def remove_row(self, row: QueuedSpawn) -> bool:
        """Remove this very row (a previous hub's), not a row the same server's spawn has
        since (the user started it again meanwhile); True when it was there."""
        if self.kept or row.row_id is None:
            return False
        with self.engine.begin() as conn:  # SQLite gives a new row a removed row's id
            return conn.execute(delete(spawn_queue).where(
                spawn_queue.c.id == row.row_id,
                spawn_queue.c.enqueued_at == row.enqueued_at)).rowcount > 0

    def clear(self) -> int:
        """Remove every row; how many."""
        with self.engine.begin() as conn:
            return conn.execute(delete(spawn_queue)).rowcount

    def rows(self) -> list[QueuedSpawn]:
        """The whole queue, next to be served first."""
        with reading(self.engine) as conn:
            rows = conn.execute(select(spawn_queue).order_by(spawn_queue.c.id)).all()
        return [QueuedSpawn(r.user_name, r.server_name, r.profile, i, r.enqueued_at, r.id)
                for i, r in enumerate(rows, start=1)]

    def position(self, user: str, server: str) -> int | None:
        """1-based place of a server's spawn in the queue; None when it does not wait."""
        with reading(self.engine) as conn:
            row_id = conn.execute(
                select(spawn_queue.c.id).where(self._this(user, server))
            ).scalar()
            if row_id is None:
                return None
            ahead = conn.execute(
                select(func.count()).select_from(spawn_queue).where(spawn_queue.c.id < row_id)
            ).scalar_one()
        return ahead + 1

    def waiting_by_profile(self) -> dict[str, int]:
        """How many spawns wait, per profile slug (profiles nobody waits for are absent)."""
        with reading(self.engine) as conn:
            rows = conn.execute(
                select(spawn_queue.c.profile, func.count()).group_by(spawn_queue.c.profile)
            ).all()
        return {profile: count for profile, count in rows}
