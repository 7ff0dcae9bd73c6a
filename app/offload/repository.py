"""SQL for chunks (the episodic store, C3) and offload events: written by the offload, searched
by recall, tombstoned and erased by forget. Every query of the `chunks` table lives here."""

import hashlib
import json
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import psycopg
from sqlalchemy import func, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.core.text import lexical_document
from app.embeddings.base import vector_literal
from app.store.models import Chunk, OffloadEvent

INSERT_BATCH = 5000  # rows per insert statement

# The chunk columns an offload writes, as `jsonb_to_recordset` reads them from one JSON array (the
# tenant and session are the statement's parameters, the same for every row).
_CHUNK_RECORD = (
    "id uuid, turn_first bigint, turn_last bigint, part int, parts int, overlap_tokens int, "
    "overlap_chars int, "
    "roles text[], ts_first timestamptz, ts_last timestamptz, raw_text text, summary_hint text, "
    "token_count int, term_counts jsonb, term_total int, lexical_source text, trusted boolean"
)
_CHUNK_COLUMNS = [c.split()[0] for c in _CHUNK_RECORD.split(", ")]
_INSERT_CHUNKS = text(
    "INSERT INTO chunks (tenant_id, session_id, "
    + ", ".join("lexical" if c == "lexical_source" else c for c in _CHUNK_COLUMNS)
    + ") SELECT CAST(:tenant AS uuid), CAST(:session AS uuid), "
    + ", ".join(
        "to_tsvector('simple', r.lexical_source)" if c == "lexical_source" else f"r.{c}"
        for c in _CHUNK_COLUMNS
    )
    + f" FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r({_CHUNK_RECORD})"
)


# --- write: offload, embeddings ------------------------------------------------------------------


async def insert_chunks(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, rows: Sequence[dict[str, Any]]
) -> None:
    """Insert chunks of one session (rows with the keys of `_CHUNK_RECORD`, ids and times as
    strings); each row's `lexical_source` becomes its `tsvector` ('simple' parser).
    `INSERT_BATCH` rows per statement, sent as one JSON document: no per-row round trip nor
    per-row parameter handling in the driver."""
    for start in range(0, len(rows), INSERT_BATCH):
        document = json.dumps(
            list(rows[start : start + INSERT_BATCH]), ensure_ascii=False, separators=(",", ":")
        )
        await db.execute(
            _INSERT_CHUNKS, {"tenant": tenant_id, "session": session_pk, "rows": document}
        )


def active_chunk_count(session_pk: Any) -> Any:
    """A scalar subquery counting the active chunks of `session_pk` (a column of an outer
    query): the truth that `sessions.chunk_count` mirrors."""
    return (
        select(func.count())
        .where(Chunk.session_id == session_pk, Chunk.status == "active")
        .scalar_subquery()
    )


async def add_offload_event(db: AsyncSession, **values: Any) -> None:
    db.add(OffloadEvent(**values))
    await db.flush()


def _lacks_vector_of(model: str) -> Any:
    return Chunk.embedding.is_(None) | Chunk.embedding_model.is_distinct_from(model)


async def chunks_to_embed(
    db: AsyncSession, chunk_ids: Sequence[uuid.UUID] | None, model: str, limit: int
) -> list[Chunk]:
    """Active chunks lacking an embedding of `model` (all of them when `chunk_ids` is None)."""
    query = (
        select(Chunk)
        .where(Chunk.status == "active", _lacks_vector_of(model))
        .order_by(Chunk.created_at)
        .limit(limit)
    )
    if chunk_ids is not None:
        query = query.where(Chunk.id.in_(list(chunk_ids)))
    return list((await db.execute(query)).scalars().all())


async def count_chunks_to_embed(db: AsyncSession, model: str) -> int:
    query = select(func.count()).where(Chunk.status == "active", _lacks_vector_of(model))
    return int((await db.execute(query)).scalar_one())


async def store_embedding(
    db: AsyncSession, chunk_id: uuid.UUID, embedding: list[float], model: str
) -> None:
    await db.execute(
        update(Chunk)
        .where(Chunk.id == chunk_id, Chunk.status == "active")
        .values(embedding=embedding, embedding_model=model)
    )


async def count_embed_failure(db: AsyncSession, chunk_ids: Sequence[uuid.UUID]) -> None:
    await db.execute(
        update(Chunk)
        .where(Chunk.id.in_(list(chunk_ids)))
        .values(embed_attempts=Chunk.embed_attempts + 1)
    )


