"""Notices (warnings before a suspend, what happened) and per-user notification prefs.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("deadline", sa.DateTime, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("cleared_at", sa.DateTime, nullable=True),
    )
    op.create_index(
        "uq_notices_open", "notices", ["user_name", "server_name", "kind"], unique=True,
        sqlite_where=sa.text("cleared_at IS NULL"), postgresql_where=sa.text("cleared_at IS NULL"),
    )
    op.create_table(
        "notification_prefs",
        sa.Column("user_name", sa.String(255), primary_key=True),
        sa.Column("channel", sa.String(16), nullable=False),
        sa.Column("address", sa.String(320), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("notification_prefs")
    op.drop_index("uq_notices_open", "notices")
    op.drop_table("notices")
