"""scratchpads.dropped: the items the notes token cap left out (section, turn, source, tokens)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Read by every build-prompt manifest, which lists each dropped notes item (no text).
    op.add_column(
        "scratchpads",
        sa.Column("dropped", JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("scratchpads", "dropped")