# --- read: the chunk endpoints -------------------------------------------------------------------


async def list_chunks(
    db: AsyncSession, session_pk: uuid.UUID, after: tuple[int, int], limit: int
) -> list[Chunk]:
    query = (
        select(Chunk)
        .where(
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            tuple_(Chunk.turn_first, Chunk.part) > after,
        )
        .order_by(Chunk.turn_first, Chunk.part)
        .limit(limit)
    )
    return list((await db.execute(query)).scalars().all())


async def get_chunk(db: AsyncSession, session_pk: uuid.UUID, chunk_id: uuid.UUID) -> Chunk | None:
    """An active chunk of the session."""
    query = select(Chunk).where(
        Chunk.id == chunk_id, Chunk.session_id == session_pk, Chunk.status == "active"
    )
    return (await db.execute(query)).scalar_one_or_none()


async def turn_pieces(db: AsyncSession, session_pk: uuid.UUID, seq: int) -> list[Chunk]:
    """The active pieces of the session's turn `seq` when it was split, in order."""
    query = (
        select(Chunk)
        .where(
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            Chunk.turn_first == seq,
            Chunk.turn_last == seq,
            Chunk.parts > 1,
        )
        .order_by(Chunk.part)
    )
    return list((await db.execute(query)).scalars().all())


async def chunk_spans(
    db: AsyncSession, session_pk: uuid.UUID, chunk_ids: Collection[uuid.UUID]
) -> dict[str, tuple[int, int]]:
    """The first and last turn of each of the session's chunks among `chunk_ids` (any status)."""
    if not chunk_ids:
        return {}
    query = select(Chunk.id, Chunk.turn_first, Chunk.turn_last).where(
        Chunk.session_id == session_pk, Chunk.id.in_(list(chunk_ids))
    )
    return {str(i): (int(first), int(last)) for i, first, last in await db.execute(query)}


async def active_chunk_ids(db: AsyncSession, session_pk: uuid.UUID) -> list[uuid.UUID]:
    query = select(Chunk.id).where(Chunk.session_id == session_pk, Chunk.status == "active")
    return list((await db.execute(query)).scalars().all())


# --- recall: the lexical, exact and vector arms --------------------------------------------------


async def term_stats(
    db: AsyncSession, session_pk: uuid.UUID, chunk_ids: Sequence[str] | None = None
) -> list[tuple[str, dict[str, int]]]:
    """(chunk id, term counts) of the session's active chunks (of those of `chunk_ids` only when
    given): the BM25 arm's statistics."""
    query = select(Chunk.id, Chunk.term_counts).where(
        Chunk.session_id == session_pk, Chunk.status == "active"
    )
    if chunk_ids is not None:
        query = query.where(Chunk.id.in_([uuid.UUID(c) for c in chunk_ids]))
    return [(str(cid), counts) for cid, counts in await db.execute(query)]


def _like_pattern(needle: str) -> str:
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _exact_statement(session_pk: uuid.UUID, needles: int, by_terms: bool) -> str:
    """The exact arm's statement for `needles` needles in one session, narrowed by the lexical
    index when `by_terms`. The patterns escape with a backslash, LIKE's default (an ESCAPE clause
    on a parameter is applied to it on every row).

    The session is a literal, so that the plan kept for the statement (`app.core.db`'s
    `READER_PLANS`; one text per session and count, prepared per connection) is chosen for that
    session's size: with the session as a parameter, the planner took every session for an
    average one and intersected the lexical index's matches with a bitmap of all the session's
    rows, 4-5 ms for a session of 10^5 chunks whatever the needle (0.02 ms from the lexical
    index alone); a small session still gets that intersection, cheap for it and what keeps a
    needle of common words from being checked in every session's chunks."""
    verbatim = " OR ".join(f"raw_text ILIKE %(n{i})s" for i in range(needles))
    narrowed = ""
    if by_terms:
        any_needle = " || ".join(f"plainto_tsquery('simple', %(t{i})s)" for i in range(needles))
        narrowed = f" AND lexical @@ ({any_needle})"
    return (
        f"SELECT id FROM chunks WHERE session_id = '{uuid.UUID(str(session_pk))}'::uuid "
        f"AND status = 'active' AND ({verbatim}){narrowed} ORDER BY turn_last DESC "
        "LIMIT %(limit)s"
    )  # run by the driver itself (`read_once`): psycopg's placeholders


