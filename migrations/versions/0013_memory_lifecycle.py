"""Remembered items get provenance, a versioned lifecycle and validity.

Each item says where its text came from (`source`: the `remember` call, the API, a user or
assistant turn, a tool result and which tool, a notes rule, an inference, retrieved text), the
turns it was read in and who wrote it; its status runs candidate, quarantined, verified, active,
superseded, tombstoned, erased, and every change is a row of `memory_versions`; `valid_from` /
`valid_until` and a TTL (`expires_at`) say when it holds. Items written before keep their status
and trust (they were all the `remember` call's, by an agent) and get their first version.

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("memories", sa.Column("source_tool", sa.String(128), nullable=True))
    op.add_column(
        "memories",
        sa.Column(
            "turn_seqs",
            postgresql.ARRAY(sa.BigInteger()),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )
    op.add_column(
        "memories", sa.Column("actor", sa.String(16), server_default="agent", nullable=False)
    )
    op.add_column(
        "memories", sa.Column("actor_key_id", postgresql.UUID(as_uuid=True), nullable=True)
    )
    op.add_column(
        "memories", sa.Column("revision", sa.Integer(), server_default="1", nullable=False)
    )
    for column in ("valid_from", "valid_until", "expires_at"):
        op.add_column("memories", sa.Column(column, _TZ, nullable=True))
    op.execute("UPDATE memories SET source = 'remember' WHERE source = 'memory'")
    op.create_table(
        "memory_versions",
        sa.Column(
            "tenant_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "memory_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("revision", sa.Integer(), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=True),
        sa.Column("trusted", sa.Boolean(), nullable=False),
        sa.Column("actor", sa.String(16), nullable=False),
        sa.Column("actor_key_id", postgresql.UUID(as_uuid=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("valid_from", _TZ, nullable=True),
        sa.Column("valid_until", _TZ, nullable=True),
        sa.Column("expires_at", _TZ, nullable=True),
        sa.Column("redacted_at", _TZ, nullable=True),
        sa.Column("created_at", _TZ, server_default=sa.func.now(), nullable=False),
    )
    # Every item, erased ones included, gets the version it has been since it was written.
    op.execute(
        """
        INSERT INTO memory_versions (tenant_id, memory_id, revision, status, text, content_hash,
                                     trusted, actor, reason, created_at)
        SELECT tenant_id, id, 1, status, NULLIF(text, ''),
               CASE WHEN text = '' THEN NULL
                    ELSE encode(sha256(convert_to(text, 'UTF8')), 'hex') END,
               trusted, 'agent', 'written before versions were kept', created_at
        FROM memories
        """
    )


def downgrade() -> None:
    op.drop_table("memory_versions")
    op.execute("UPDATE memories SET source = 'memory' WHERE source = 'remember'")
    for column in (
        "expires_at",
        "valid_until",
        "valid_from",
        "revision",
        "actor_key_id",
        "actor",
        "turn_seqs",
        "source_tool",
    ):
        op.drop_column("memories", column)
