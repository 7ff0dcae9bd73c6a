"""The relational model of spec §2. Every row carries `tenant_id`, so the store can shard by it:
every table but the global ones (`GLOBAL_TABLES`) has the tenant in its primary key, its unique
constraints and its foreign keys to other tenant-scoped tables, as their last column (a lookup by a
row's own id still reads the key's index by its prefix). The ORM identifies a row by that whole
key, so the statements it writes itself (a refresh, a flush of a changed row) name the tenant too.
tests/store/test_tenant_keys.py checks the migrated schema and the store's joins against this,
tests/store/test_tenant_filters.py that the store's statements name the tenant."""

import uuid
from datetime import datetime
from typing import Any, ClassVar, NamedTuple

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy import (
    text as sql_text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The tables not distributed by tenant, each with the reason (on Citus: reference tables, a copy
# on every node, for the first two; the coordinator's own tables for the others). Every other
# table of the database is tenant-scoped; a new table is one or the other, never unlisted.
GLOBAL_TABLES: dict[str, str] = {
    "tenants": "the tenants themselves: tenant-scoped rows point at them",
    "api_keys": "read by the key's hash to learn the tenant, before any tenant is known",
    "alembic_version": "the schema's revision",
    "procrastinate_jobs": "the job queue (procrastinate's): workers take every tenant's jobs",
    "procrastinate_events": "the job queue's history of each job",
    "procrastinate_periodic_defers": "the job queue's record of periodic tasks deferred",
    "procrastinate_workers": "the job queue's live workers and their heartbeats",
}


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSONB,
        list[str]: ARRAY(String),
    }


def _uuid_pk() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)


def _created_at() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def _tenant_fk() -> Mapped[uuid.UUID]:
    return mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)


def _tenant_key() -> Mapped[uuid.UUID]:
    """`tenant_id` as the last column of the primary key."""
    return mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)


def _of_session() -> ForeignKeyConstraint:
    """The row's session, in the same tenant (a key between tenant-scoped tables has the tenant)."""
    return ForeignKeyConstraint(
        ["session_id", "tenant_id"], ["sessions.id", "sessions.tenant_id"], ondelete="CASCADE"
    )


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(128), unique=True)
    settings: Mapped[dict[str, Any]] = mapped_column(server_default=sql_text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _created_at()


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_fk()
    key_prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(server_default=sql_text("'{}'"))
    created_at: Mapped[datetime] = _created_at()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SessionKey(NamedTuple):
    """A session row's primary key: what a statement or a job names a session by (with the
    tenant, so that on a database distributed by tenant it runs on the tenant's node)."""

    tenant_id: uuid.UUID
    id: uuid.UUID


class Session(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "external_id"),
        Index("ix_sessions_created", "tenant_id", "created_at", "id"),
        Index("ix_sessions_user", "tenant_id", "user_id", "created_at", "id"),
        # The sweep's: sessions written to lately, and those large enough for a vector index
        # (migration 0014), so idle sessions do not add to its cost.
        Index("ix_sessions_updated", "updated_at"),
        Index("ix_sessions_chunk_count", "chunk_count"),
    )
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    external_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str | None] = mapped_column(String(128))
    config: Mapped[dict[str, Any]] = mapped_column(server_default=sql_text("'{}'::jsonb"))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", server_default=sql_text("'{}'::jsonb")
    )
    last_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Token counters of the layers, kept current on every write so no request re-tokenises history.
    c0_tokens: Mapped[int | None] = mapped_column(Integer)
    c1_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    c1_turns: Mapped[int] = mapped_column(Integer, server_default="0")
    c2_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    # Mirrors scratchpads.version, so readers find the cached notes under a versioned key without
    # an extra query and can never be served an older version than the one committed.
    notes_version: Mapped[int] = mapped_column(Integer, server_default="0")
    # Highest offloaded seq: notes are stale while they cover less than this.
    offloaded_until_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Bumped by every update of the row (under its row lock): orders cached copies of the session.
    version: Mapped[int] = mapped_column(BigInteger, server_default="0")
    turn_count: Mapped[int] = mapped_column(Integer, server_default="0")
    chunk_count: Mapped[int] = mapped_column(Integer, server_default="0")
    # Bumped whenever the set of active chunks changes (offload, forget, delete): keys the
    # per-process BM25 indexes, which a count alone cannot (a re-chunk may keep the count).
    chunks_version: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Hysteresis: an offload disarms the trigger until the ratio drops below θ again.
    offload_armed: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    last_offload_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )

    @property
    def key(self) -> SessionKey:
        return SessionKey(self.tenant_id, self.id)


