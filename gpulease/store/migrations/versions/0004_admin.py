"""Audit log of admin changes, per-user/per-group GPU limits, the spawn queue.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("before", sa.Text, nullable=True),
        sa.Column("after", sa.Text, nullable=True),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_table(
        "limits",
        sa.Column("subject", sa.String(255), primary_key=True),
        sa.Column("max_gpus", sa.Integer, nullable=True),
        sa.Column("max_slices", sa.Integer, nullable=True),
    )
    op.create_table(
        "spawn_queue",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile", sa.String(63), nullable=False),
        sa.Column("enqueued_at", sa.DateTime, nullable=False),
    )
    op.create_index(
        "uq_spawn_queue_server", "spawn_queue", ["user_name", "server_name"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_spawn_queue_server", "spawn_queue")
    op.drop_table("spawn_queue")
    op.drop_table("limits")
    op.drop_index("ix_audit_log_at", "audit_log")
    op.drop_table("audit_log")
