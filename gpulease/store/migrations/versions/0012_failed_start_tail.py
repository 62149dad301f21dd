"""Failed starts keep the last lines their server wrote, to show its owner why.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: the rows of earlier failed starts have no tail.
    with op.batch_alter_table("failed_starts") as batch:
        batch.add_column(sa.Column("log_tail", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("failed_starts") as batch:
        batch.drop_column("log_tail")