class Turn(Base):
    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("session_id", "seq", "tenant_id"),
        Index(
            "ix_turns_window", "session_id", "seq", postgresql_where=sql_text("chunk_id IS NULL")
        ),
        _of_session(),
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    seq: Mapped[int] = mapped_column(BigInteger)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(String(128))
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    tool_call_id: Mapped[str | None] = mapped_column(String(128))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", server_default=sql_text("'{}'::jsonb")
    )
    token_count: Mapped[int] = mapped_column(Integer)
    trusted: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    created_at: Mapped[datetime] = _created_at()
    chunk_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True), index=True)
    forgotten_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Its source was marked untrusted (migration 0016): nothing is derived from it any more.
    quarantined_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_created", "created_at"), _of_session())
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created_at()


# A chunk's terms (`lexical`) with one lexeme more, "session <its session id>", as the exact-hits
# arm searches them (migration 0019): a search for that lexeme and a needle's terms is one GIN
# search whose cost follows the smaller of the session's chunks and the needle's, never the
# table. The lexeme holds a space, which no lexeme of `to_tsvector` holds, so no chunk's text
# can produce another session's.
CHUNK_TERMS_AND_SESSION = "(lexical || array_to_tsvector(ARRAY['session ' || session_id::text]))"


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (
        Index("ix_chunks_session_range", "session_id", "turn_first"),
        # The sweep's backlog of chunks with no vector yet (migration 0014): a few rows, however
        # many chunks the table holds.
        Index(
            "ix_chunks_unembedded",
            "created_at",
            postgresql_where=sql_text("embedding IS NULL AND status = 'active'"),
        ),
        # The exact-hits arm's index (migration 0019): the chunk's terms and its session as one
        # more lexeme (`CHUNK_TERMS_AND_SESSION`).
        Index(
            "ix_chunks_session_lexical",
            sql_text(CHUNK_TERMS_AND_SESSION),
            postgresql_using="gin",
            postgresql_with={"gin_pending_list_limit": 64},  # migration 0008
        ),
        _of_session(),
    )
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    turn_first: Mapped[int] = mapped_column(BigInteger)
    turn_last: Mapped[int] = mapped_column(BigInteger)
    part: Mapped[int] = mapped_column(Integer, server_default="0")
    parts: Mapped[int] = mapped_column(Integer, server_default="1")
    overlap_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    # Characters of that copy (migration 0012; NULL on pieces written before, if they had one).
    overlap_chars: Mapped[int | None] = mapped_column(Integer)
    roles: Mapped[list[str]] = mapped_column(server_default=sql_text("'{}'"))
    ts_first: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ts_last: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    raw_text: Mapped[str] = mapped_column(Text)
    summary_hint: Mapped[str] = mapped_column(String(200), server_default="")
    token_count: Mapped[int] = mapped_column(Integer)
    # Term counts of the normalised text (CJK bigrams included): the BM25 arm's statistics.
    term_counts: Mapped[dict[str, Any]] = mapped_column(server_default=sql_text("'{}'::jsonb"))
    term_total: Mapped[int] = mapped_column(Integer, server_default="0")
    lexical: Mapped[Any] = mapped_column(TSVECTOR)
    embedding: Mapped[Any | None] = mapped_column(Vector())
    embedding_model: Mapped[str | None] = mapped_column(String(64))
    embed_attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    trusted: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    # The roles of its untrusted turns, which its label names (migration 0020): "tool" for tool
    # output, a conversation role for a turn whose source was marked untrusted.
    untrusted_roles: Mapped[list[str]] = mapped_column(server_default=sql_text("'{}'"))
    status: Mapped[str] = mapped_column(String(16), server_default="active")
    created_at: Mapped[datetime] = _created_at()


class Scratchpad(Base):
    __tablename__ = "scratchpads"
    __table_args__ = (_of_session(),)
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    version: Mapped[int] = mapped_column(Integer, server_default="0")
    covers_until_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    notes: Mapped[dict[str, Any]] = mapped_column(server_default=sql_text("'{}'::jsonb"))
    token_count: Mapped[int] = mapped_column(Integer, server_default="0")
    generator: Mapped[str] = mapped_column(String(32), server_default="rules")
    rebuild_pending: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("false"))
    dropped_items: Mapped[int] = mapped_column(Integer, server_default="0")
    dropped: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, server_default=sql_text("'[]'::jsonb")
    )
    stale_writes: Mapped[int] = mapped_column(Integer, server_default="0")
    updated_at: Mapped[datetime] = _created_at()


# The lifecycle of a remembered item. Only items in force (injected, and within their validity
# and TTL) reach the prompt as facts; unconfirmed ones answer only an explicit recall; held ones
# are what a forget or an erase still has to take.
MEMORY_INJECTED = ("verified", "active")
MEMORY_UNCONFIRMED = ("candidate", "quarantined")
MEMORY_LIVE = (*MEMORY_UNCONFIRMED, *MEMORY_INJECTED)
MEMORY_HELD = (*MEMORY_LIVE, "superseded")
MEMORY_STATUSES = (*MEMORY_HELD, "tombstoned", "erased")