async def exact_hits(
    conn: psycopg.AsyncConnection[Any], session_pk: uuid.UUID, needles: Sequence[str], limit: int
) -> list[str]:
    """Chunks holding any of the IDs / quoted strings verbatim (case-insensitive), newest first.

    A chunk that holds a needle holds all of the needle's terms, so the lexical index narrows the
    chunks to check first (the match itself stays the verbatim ILIKE): the cost follows the
    chunks that share the needle's terms, not the session's size. A needle without terms (only
    stopwords or punctuation) can only be found by checking every chunk of the session.
    """
    if not needles:
        return []
    docs = [lexical_document(n) for n in needles]
    by_terms = all(docs)
    params: dict[str, Any] = {"limit": limit}
    params |= {f"n{i}": _like_pattern(n) for i, n in enumerate(needles)}
    if by_terms:
        params |= {f"t{i}": doc for i, doc in enumerate(docs)}
    cursor = await conn.execute(_exact_statement(session_pk, len(needles), by_terms), params)
    return [str(cid) for (cid,) in await cursor.fetchall()]


@dataclass(frozen=True)
class VectorIndexScan:
    """Search a session through its own HNSW index (`ensure_vector_index`) when it has one: the
    embedder's dimension (the index is on the vectors cast to it) and the candidate list size."""

    dim: int
    ef_search: int


VECTOR_INDEX_PREFIX = "ix_chunks_hnsw_"


def vector_index_name(session_pk: uuid.UUID, model: str) -> str:
    """The HNSW index of one session's vectors of `model` (within Postgres's 63 characters)."""
    digest = hashlib.sha256(model.encode()).hexdigest()[:8]
    return f"{VECTOR_INDEX_PREFIX}{session_pk.hex}_{digest}"


def _session_vectors(session_pk: uuid.UUID, model: str) -> str:
    """The rows of one session's index, as literals: the planner uses a partial index only for a
    query whose condition it can prove implies the index's, so both spell it the same."""
    quoted_model = model.replace("'", "''")
    return (
        f"session_id = '{session_pk}'::uuid AND status = 'active' "
        f"AND embedding_model = '{quoted_model}'"
    )


async def _has_vector_index(db: AsyncSession | AsyncConnection, name: str) -> bool:
    found = await db.execute(
        text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
        {"name": name},
    )
    return bool(found.scalar_one_or_none())


async def sessions_needing_vector_index(
    db: AsyncSession | AsyncConnection, model: str, min_chunks: int
) -> list[uuid.UUID]:
    """Sessions with at least `min_chunks` active chunks and no valid HNSW index of `model` yet,
    largest first."""
    rows = await db.execute(
        text("SELECT id FROM sessions WHERE chunk_count >= :min_chunks ORDER BY chunk_count DESC"),
        {"min_chunks": min_chunks},
    )
    return [
        sid
        for sid in rows.scalars()
        if not await _has_vector_index(db, vector_index_name(sid, model))
    ]


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


class ShownChunk(NamedTuple):
    """A chunk as recall shows it."""

    id: str
    status: str
    turn_first: int
    turn_last: int
    part: int
    parts: int
    ts_last: datetime
    raw_text: str
    trusted: bool
    token_count: int  # count_tokens(raw_text)

    @classmethod
    def of(cls, chunk: Chunk) -> "ShownChunk":
        """A stored chunk as recall shows it."""
        return cls(
            str(chunk.id),
            chunk.status,
            chunk.turn_first,
            chunk.turn_last,
            chunk.part,
            chunk.parts,
            chunk.ts_last,
            chunk.raw_text,
            chunk.trusted,
            chunk.token_count,
        )


