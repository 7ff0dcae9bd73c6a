"""The characters of a piece's overlap copy, so a split turn's pieces join back exactly.

A piece of a split turn starts with a copy of the end of the previous piece; `overlap_tokens`
counts it in tokens, which does not say where it ends. With its length in characters the
pieces give the turn's text back byte for byte (`GET /v1/sessions/{id}/turns/{seq}/text`).
Pieces written before hold NULL (their overlap is not known), but those with no overlap.

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chunks", sa.Column("overlap_chars", sa.Integer(), nullable=True))
    op.execute("UPDATE chunks SET overlap_chars = 0 WHERE overlap_tokens = 0")


def downgrade() -> None:
    op.drop_column("chunks", "overlap_chars")
