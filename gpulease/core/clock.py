"""The clock: naive UTC, as every DateTime column of gpulease's database stores it.

Time is UTC everywhere in gpulease; a naive datetime here always means UTC.
"""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    """Naive UTC now, as stored in every DateTime column."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def iso_z(moment: dt.datetime) -> str:
    """ISO 8601 UTC with Z, as the API writes times: "...:05Z" on a whole second,
    "...:05.120Z" on a millisecond (metered times are), microseconds only where a
    time has them (sessions from before metering went to the millisecond)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    micros = moment.microsecond
    spec = "seconds" if not micros else "milliseconds" if not micros % 1000 else "microseconds"
    return moment.isoformat(timespec=spec) + "Z"