_SHOWN = (
    "c.id, c.status, c.turn_first, c.turn_last, c.part, c.parts, c.ts_last, c.raw_text, c.trusted, "
    "c.token_count"
)
# The exact scan of one session's vectors, ranked by distance: the head of both statements below,
# so that they return the nearest in the same order. It compares the vectors as stored, without
# a cast to the model's dimension (a cast copies every vector); one model's vectors all have that
# dimension.
_RANKED_NEAREST = (
    "WITH near AS (SELECT id, embedding <=> CAST(%(vector)s AS vector) AS distance FROM chunks "
    "WHERE session_id = %(session)s AND status = 'active' AND embedding_model = %(model)s "
    "ORDER BY distance LIMIT %(limit)s), "
    "ranked AS (SELECT id, distance, row_number() OVER (ORDER BY distance) AS place FROM near) "
)
# The scan and what recall shows of those chunks and of the other arms' candidates (`ids`), in
# one statement: the vector arm and the candidates' rows in one round trip. The nearest come
# first, in distance order, with their distance; the others after them with none.
_NEAREST_AND_SHOWN = (
    _RANKED_NEAREST
    + f"SELECT {_SHOWN}, r.distance FROM chunks c LEFT JOIN ranked r ON r.id = c.id "
    "WHERE c.id = ANY(ARRAY(SELECT id FROM ranked) || CAST(%(ids)s AS uuid[])) "
    "ORDER BY r.place NULLS LAST"
)  # run by the driver itself (`read_once`): psycopg's placeholders
_SHOWN_BY_ID = f"SELECT {_SHOWN}, NULL FROM chunks c WHERE c.id = ANY(CAST(%(ids)s AS uuid[]))"
# The scan's ids and distances only: for a caller holding the rows already.
_NEAREST = _RANKED_NEAREST + "SELECT id, distance FROM ranked ORDER BY place"


@dataclass(frozen=True)
class RecallRows:
    """The vector arm's result (cosine similarity by chunk id, best first; empty when no vector
    was given) and what recall shows of those chunks and of the requested ones."""

    nearest: dict[str, float]
    shown: dict[str, ShownChunk]


async def nearest_and_shown(
    conn: psycopg.AsyncConnection[Any],
    session_pk: uuid.UUID,
    model: str,
    vector: Sequence[float] | None,
    limit: int,
    ids: Sequence[str],
    known: Collection[str] = frozenset(),
) -> RecallRows:
    """The exact scan of the session's vectors (none without `vector`) and the shown rows of its
    chunks and of `ids` (any status: the caller keeps the active ones), in one statement.
    `known`: chunks whose rows the caller holds. With any, the scan returns ids and distances
    only, and the rows of its chunks not `known` (with those of `ids`) come from a second
    statement when there are some: the ~30 rows' texts were ~40 % of the statement's time."""
    if vector is None:
        return RecallRows({}, await _shown_by_id(conn, ids))
    params = {
        "vector": vector_literal(vector),
        "session": session_pk,
        "model": model,
        "limit": limit,
    }
    if known:
        cursor = await conn.execute(_NEAREST, params)
        nearest = {str(cid): 1.0 - float(distance) for cid, distance in await cursor.fetchall()}
        wanted = [cid for cid in nearest if cid not in known]
        return RecallRows(nearest, await _shown_by_id(conn, [*wanted, *ids]))
    cursor = await conn.execute(_NEAREST_AND_SHOWN, {**params, "ids": list(ids)})
    nearest = {}
    shown: dict[str, ShownChunk] = {}
    for *columns, distance in await cursor.fetchall():
        chunk = ShownChunk(str(columns[0]), *columns[1:])
        shown[chunk.id] = chunk
        if distance is not None:
            nearest[chunk.id] = 1.0 - float(distance)
    return RecallRows(nearest, shown)


async def _shown_by_id(
    conn: psycopg.AsyncConnection[Any], ids: Sequence[str]
) -> dict[str, ShownChunk]:
    if not ids:
        return {}
    cursor = await conn.execute(_SHOWN_BY_ID, {"ids": list(ids)})
    return {str(row[0]): ShownChunk(str(row[0]), *row[1:-1]) for row in await cursor.fetchall()}


