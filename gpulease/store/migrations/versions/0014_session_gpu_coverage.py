"""How much of each session the GPU readings covered, and which run of its server it bills.

A session's peak memory from one reading of a ten-hour session says little: the
right-sizing rule (gpulease/core/policy/right_sizing.py) judges a session only where
its readings covered enough of it. Each reading folded into an open session adds the
interval its pusher reads at (gpulease/store/gpu_stats.py).

`run_started_at`: the hub's start of the server's run the session bills (JupyterHub's
`started`), kept when a run continues in a new session (a reservation's end, a
repair), so that a GPU reading, which names the run it was read for, is folded into
that run's session and never into a later run's.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Earlier sessions: 0 ms covered, so the rule does not judge them (their readings'
    # coverage cannot be shown).
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("gpu_activity_read_ms", sa.BigInteger, nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("gpu_memory_read_ms", sa.BigInteger, nullable=False,
                                   server_default="0"))
        # NULL for earlier sessions: not known (readings fall back on the ends of sessions)
        batch.add_column(sa.Column("run_started_at", sa.DateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("run_started_at")
        batch.drop_column("gpu_memory_read_ms")
        batch.drop_column("gpu_activity_read_ms")
