"""Reservations: the table, and the reservation a claim, a session or a ledger row is for.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("account", sa.String(255), nullable=False),
        sa.Column("profile_slug", sa.String(63), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("mig_profile", sa.String(32), nullable=True),
        sa.Column("per_unit", sa.Integer, nullable=False),
        sa.Column("units", sa.Integer, nullable=False),
        sa.Column("starts_at", sa.DateTime, nullable=False),
        sa.Column("ends_at", sa.DateTime, nullable=False),
        sa.Column("rate_per_hour_ucr", sa.BigInteger, nullable=False),
        sa.Column("cost_ucr", sa.BigInteger, nullable=False),
        sa.Column("on_end", sa.String(16), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("cancelled_at", sa.DateTime, nullable=True),
        sa.Column("cancelled_by", sa.String(255), nullable=True),
        sa.Column("end_noticed_at", sa.DateTime, nullable=True),
    )
    op.create_index("ix_reservations_period", "reservations", ["starts_at", "ends_at"])
    with op.batch_alter_table("assignments") as batch:
        batch.add_column(sa.Column("tier", sa.String(16), nullable=False,
                                   server_default="on-demand"))
        batch.add_column(sa.Column("reservation_id", sa.Integer, nullable=True))
    with op.batch_alter_table("ledger_entries") as batch:
        batch.add_column(sa.Column("reservation_id", sa.Integer, nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("reservation_id", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("reservation_id")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("reservation_id")
    with op.batch_alter_table("assignments") as batch:
        batch.drop_column("reservation_id")
        batch.drop_column("tier")
    op.drop_index("ix_reservations_period", "reservations")
    op.drop_table("reservations")
