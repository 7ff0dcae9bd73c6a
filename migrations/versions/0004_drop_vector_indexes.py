"""Drop the per-model HNSW indexes on chunks: recall scans a session's own rows exactly.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Created at start-up by earlier versions (one per embedding model), never by a migration.
    op.execute(
        r"""
        DO $$
        DECLARE found record;
        BEGIN
            FOR found IN
                SELECT indexname FROM pg_indexes
                WHERE tablename = 'chunks' AND indexname LIKE 'ix\_chunks\_embedding\_%'
            LOOP
                EXECUTE format('DROP INDEX IF EXISTS %I', found.indexname);
            END LOOP;
        END $$;
        """
    )


def downgrade() -> None:
    pass  # the indexes were never part of the schema
