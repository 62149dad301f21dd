"""The price tier of each session: on-demand (every session so far) or spot.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("tier", sa.String(16), nullable=False,
                                   server_default="on-demand"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("tier")
