"""memories.embedding: remembered items are embedded by the worker and searched like chunks

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import pgvector.sqlalchemy
import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Untyped `vector` like chunks.embedding: an embedder change needs no migration. Items written
    # before this revision get their vectors from the worker's sweep.
    op.add_column("memories", sa.Column("embedding", pgvector.sqlalchemy.vector.VECTOR()))
    op.add_column("memories", sa.Column("embedding_model", sa.String(length=64)))
    op.add_column(
        "memories", sa.Column("embed_attempts", sa.Integer(), server_default="0", nullable=False)
    )


def downgrade() -> None:
    op.drop_column("memories", "embed_attempts")
    op.drop_column("memories", "embedding_model")
    op.drop_column("memories", "embedding")
