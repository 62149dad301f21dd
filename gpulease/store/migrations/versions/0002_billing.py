"""Billing: append-only ledger, sessions, group caps, meter lease.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_ucr", sa.BigInteger, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=True),
        sa.Column("session_id", sa.Integer, nullable=True, unique=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_ledger_account_time", "ledger_entries", ["account", "created_at"])
    op.create_table(
        "sessions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("profile_slug", sa.String(63), nullable=False),
        sa.Column("account", sa.String(255), nullable=False),
        sa.Column("rate_per_hour_ucr", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("last_confirmed_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("requested_end_reason", sa.String(32), nullable=True),
    )
    op.create_index(
        "uq_sessions_open_server", "sessions", ["user_name", "server_name"], unique=True,
        sqlite_where=sa.text("ended_at IS NULL"), postgresql_where=sa.text("ended_at IS NULL"),
    )
    op.create_index("ix_sessions_user_started", "sessions", ["user_name", "started_at"])
    op.create_index("ix_sessions_account_started", "sessions", ["account", "started_at"])
    op.create_index("ix_sessions_started", "sessions", ["started_at"])
    op.create_table(
        "account_caps",
        sa.Column("account", sa.String(255), primary_key=True),
        sa.Column("user_name", sa.String(255), primary_key=True),
        sa.Column("monthly_ucr", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "meter_lease",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("meter_lease")
    op.drop_table("account_caps")
    op.drop_index("ix_sessions_started", "sessions")
    op.drop_index("ix_sessions_account_started", "sessions")
    op.drop_index("ix_sessions_user_started", "sessions")
    op.drop_index("uq_sessions_open_server", "sessions")
    op.drop_table("sessions")
    op.drop_index("ix_ledger_account_time", "ledger_entries")
    op.drop_table("ledger_entries")
