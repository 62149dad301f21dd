"""The clock: naive UTC, as every DateTime column of gpulease's database stores it.

Time is UTC everywhere in gpulease; a naive datetime here always means UTC.
"""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    """Naive UTC now, as stored in every DateTime column."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)
