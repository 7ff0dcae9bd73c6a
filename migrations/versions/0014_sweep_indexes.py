"""Indexes for the worker's sweep, so that idle sessions do not add to its cost.

Every minute the sweep looks for sessions written to lately (over their watermark, or with
counters to repair), sessions large enough for their own vector index, and chunks with no vector
yet. Without these indexes each was a scan of every session or of every chunk: a database of a
million idle sessions made the sweep read gigabytes a minute to find a handful of rows.

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_sessions_updated", "sessions", ["updated_at"])
    op.create_index("ix_sessions_chunk_count", "sessions", ["chunk_count"])
    op.create_index(
        "ix_chunks_unembedded",
        "chunks",
        ["created_at"],
        postgresql_where="embedding IS NULL AND status = 'active'",
    )


def downgrade() -> None:
    op.drop_index("ix_chunks_unembedded", table_name="chunks")
    op.drop_index("ix_sessions_chunk_count", table_name="sessions")
    op.drop_index("ix_sessions_updated", table_name="sessions")
