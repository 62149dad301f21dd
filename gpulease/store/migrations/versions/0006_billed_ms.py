"""Metering to the millisecond: sessions keep the milliseconds they were billed.

Revision ID: 0006
Revises: 0005

A session closed before this revision was charged for its interval rounded
up to the whole second. Its `billed_ms` is that: the whole seconds times
1000, so that its cost recomputed by the new rule, ceil(billed_ms × rate /
3,600,000), is the charge it was given, to the micro-credit. Open sessions
(servers carried across the upgrade) are left as they are: they are billed by
the millisecond when they close. The ledger is not touched.

The seconds are computed in SQL, exactly, by the rule the charge used
(ceil of the microsecond interval): PostgreSQL's EXTRACT(EPOCH ...) is an
exact numeric; SQLite's stored text 'YYYY-MM-DD HH:MM:SS.ffffff' becomes
integer microseconds, never through julianday's float.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_WHOLE_SECONDS = {
    "postgresql": "GREATEST(0, CAST(CEIL(EXTRACT(EPOCH FROM (ended_at - started_at))) AS BIGINT))",
    "sqlite": (
        "MAX(0, ((CAST(strftime('%s', ended_at) AS INTEGER) * 1000000"
        " + CAST(substr(ended_at, 21, 6) AS INTEGER))"
        " - (CAST(strftime('%s', started_at) AS INTEGER) * 1000000"
        " + CAST(substr(started_at, 21, 6) AS INTEGER)) + 999999) / 1000000)"
    ),
}


def upgrade() -> None:
    op.add_column("sessions", sa.Column("billed_ms", sa.BigInteger, nullable=True))
    seconds = _WHOLE_SECONDS[op.get_bind().dialect.name]
    op.execute(f"UPDATE sessions SET billed_ms = {seconds} * 1000 WHERE ended_at IS NOT NULL")


def downgrade() -> None:
    # Below 0006 a session's billed length is its interval rounded up to the
    # second: one billed by the millisecond would come back from a later
    # upgrade billed whole seconds, disagreeing with its charge. Refused, not lost.
    by_ms = op.get_bind().execute(sa.text(
        "SELECT COUNT(*) FROM sessions WHERE billed_ms % 1000 <> 0")).scalar()
    if by_ms:
        raise RuntimeError(
            f"Cannot downgrade below revision 0006: {by_ms} session(s) were billed by the "
            "millisecond, and without billed_ms their billed length would no longer match "
            "their charges. Restore the database from a backup made before the upgrade.")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("billed_ms")
