"""What each session's GPU did: readings counted, mean and peak activity, peak memory.

The idle culler's readings (PUT api/gpu-readings) are folded into the open session
as they come (gpulease/store/gpu_stats.py); a closed session keeps what it had, so
the usage page shows what each session used.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Earlier sessions had no readings: 0 samples, the rest NULL ("no reading").
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("gpu_activity_samples", sa.Integer, nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("gpu_activity_sum", sa.Float, nullable=True))
        batch.add_column(sa.Column("gpu_activity_peak", sa.Float, nullable=True))
        batch.add_column(sa.Column("gpu_memory_peak_bytes", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("gpu_reading_source", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("gpu_reading_source")
        batch.drop_column("gpu_memory_peak_bytes")
        batch.drop_column("gpu_activity_peak")
        batch.drop_column("gpu_activity_sum")
        batch.drop_column("gpu_activity_samples")
