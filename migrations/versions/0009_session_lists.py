"""Indexes for listing a tenant's sessions, and a user's: newest first, by (created_at, id).

`GET /v1/sessions` pages by that keyset, `DELETE /v1/users/{user_id}` and a forgotten user item's
notes update find a user's sessions; without them each is a scan of every session of the tenant.

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_sessions_created", "sessions", ["tenant_id", "created_at", "id"])
    op.create_index("ix_sessions_user", "sessions", ["tenant_id", "user_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_user", table_name="sessions")
    op.drop_index("ix_sessions_created", table_name="sessions")
