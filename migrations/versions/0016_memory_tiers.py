"""The user's memory in tiers: a user-scope item is a candidate until evidence promotes it.

Each item gets `tier` (candidate or long_term for user-scope items, NULL for session-scope ones)
`evidence`, the times it was said, written down or confirmed, and the `stability` it earns
(`stable_by`: which evidence). Items written before keep their status, trust and text; a
user-scope one becomes a candidate seen once (stability 0.25) whose evidence is its own
writing (kind `written`, its session, its turns, its creation time).

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memories", sa.Column("tier", sa.String(16), nullable=True))
    op.add_column(
        "memories",
        sa.Column(
            "evidence",
            postgresql.JSONB(),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
    )
    op.add_column("memories", sa.Column("stability", sa.Float(), nullable=True))
    op.add_column(
        "memories",
        sa.Column(
            "stable_by",
            postgresql.ARRAY(sa.String(16)),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )
    op.execute(
        """
        UPDATE memories SET tier = 'candidate', stability = 0.25, evidence = jsonb_build_array(jsonb_build_object(
            'kind', 'written',
            'session', coalesce(session_id::text, ''),
            'at', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
            'seqs', to_jsonb(turn_seqs)))
        WHERE scope = 'user'
        """
    )


def downgrade() -> None:
    op.drop_column("memories", "stable_by")
    op.drop_column("memories", "stability")
    op.drop_column("memories", "evidence")
    op.drop_column("memories", "tier")
