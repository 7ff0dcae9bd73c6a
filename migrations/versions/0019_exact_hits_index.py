"""The exact-hits arm's index: the chunks' terms with their session as one more lexeme.

Recall's exact arm looks for a needle's terms in one session's chunks. With the terms' GIN index
and the session's B-tree the planner chose by the statistics: when `ANALYZE`'s sample left a
large session out of `chunks.session_id`'s most-common values it read every chunk of the session
through the B-tree (20-35 ms for 1,000 chunks at 10^6 sessions), and when it did not, it
intersected the session with the terms' index, which for a term common across the table reads
the term's whole posting list (767 ms for a term in every one of 5 x 10^6 chunks). This index
holds each chunk's terms and the lexeme "session <its session id>"; one GIN search for that
lexeme and the needle's terms intersects the two inside the index, so its cost follows the
session's chunks that hold the needle's terms. It replaces the terms' index, which nothing else
searches. The same short pending list as that index had (migration 0008).

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_chunks_session_lexical ON chunks USING gin "
        "((lexical || array_to_tsvector(ARRAY['session ' || session_id::text]))) "
        "WITH (gin_pending_list_limit = 64)"
    )
    op.drop_index("ix_chunks_lexical", table_name="chunks")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX ix_chunks_lexical ON chunks USING gin (lexical) "
        "WITH (gin_pending_list_limit = 64)"
    )
    op.drop_index("ix_chunks_session_lexical", table_name="chunks")
