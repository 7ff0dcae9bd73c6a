"""sessions.chunks_version: bumped whenever the session's set of active chunks changes

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Keys the per-process BM25 indexes: a forget that re-chunks without changing the chunk count
    # (or the offloaded seq) still moves it.
    op.add_column(
        "sessions", sa.Column("chunks_version", sa.BigInteger(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    op.drop_column("sessions", "chunks_version")
