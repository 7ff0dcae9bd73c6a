"""Every key carries the tenant, so the schema can be distributed by tenant (Citus) unchanged.

A distributed table's primary key and unique constraints must include its distribution column,
and a foreign key between two distributed tables must too. Every table but the global ones
(`app.store.models.GLOBAL_TABLES`) already has `tenant_id`; its primary key, its unique
constraints and its foreign keys to sessions and to remembered items now include it, as their
last column: a lookup by a row's own id (a session's turns by `session_id`, a chunk by `id`)
still reads the same index by its prefix. Rows are kept; a row whose tenant differed from its
session's (none is written so) takes its session's, so that the new foreign keys hold.

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Tables whose rows belong to one session (their `session_id`).
_SESSION_ROWS = (
    "turns",
    "chunks",
    "idempotency_keys",
    "scratchpads",
    "memories",
    "offload_events",
    "prompt_builds",
)
# Primary keys re-keyed: table -> its key columns before (the tenant is appended after them).
_PRIMARY_KEYS = {
    "sessions": ["id"],
    "turns": ["id"],
    "chunks": ["id"],
    "scratchpads": ["session_id"],
    "memories": ["id"],
    "offload_events": ["id"],
    "prompt_builds": ["id"],
    "erase_receipts": ["id"],
}


def upgrade() -> None:
    for table in _SESSION_ROWS:
        op.execute(
            f"UPDATE {table} AS r SET tenant_id = s.tenant_id FROM sessions AS s "
            "WHERE r.session_id = s.id AND r.tenant_id <> s.tenant_id"
        )
    op.execute(
        "UPDATE memory_versions AS v SET tenant_id = m.tenant_id FROM memories AS m "
        "WHERE v.memory_id = m.id AND v.tenant_id <> m.tenant_id"
    )
    # The foreign keys go first: they depend on the primary keys re-keyed below.
    for table in _SESSION_ROWS:
        op.drop_constraint(f"{table}_session_id_fkey", table, type_="foreignkey")
    op.drop_constraint("memory_versions_memory_id_fkey", "memory_versions", type_="foreignkey")
    for table, columns in _PRIMARY_KEYS.items():
        op.drop_constraint(f"{table}_pkey", table, type_="primary")
        op.create_primary_key(f"{table}_pkey", table, [*columns, "tenant_id"])
    op.drop_constraint("turns_session_id_seq_key", "turns", type_="unique")
    op.create_unique_constraint(
        "turns_session_id_seq_tenant_id_key", "turns", ["session_id", "seq", "tenant_id"]
    )
    for table in _SESSION_ROWS:
        op.create_foreign_key(
            f"{table}_session_id_tenant_id_fkey",
            table,
            "sessions",
            ["session_id", "tenant_id"],
            ["id", "tenant_id"],
            ondelete="CASCADE",
        )
    op.create_foreign_key(
        "memory_versions_memory_id_tenant_id_fkey",
        "memory_versions",
        "memories",
        ["memory_id", "tenant_id"],
        ["id", "tenant_id"],
        ondelete="CASCADE",
    )


def downgrade() -> None:
    op.drop_constraint(
        "memory_versions_memory_id_tenant_id_fkey", "memory_versions", type_="foreignkey"
    )
    for table in _SESSION_ROWS:
        op.drop_constraint(f"{table}_session_id_tenant_id_fkey", table, type_="foreignkey")
    op.drop_constraint("turns_session_id_seq_tenant_id_key", "turns", type_="unique")
    op.create_unique_constraint("turns_session_id_seq_key", "turns", ["session_id", "seq"])
    for table, columns in _PRIMARY_KEYS.items():
        op.drop_constraint(f"{table}_pkey", table, type_="primary")
        op.create_primary_key(f"{table}_pkey", table, columns)
    op.create_foreign_key(
        "memory_versions_memory_id_fkey",
        "memory_versions",
        "memories",
        ["memory_id"],
        ["id"],
        ondelete="CASCADE",
    )
    for table in _SESSION_ROWS:
        op.create_foreign_key(
            f"{table}_session_id_fkey",
            table,
            "sessions",
            ["session_id"],
            ["id"],
            ondelete="CASCADE",
        )