async def nearest_through_index(
    conn: psycopg.AsyncConnection[Any],
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
        f"WITH near AS (SELECT id, CAST(embedding AS vector({dim})) "
        f"<=> CAST(%(vector)s AS vector({dim})) AS distance FROM chunks "
        # (a `%` of the model's name doubled: the driver's placeholders start with one)
        f"WHERE {_session_vectors(session_pk, model).replace('%', '%%')} "
        # The limit written out, as the session is: under the reader pool's generic plans a
        # `LIMIT $n` counts as a tenth of the session, and the join then read every chunk
        # (36.6 ms at 10^5 chunks, against 2.4 ms through the primary key).
        f"ORDER BY distance LIMIT {int(limit)}) "
        f"SELECT {_SHOWN}, near.distance FROM near JOIN chunks c ON c.id = near.id"
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


# pgvector's binary form of a vector (`vector_send`): dimension and a reserved field (int16
# each), then the components as big-endian float32.
_VECTOR_HEADER_BYTES = 4
_VECTORS_BY_ID = (
    "SELECT id, vector_send(embedding) FROM chunks WHERE session_id = %(session)s "
    "AND id = ANY(CAST(%(ids)s AS uuid[])) AND embedding_model = %(model)s "
    "AND embedding IS NOT NULL"
)


async def chunk_vectors(
    conn: psycopg.AsyncConnection[Any], session_pk: uuid.UUID, model: str, ids: Sequence[str]
) -> dict[str, np.ndarray]:
    """The vectors of `model` of the session's chunks `ids` that have one, as float32 arrays.
    Read in binary: ~1.5 KB a 384-d vector, where the text form is ~3x larger and slow to
    parse."""
    if not ids:
        return {}
    cursor = await conn.execute(
        _VECTORS_BY_ID, {"session": session_pk, "model": model, "ids": list(ids)}, binary=True
    )
    return {
        str(cid): np.frombuffer(data, dtype=">f4", offset=_VECTOR_HEADER_BYTES).astype(np.float32)
        for cid, data in await cursor.fetchall()
    }


# --- forget and erase ----------------------------------------------------------------------------


async def chunks_overlapping(
    db: AsyncSession, session_pk: uuid.UUID, first: int, last: int
) -> list[Chunk]:
    query = (
        select(Chunk)
        .where(
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            Chunk.turn_first <= last,
            Chunk.turn_last >= first,
        )
        .order_by(Chunk.turn_first, Chunk.part)
    )
    return list((await db.execute(query)).scalars())


async def tombstone_chunks(db: AsyncSession, chunk_ids: Sequence[uuid.UUID]) -> None:
    if chunk_ids:
        await db.execute(update(Chunk).where(Chunk.id.in_(chunk_ids)).values(status="tombstoned"))


async def tombstone_session_chunks(db: AsyncSession, session_pk: uuid.UUID) -> None:
    await db.execute(
        update(Chunk)
        .where(Chunk.session_id == session_pk, Chunk.status == "active")
        .values(status="tombstoned")
    )


async def erase_chunks(db: AsyncSession, session_pk: uuid.UUID) -> tuple[int, int, list[str]]:
    """Tombstoned chunks lose text, terms, tsvector and embedding; (chunks, embeddings, texts)."""
    rows = await db.execute(
        select(Chunk.raw_text, Chunk.embedding.is_not(None)).where(
            Chunk.session_id == session_pk, Chunk.status == "tombstoned"
        )
    )
    found = list(rows)
    result = await db.execute(
        update(Chunk)
        .where(Chunk.session_id == session_pk, Chunk.status == "tombstoned")
        .values(
            raw_text="",
            summary_hint="",
            term_counts={},
            term_total=0,
            lexical=func.to_tsvector("simple", ""),
            embedding=None,
            embedding_model=None,
            status="erased",
        )
    )
    embeddings = sum(1 for _, had in found if had)
    return int(result.rowcount or 0), embeddings, [t for t, _ in found if t]  # type: ignore[attr-defined]


async def session_chunk_texts(
    db: AsyncSession, session_pk: uuid.UUID
) -> tuple[int, int, list[str]]:
    """(chunks, chunks with an embedding, their texts) of a session about to be deleted,
    whatever their status."""
    found = list(
        await db.execute(
            select(Chunk.raw_text, Chunk.embedding.is_not(None)).where(
                Chunk.session_id == session_pk
            )
        )
    )
    return len(found), sum(1 for _, had in found if had), [t for t, _ in found if t]


async def offload_events(db: AsyncSession, session_pk: uuid.UUID, limit: int) -> list[OffloadEvent]:
    """The session's newest offload events, oldest first."""
    newest = (
        select(OffloadEvent)
        .where(OffloadEvent.session_id == session_pk)
        .order_by(OffloadEvent.created_at.desc(), OffloadEvent.id.desc())
        .limit(limit)
        .subquery()
    )
    query = (
        select(OffloadEvent)
        .join(newest, OffloadEvent.id == newest.c.id)
        .order_by(OffloadEvent.created_at, OffloadEvent.id)
    )
    return list((await db.execute(query)).scalars().all())
