"""Per-session HNSW indexes on `chunks` (pgvector): which sessions need one, building and
dropping them, and the nearest chunks read through one."""

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.embeddings.base import vector_literal
from app.store.chunks import SHOWN_COLUMNS, RecallRows, ShownChunk


@dataclass(frozen=True)
class VectorIndexScan:
    """Search a session through its own HNSW index (`ensure_vector_index`) when it has one: the
    embedder's dimension (the index is on the vectors cast to it) and the candidate list size."""

    dim: int
    ef_search: int


VECTOR_INDEX_PREFIX = "ix_chunks_hnsw_"


def _model_digest(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()[:8]


def vector_index_name(session_pk: uuid.UUID, model: str) -> str:
    """The HNSW index of one session's vectors of `model` (within Postgres's 63 characters)."""
    return f"{VECTOR_INDEX_PREFIX}{session_pk.hex}_{_model_digest(model)}"


def _session_vectors(session_pk: uuid.UUID, model: str) -> str:
    """The rows of one session's index, as literals: the planner uses a partial index only for a
    query whose condition it can prove implies the index's, so both spell it the same."""
    quoted_model = model.replace("'", "''")
    return (
        f"session_id = '{session_pk}'::uuid AND status = 'active' "
        f"AND embedding_model = '{quoted_model}'"
    )


async def sessions_needing_vector_index(
    db: AsyncSession | AsyncConnection, model: str, min_chunks: int
) -> list[uuid.UUID]:
    """Sessions with at least `min_chunks` active chunks and no valid HNSW index of `model` yet,
    largest first. One statement through `ix_sessions_chunk_count`, the index's name spelled as
    `vector_index_name` spells it: the sweep's cost grows with the large sessions, not with all."""
    rows = await db.execute(
        text(
            "SELECT s.id FROM sessions s WHERE s.chunk_count >= :min_chunks AND NOT EXISTS ("
            "SELECT 1 FROM pg_index i WHERE i.indisvalid AND i.indexrelid = to_regclass("
            ":prefix || replace(s.id::text, '-', '') || '_' || :digest)) "
            "ORDER BY s.chunk_count DESC"
        ),
        {"min_chunks": min_chunks, "prefix": VECTOR_INDEX_PREFIX, "digest": _model_digest(model)},
    )
    return list(rows.scalars())


# The advisory lock of vector index builds: one at a time in the database, so a build never
# mistakes another one in progress (not yet valid) for an interrupted one.
VECTOR_INDEX_BUILD_LOCK = 0x636F6E7465787464


async def ensure_vector_index(
    conn: AsyncConnection, session_pk: uuid.UUID, model: str, dim: int, work_mem_mb: int
) -> bool:
    """Build the HNSW index of one session's vectors of `model` unless it exists; True when it
    was built, False when it existed or another build is running (in any process). `conn` must
    be in autocommit: the index is built CONCURRENTLY (writes to the session go on meanwhile) and
    without the statement timeout (it can take minutes); an index left invalid by an interrupted
    build (its connection lost, so no longer holding the lock) is dropped first."""
    name = vector_index_name(session_pk, model)
    locked = await conn.execute(
        text("SELECT pg_try_advisory_lock(:key)"), {"key": VECTOR_INDEX_BUILD_LOCK}
    )
    if not locked.scalar_one():
        return False
    try:
        valid = (
            await conn.execute(
                text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
                {"name": name},
            )
        ).scalar_one_or_none()
        if valid:
            return False
        await conn.execute(text("SET statement_timeout = 0"))
        await conn.execute(text(f"SET maintenance_work_mem = '{int(work_mem_mb)}MB'"))
        try:
            if valid is not None:
                await conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            await conn.execute(
                text(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON chunks USING hnsw "
                    f"((CAST(embedding AS vector({int(dim)}))) vector_cosine_ops) "
                    f"WHERE {_session_vectors(session_pk, model)}"
                )
            )
        finally:
            await conn.execute(text("RESET statement_timeout"))
            await conn.execute(text("RESET maintenance_work_mem"))
        return True
    finally:
        await conn.execute(
            text("SELECT pg_advisory_unlock(:key)"), {"key": VECTOR_INDEX_BUILD_LOCK}
        )


async def drop_stale_vector_indexes(conn: AsyncConnection, model: str) -> list[str]:
    """Drop the session HNSW indexes of deleted sessions and of models other than `model`
    (`conn` in autocommit); their names."""
    names = list(
        (
            await conn.execute(
                text(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'chunks' "
                    "AND starts_with(indexname, :prefix)"
                ),
                {"prefix": VECTOR_INDEX_PREFIX},
            )
        ).scalars()
    )
    owners = {name: uuid.UUID(name[len(VECTOR_INDEX_PREFIX) :][:32]) for name in names}
    alive = set(
        (
            await conn.execute(
                text("SELECT id FROM sessions WHERE id = ANY(:ids)"), {"ids": list(owners.values())}
            )
        ).scalars()
    )
    stale = [
        name
        for name, session_pk in owners.items()
        if session_pk not in alive or name != vector_index_name(session_pk, model)
    ]
    for name in stale:
        await conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
    return stale


async def nearest_through_index(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    model: str,
    vector: Sequence[float],
    limit: int,
    index: VectorIndexScan,
) -> RecallRows:
    """The session's chunks closest to `vector` (cosine similarity, best first) and their shown
    rows, through the session's own HNSW index (`ensure_vector_index`): cost about constant in
    the session's size, approximate. Until the worker's sweep has built it the same statement is
    an exact scan of the session's rows (each vector cast, ~1.5 KB copied a row): correct, slower
    for that while. The rows come with the search: in a session this large few of them are among
    those a process keeps.

    No index over the whole table: the server's pgvector (0.6) has no iterative index scans, so
    a scan of a shared index filtered to one session returns at most `ef_search` rows before the
    filter, too few for a session that is a small part of the table. Sorting is off for the
    statement: the planner's other way, the session index and a sort, is the exact scan, which it
    takes when the statistics predate the session's growth. The settings are local to a
    transaction, sent with it in one round trip (pipelined: BEGIN, the settings, the search,
    COMMIT); through SQLAlchemy the same search took 9 statements, ~5 ms around a 7 ms search."""
    dim = int(index.dim)
    query = (
        f"WITH near AS (SELECT id, tenant_id, CAST(embedding AS vector({dim})) "
        f"<=> CAST(%(vector)s AS vector({dim})) AS distance FROM chunks "
        # (a `%` of the model's name doubled: the driver's placeholders start with one)
        # The tenant besides the index's own condition (which it implies): the read names it.
        f"WHERE tenant_id = '{uuid.UUID(str(tenant_id))}'::uuid "
        f"AND {_session_vectors(session_pk, model).replace('%', '%%')} "
        # The limit written out, as the session is: under the reader pool's generic plans a
        # `LIMIT $n` counts as a tenth of the session, and the join then read every chunk
        # (36.6 ms at 10^5 chunks, against 2.4 ms through the primary key).
        f"ORDER BY distance LIMIT {int(limit)}) "
        f"SELECT {SHOWN_COLUMNS}, near.distance FROM near "
        "JOIN chunks c ON c.id = near.id AND c.tenant_id = near.tenant_id"
    )
    async with conn.pipeline(), conn.transaction():
        await conn.execute(
            "SELECT set_config('hnsw.ef_search', %(ef)s, true), "
            "set_config('enable_sort', 'off', true)",
            {"ef": str(max(index.ef_search, limit))},
        )
        cursor = await conn.execute(query, {"vector": vector_literal(vector)})
    found = sorted(await cursor.fetchall(), key=lambda row: float(row[-1]))
    shown = {str(row[0]): ShownChunk(str(row[0]), *row[1:-1]) for row in found}
    return RecallRows({str(row[0]): 1.0 - float(row[-1]) for row in found}, shown)
