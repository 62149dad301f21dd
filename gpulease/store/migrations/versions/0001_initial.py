"""Initial schema: profiles, settings, device assignments, local accounts, user prefs.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("slug", sa.String(63), primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "assignments",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_uuid", sa.String(128), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile_slug", sa.String(63), nullable=False),
        sa.Column("claimed_at", sa.DateTime, nullable=False),
        sa.Column("released_at", sa.DateTime, nullable=True),
        sa.Column("release_reason", sa.String(64), nullable=True),
    )
    op.create_index(
        "uq_assignments_open_device",
        "assignments",
        ["device_uuid"],
        unique=True,
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_index("ix_assignments_holder", "assignments", ["user_name", "server_name"])
    op.create_table(
        "local_accounts",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("password_hash", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "user_prefs",
        sa.Column("user_name", sa.String(255), primary_key=True),
        sa.Column("default_profile", sa.String(63), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("user_prefs")
    op.drop_table("local_accounts")
    op.drop_index("ix_assignments_holder", "assignments")
    op.drop_index("uq_assignments_open_device", "assignments")
    op.drop_table("assignments")
    op.drop_table("settings")
    op.drop_table("profiles")
