"""An index for a session's stored builds, newest first, by (created_at, id).

Storing a build trims the session's builds to the newest `manifests_kept_per_session`, the
inspector reads the newest ones, and deleting a session cascades to them: without it each is a
scan of every stored build (`contextd dev` stores every build's manifest).

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_prompt_builds_session", "prompt_builds", ["session_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_prompt_builds_session", table_name="prompt_builds")
