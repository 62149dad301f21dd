"""Failed starts: the starts a server's own code failed, to ration repeated ones.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "failed_starts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile", sa.String(63), nullable=False),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("why", sa.Text, nullable=False),
        sa.Column("cleared_at", sa.DateTime, nullable=True),
        sa.Column("cleared_by", sa.String(255), nullable=True),
    )
    op.create_index("ix_failed_starts_user_profile_at", "failed_starts",
                    ["user_name", "profile", "at"])


def downgrade() -> None:
    op.drop_index("ix_failed_starts_user_profile_at", "failed_starts")
    op.drop_table("failed_starts")