class Memory(Base):
    __tablename__ = "memories"
    __table_args__ = (
        Index("ix_memories_scope", "tenant_id", "scope", "user_id", "session_id"),
        _of_session(),
    )
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    session_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    user_id: Mapped[str | None] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    key: Mapped[str | None] = mapped_column(String(128))
    text: Mapped[str] = mapped_column(Text)
    tags: Mapped[list[str]] = mapped_column(server_default=sql_text("'{}'"))
    # Provenance: where the text came from (`app.memories.policy.SOURCES`), the tool whose
    # result it was, the turns it was read in, and who wrote it (an actor and its API key).
    source: Mapped[str] = mapped_column(String(16))
    source_tool: Mapped[str | None] = mapped_column(String(128))
    turn_seqs: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), server_default=sql_text("'{}'"))
    actor: Mapped[str] = mapped_column(String(16), server_default="agent")
    actor_key_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    trusted: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    # The lifecycle (`app.memories.policy`): candidate, quarantined, verified, active,
    # superseded, tombstoned, erased; every change is a `MemoryVersion` numbered by `revision`.
    status: Mapped[str] = mapped_column(String(16), server_default="active")
    revision: Mapped[int] = mapped_column(Integer, server_default="1")
    # The value's version along its `key` (a new value is a new item that `supersedes` the last).
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    supersedes: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # When the item holds (NULL: open-ended) and when it leaves the prompt (a TTL, NULL: never).
    valid_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    valid_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The user's memory in tiers (`app.memories.tiers`): a user-scope item is a `candidate`
    # until its `evidence` (each time it was said, written down or confirmed: kind, session,
    # turns, when) promotes it `long_term`, with the `stability` that evidence earns and which
    # evidence it was (`stable_by`); NULL for session-scope items.
    tier: Mapped[str | None] = mapped_column(String(16))
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONB, server_default=sql_text("'[]'::jsonb")
    )
    stability: Mapped[float | None] = mapped_column(Float)
    stable_by: Mapped[list[str]] = mapped_column(ARRAY(String(16)), server_default=sql_text("'{}'"))
    lexical: Mapped[Any] = mapped_column(TSVECTOR)
    # Embedded by the worker with the deployment's embedder, like chunks (recall's vector arm).
    embedding: Mapped[Any | None] = mapped_column(Vector())
    embedding_model: Mapped[str | None] = mapped_column(String(64))
    embed_attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _created_at()


class MemoryVersion(Base):
    """One immutable state of a remembered item, written at each change of it: who changed it,
    when, why, and the item as it then was. Redaction drops `text` and keeps the rest."""

    __tablename__ = "memory_versions"
    __table_args__ = (
        ForeignKeyConstraint(
            ["memory_id", "tenant_id"], ["memories.id", "memories.tenant_id"], ondelete="CASCADE"
        ),
    )
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    text: Mapped[str | None] = mapped_column(Text)
    content_hash: Mapped[str | None] = mapped_column(String(64))  # sha256 of the text, hex
    trusted: Mapped[bool] = mapped_column(Boolean)
    actor: Mapped[str] = mapped_column(String(16))
    actor_key_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    reason: Mapped[str] = mapped_column(Text)
    valid_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    valid_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    redacted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created_at()


class OffloadEvent(Base):
    __tablename__ = "offload_events"
    __table_args__ = (_of_session(),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    trigger: Mapped[str] = mapped_column(String(16))
    trigger_ratio: Mapped[float] = mapped_column(Float)
    ratio_after: Mapped[float] = mapped_column(Float)
    tokens_freed: Mapped[int] = mapped_column(Integer)
    chunks_offloaded: Mapped[int] = mapped_column(Integer)
    turn_first: Mapped[int] = mapped_column(BigInteger)
    turn_last: Mapped[int] = mapped_column(BigInteger)
    turns: Mapped[int] = mapped_column(Integer)
    duration_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = _created_at()


class PromptBuild(Base):
    __tablename__ = "prompt_builds"
    __table_args__ = (
        Index("ix_prompt_builds_session", "session_id", "created_at", "id"),
        _of_session(),
    )
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    session_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    record: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _created_at()


class EraseReceipt(Base):
    __tablename__ = "erase_receipts"
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = _tenant_key()
    # No foreign key: a receipt outlives the session it reports on.
    session_external_id: Mapped[str] = mapped_column(String(128))
    target: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default="pending")
    stores: Mapped[dict[str, Any]] = mapped_column(server_default=sql_text("'{}'::jsonb"))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    requested_at: Mapped[datetime] = _created_at()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
