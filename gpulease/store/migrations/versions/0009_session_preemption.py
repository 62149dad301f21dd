"""A spot session being preempted: until when it runs, and why (kept across restarts).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("preempted_until", sa.DateTime, nullable=True))
        batch.add_column(sa.Column("preempt_why", sa.String(500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("preempt_why")
        batch.drop_column("preempted_until")
