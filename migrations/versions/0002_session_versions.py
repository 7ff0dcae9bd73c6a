"""session version counters; notes staleness derived from seqs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 12:25:04.731229
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sessions", sa.Column("notes_version", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column(
        "sessions",
        sa.Column("offloaded_until_seq", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.add_column("sessions", sa.Column("version", sa.BigInteger(), server_default="0", nullable=False))
    # Staleness is now `sessions.offloaded_until_seq > scratchpads.covers_until_seq`.
    op.drop_column("scratchpads", "stale")


def downgrade() -> None:
    op.add_column(
        "scratchpads", sa.Column("stale", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    op.drop_column("sessions", "version")
    op.drop_column("sessions", "offloaded_until_seq")
    op.drop_column("sessions", "notes_version")
