"""A chunk keeps the roles of its untrusted turns, which its label in a prompt names.

A chunk is untrusted when it holds tool output or a turn whose source was marked untrusted
(`POST /v1/sessions/{id}/sources/untrust`). Recall labelled every untrusted chunk "tool
output", a user turn pasted from an untrusted source too; with the roles the label says what
the text is: "(untrusted: user turn from a source marked untrusted)". Existing untrusted chunks
take the roles of the untrusted turns they cover (a tool turn is stored untrusted, a quarantined
turn too); one whose turns say none (none found) keeps the label it had, tool output.

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "chunks",
        sa.Column(
            "untrusted_roles",
            postgresql.ARRAY(sa.String()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )
    op.execute(
        "UPDATE chunks SET untrusted_roles = coalesce(("
        "SELECT array_agg(DISTINCT t.role ORDER BY t.role) FROM turns t "
        "WHERE t.tenant_id = chunks.tenant_id AND t.session_id = chunks.session_id "
        "AND t.seq BETWEEN chunks.turn_first AND chunks.turn_last AND NOT t.trusted"
        "), ARRAY['tool']) WHERE NOT trusted"
    )


def downgrade() -> None:
    op.drop_column("chunks", "untrusted_roles")
