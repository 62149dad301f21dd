"""Identities from sign-in providers, mapped to hub user names.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "identities",
        sa.Column("issuer", sa.String(255), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("email", sa.String(320), nullable=True),
        sa.Column("preferred_username", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("verified_at", sa.DateTime, nullable=False),
        sa.PrimaryKeyConstraint("issuer", "subject", name="pk_identities"),
        sa.UniqueConstraint("user_name", name="uq_identities_user_name"),
    )


def downgrade() -> None:
    op.drop_table("identities")
