"""Devices out of service: their last server's cgroup could not be emptied.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "out_of_service",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_uuid", sa.String(128), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile_slug", sa.String(63), nullable=False),
        sa.Column("cgroup", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.Column("returned_at", sa.DateTime, nullable=True),
        sa.Column("returned_by", sa.String(255), nullable=True),
    )
    op.create_index(
        "uq_out_of_service_open_device", "out_of_service", ["device_uuid"], unique=True,
        sqlite_where=sa.text("returned_at IS NULL"),
        postgresql_where=sa.text("returned_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_out_of_service_open_device", "out_of_service")
    op.drop_table("out_of_service")
