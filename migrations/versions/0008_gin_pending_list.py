"""A short pending list for the chunks' full-text index: searches stop reading a long unsorted tail.

With GIN's fast update, new chunks' entries wait in a pending list (4 MB by default) until a
vacuum merges them, and every search through the index reads the whole list: measured, a search
for an ID held by no chunk read 449 pages and took 62 ms right after a bulk offload, and 0.2 ms
once vacuumed. With the list capped at 64 kB, the insert that fills it merges it, and a search
reads at most 8 pending pages. Recall's exact-hits arm searches this index on every build.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER INDEX ix_chunks_lexical SET (gin_pending_list_limit = 64)")


def downgrade() -> None:
    op.execute("ALTER INDEX ix_chunks_lexical RESET (gin_pending_list_limit)")
