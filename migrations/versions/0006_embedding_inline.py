"""chunks.embedding kept in the row (storage MAIN) instead of out of line (pgvector's EXTERNAL).

A chunk row (text, tsvector, a 384-d vector) passes Postgres's 2 kB TOAST threshold, and with
EXTERNAL storage the vector is the column moved out of line, so the exact scan of a session's
vectors fetched each one through the TOAST index. MAIN keeps it in the row while the text and the
tsvector move out instead. It applies to rows written from now on (re-embedding rewrites old ones).

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE MAIN")


def downgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE EXTERNAL")
