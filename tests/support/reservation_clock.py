"""Time passing for a reservation, in the hub's database: its start moved to the hour under
way, its end to seconds from now.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import update

from gpulease.store.db import open_database, reservations, sqlite_url


def end_soon(hub, reservation_id: int, seconds: float) -> None:
    """Time passing: the reservation's end moved to `seconds` from now."""
    engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    end = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=seconds)
    with engine.begin() as conn:
        conn.execute(update(reservations).where(reservations.c.id == reservation_id)
                     .values(ends_at=end))
    engine.dispose()


def begin_now(hub, reservation_id: int) -> None:
    """Time passing: the reservation's start moved to the hour under way."""
    engine = open_database(sqlite_url(hub.state / "private" / "gpulease.sqlite"))
    hour = dt.datetime.now(dt.UTC).replace(tzinfo=None, minute=0, second=0, microsecond=0)
    with engine.begin() as conn:
        conn.execute(update(reservations).where(reservations.c.id == reservation_id)
                     .values(starts_at=hour))
    engine.dispose()
