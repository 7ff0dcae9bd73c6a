"""SQL for chunks (the episodic store, C3): written by the offload, searched by recall,
tombstoned and erased by forget. Their vectors' backlog and per-session indexes are in
`embedding_backlog` and `vector_index`."""

import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import psycopg
from sqlalchemy import func, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.text import lexical_document
from app.embeddings.base import vector_literal
from app.store.models import CHUNK_TERMS_AND_SESSION, Chunk

INSERT_BATCH = 5000  # rows per insert statement

# The chunk columns an offload writes, as `jsonb_to_recordset` reads them from one JSON array (the
# tenant and session are the statement's parameters, the same for every row).
_CHUNK_RECORD = (
    "id uuid, turn_first bigint, turn_last bigint, part int, parts int, overlap_tokens int, "
    "overlap_chars int, "
    "roles text[], ts_first timestamptz, ts_last timestamptz, raw_text text, summary_hint text, "
    "token_count int, term_counts jsonb, term_total int, lexical_source text, trusted boolean, "
    "untrusted_roles text[]"
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


def active_chunk_count(session_pk: Any, tenant_id: Any) -> Any:
    """A scalar subquery counting the active chunks of `session_pk` in `tenant_id` (columns of an
    outer query): the truth that `sessions.chunk_count` mirrors."""
    return (
        select(func.count())
        .where(
            Chunk.tenant_id == tenant_id, Chunk.session_id == session_pk, Chunk.status == "active"
        )
        .scalar_subquery()
    )


# --- read: the chunk endpoints -------------------------------------------------------------------


async def list_chunks(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    after: tuple[int, int],
    limit: int,
) -> list[Chunk]:
    query = (
        select(Chunk)
        .where(
            Chunk.tenant_id == tenant_id,
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            tuple_(Chunk.turn_first, Chunk.part) > after,
        )
        .order_by(Chunk.turn_first, Chunk.part)
        .limit(limit)
    )
    return list((await db.execute(query)).scalars().all())


async def get_chunk(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, chunk_id: uuid.UUID
) -> Chunk | None:
    """An active chunk of the session."""
    query = select(Chunk).where(
        Chunk.id == chunk_id,
        Chunk.tenant_id == tenant_id,
        Chunk.session_id == session_pk,
        Chunk.status == "active",
    )
    return (await db.execute(query)).scalar_one_or_none()


async def turn_pieces(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, seq: int
) -> list[Chunk]:
    """The active pieces of the session's turn `seq` when it was split, in order."""
    query = (
        select(Chunk)
        .where(
            Chunk.tenant_id == tenant_id,
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            Chunk.turn_first == seq,
            Chunk.turn_last == seq,
            Chunk.parts > 1,
        )
        .order_by(Chunk.part)
    )
    return list((await db.execute(query)).scalars().all())


async def first_pieces(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, seqs: Collection[int]
) -> dict[int, uuid.UUID]:
    """The first active piece of each of the turns `seqs` already stored in pieces (a tool
    result layered on arrival), by seq."""
    if not seqs:
        return {}
    query = select(Chunk.turn_first, Chunk.id).where(
        Chunk.tenant_id == tenant_id,
        Chunk.session_id == session_pk,
        Chunk.status == "active",
        Chunk.turn_first.in_(list(seqs)),
        Chunk.turn_last == Chunk.turn_first,
        Chunk.parts > 1,
        Chunk.part == 1,
    )
    return {int(seq): chunk_id for seq, chunk_id in await db.execute(query)}


async def chunk_spans(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, chunk_ids: Collection[uuid.UUID]
) -> dict[str, tuple[int, int]]:
    """The first and last turn of each of the session's chunks among `chunk_ids` (any status)."""
    if not chunk_ids:
        return {}
    query = select(Chunk.id, Chunk.turn_first, Chunk.turn_last).where(
        Chunk.tenant_id == tenant_id, Chunk.session_id == session_pk, Chunk.id.in_(list(chunk_ids))
    )
    return {str(i): (int(first), int(last)) for i, first, last in await db.execute(query)}


async def active_chunk_ids(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> list[uuid.UUID]:
    query = select(Chunk.id).where(
        Chunk.tenant_id == tenant_id, Chunk.session_id == session_pk, Chunk.status == "active"
    )
    return list((await db.execute(query)).scalars().all())


# --- recall: the lexical, exact and vector arms --------------------------------------------------


async def term_stats(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    chunk_ids: Sequence[str] | None = None,
) -> list[tuple[str, dict[str, int]]]:
    """(chunk id, term counts) of the session's active chunks (of those of `chunk_ids` only when
    given): the BM25 arm's statistics."""
    query = select(Chunk.id, Chunk.term_counts).where(
        Chunk.tenant_id == tenant_id, Chunk.session_id == session_pk, Chunk.status == "active"
    )
    if chunk_ids is not None:
        query = query.where(Chunk.id.in_([uuid.UUID(c) for c in chunk_ids]))
    return [(str(cid), counts) for cid, counts in await db.execute(query)]


def _like_pattern(needle: str) -> str:
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _exact_statement(needles: int, by_terms: bool) -> str:
    """The exact arm's statement for `needles` needles in one session of one tenant, newest first
    (ties in a fixed order). The patterns escape with a backslash, LIKE's default (an ESCAPE
    clause on a parameter is applied to it on every row).

    With terms (`by_terms`), the one index that serves the statement is the chunks' terms with
    their session (`CHUNK_TERMS_AND_SESSION`), searched for the session's lexeme and any
    needle's terms: GIN intersects the two posting lists inside the index, skipping through the
    longer one, so the chunks read are those of the session that hold a needle's terms. The
    session is named only there: a `session_id` condition would let the planner choose the
    session's B-tree instead, and it did whenever `ANALYZE`'s sample left the session out of
    the most-common values (reading and detoasting every chunk of a session of 1,000: 20-35 ms
    at 10^6 sessions); the lexical index beside it cost what the needle's most common term
    costs over the whole table (767 ms for a term in every chunk of 5 x 10^6). The tenant is
    named for the shard (no index leads with it). Without terms, the session's chunks are read
    by its B-tree."""
    verbatim = " OR ".join(f"raw_text ILIKE %(n{i})s" for i in range(needles))
    if by_terms:
        any_needle = " || ".join(f"plainto_tsquery('simple', %(t{i})s)" for i in range(needles))
        of_session = (
            f"{CHUNK_TERMS_AND_SESSION} @@ (CAST(%(session_lexeme)s AS tsquery) && ({any_needle}))"
        )
    else:
        of_session = "session_id = %(session)s"
    return (
        f"SELECT id FROM chunks WHERE tenant_id = %(tenant)s AND {of_session} "
        f"AND status = 'active' AND ({verbatim}) ORDER BY turn_last DESC, part DESC, id "
        "LIMIT %(limit)s"
    )  # run by the driver itself (`read_once`): psycopg's placeholders


def session_lexeme(session_pk: uuid.UUID) -> str:
    """The session's lexeme in `CHUNK_TERMS_AND_SESSION`, as a `tsquery` (quoted: it holds a
    space)."""
    return f"'session {session_pk}'"


async def exact_hits(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    needles: Sequence[str],
    limit: int,
) -> list[str]:
    """Chunks holding any of the IDs / quoted strings verbatim (case-insensitive), newest first.

    A chunk that holds a needle holds all of the needle's terms, so the index of the chunks'
    terms with their session narrows the chunks to check first (the match itself stays the
    verbatim ILIKE): the cost follows the session's chunks that share a needle's terms, not the
    session's size nor the table's (`_exact_statement`). A needle without terms (only stopwords
    or punctuation) can only be found by checking every chunk of the session.
    """
    if not needles:
        return []
    docs = [lexical_document(n) for n in needles]
    by_terms = all(docs)
    params: dict[str, Any] = {"tenant": tenant_id, "limit": limit}
    params |= {f"n{i}": _like_pattern(n) for i, n in enumerate(needles)}
    if by_terms:
        params["session_lexeme"] = session_lexeme(session_pk)
        params |= {f"t{i}": doc for i, doc in enumerate(docs)}
    else:
        params["session"] = session_pk
    cursor = await conn.execute(_exact_statement(len(needles), by_terms), params)
    return [str(cid) for (cid,) in await cursor.fetchall()]


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
    untrusted_roles: list[str]  # the roles of its untrusted turns

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
            chunk.untrusted_roles,
        )


SHOWN_COLUMNS = (
    "c.id, c.status, c.turn_first, c.turn_last, c.part, c.parts, c.ts_last, c.raw_text, c.trusted, "
    "c.token_count, c.untrusted_roles"
)
# The exact scan of one session's vectors, ranked by distance: the head of both statements below,
# so that they return the nearest in the same order. It compares the vectors as stored, without
# a cast to the model's dimension (a cast copies every vector); one model's vectors all have that
# dimension.
_RANKED_NEAREST = (
    "WITH near AS (SELECT id, tenant_id, embedding <=> CAST(%(vector)s AS vector) AS distance "
    "FROM chunks "
    "WHERE tenant_id = %(tenant)s AND session_id = %(session)s AND status = 'active' "
    "AND embedding_model = %(model)s "
    "ORDER BY distance LIMIT %(limit)s), "
    "ranked AS (SELECT id, tenant_id, distance, row_number() OVER (ORDER BY distance) AS place "
    "FROM near) "
)
# The scan and what recall shows of those chunks and of the other arms' candidates (`ids`), in
# one statement: the vector arm and the candidates' rows in one round trip. The nearest come
# first, in distance order, with their distance; the others after them with none.
_NEAREST_AND_SHOWN = (
    _RANKED_NEAREST + f"SELECT {SHOWN_COLUMNS}, r.distance FROM chunks c "
    "LEFT JOIN ranked r ON r.id = c.id AND r.tenant_id = c.tenant_id "
    "WHERE c.tenant_id = %(tenant)s "
    "AND c.id = ANY(ARRAY(SELECT id FROM ranked) || CAST(%(ids)s AS uuid[])) "
    "ORDER BY r.place NULLS LAST"
)  # run by the driver itself (`read_once`): psycopg's placeholders
_SHOWN_BY_ID = (
    f"SELECT {SHOWN_COLUMNS}, NULL FROM chunks c "
    "WHERE c.tenant_id = %(tenant)s AND c.id = ANY(CAST(%(ids)s AS uuid[]))"
)
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
    tenant_id: uuid.UUID,
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
        return RecallRows({}, await _shown_by_id(conn, tenant_id, ids))
    params = {
        "vector": vector_literal(vector),
        "tenant": tenant_id,
        "session": session_pk,
        "model": model,
        "limit": limit,
    }
    if known:
        cursor = await conn.execute(_NEAREST, params)
        nearest = {str(cid): 1.0 - float(distance) for cid, distance in await cursor.fetchall()}
        wanted = [cid for cid in nearest if cid not in known]
        return RecallRows(nearest, await _shown_by_id(conn, tenant_id, [*wanted, *ids]))
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
    conn: psycopg.AsyncConnection[Any], tenant_id: uuid.UUID, ids: Sequence[str]
) -> dict[str, ShownChunk]:
    if not ids:
        return {}
    cursor = await conn.execute(_SHOWN_BY_ID, {"tenant": tenant_id, "ids": list(ids)})
    return {str(row[0]): ShownChunk(str(row[0]), *row[1:-1]) for row in await cursor.fetchall()}


# pgvector's binary form of a vector (`vector_send`): dimension and a reserved field (int16
# each), then the components as big-endian float32.
_VECTOR_HEADER_BYTES = 4
_VECTORS_BY_ID = (
    "SELECT id, vector_send(embedding) FROM chunks "
    "WHERE tenant_id = %(tenant)s AND session_id = %(session)s "
    "AND id = ANY(CAST(%(ids)s AS uuid[])) AND embedding_model = %(model)s "
    "AND embedding IS NOT NULL"
)


async def chunk_vectors(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    model: str,
    ids: Sequence[str],
) -> dict[str, np.ndarray]:
    """The vectors of `model` of the session's chunks `ids` that have one, as float32 arrays.
    Read in binary: ~1.5 KB a 384-d vector, where the text form is ~3x larger and slow to
    parse."""
    if not ids:
        return {}
    cursor = await conn.execute(
        _VECTORS_BY_ID,
        {"tenant": tenant_id, "session": session_pk, "model": model, "ids": list(ids)},
        binary=True,
    )
    return {
        str(cid): np.frombuffer(data, dtype=">f4", offset=_VECTOR_HEADER_BYTES).astype(np.float32)
        for cid, data in await cursor.fetchall()
    }


# --- forget and erase ----------------------------------------------------------------------------


async def chunks_overlapping(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, first: int, last: int
) -> list[Chunk]:
    query = (
        select(Chunk)
        .where(
            Chunk.tenant_id == tenant_id,
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            Chunk.turn_first <= last,
            Chunk.turn_last >= first,
        )
        .order_by(Chunk.turn_first, Chunk.part)
    )
    return list((await db.execute(query)).scalars())


async def tombstone_chunks(
    db: AsyncSession, tenant_id: uuid.UUID, chunk_ids: Sequence[uuid.UUID]
) -> None:
    if chunk_ids:
        await db.execute(
            update(Chunk)
            .where(Chunk.tenant_id == tenant_id, Chunk.id.in_(chunk_ids))
            .values(status="tombstoned")
        )


async def tombstone_session_chunks(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> None:
    await db.execute(
        update(Chunk)
        .where(
            Chunk.tenant_id == tenant_id, Chunk.session_id == session_pk, Chunk.status == "active"
        )
        .values(status="tombstoned")
    )


# The roles of the turns being marked untrusted (`:seqs`, with their `:roles`) that a chunk covers.
_COVERED_UNTRUSTED = (
    "SELECT s.role FROM unnest(CAST(:seqs AS bigint[]), CAST(:roles AS text[])) AS s(seq, role) "
    "WHERE s.seq BETWEEN chunks.turn_first AND chunks.turn_last"
)


async def distrust_chunks(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, roles: Mapping[int, str]
) -> list[uuid.UUID]:
    """Label untrusted the active chunks covering any of the turns `roles` (their roles by seq),
    each label naming those turns' roles too; returns the chunks whose label changed."""
    if not roles:
        return []
    result = await db.execute(
        text(
            "UPDATE chunks SET trusted = false, untrusted_roles = ARRAY(SELECT DISTINCT r "
            f"FROM unnest(untrusted_roles || ARRAY({_COVERED_UNTRUSTED})) AS r ORDER BY r) "
            "WHERE tenant_id = :tenant AND session_id = :session AND status = 'active' "
            f"AND EXISTS ({_COVERED_UNTRUSTED} AND s.role <> ALL(untrusted_roles)) RETURNING id"
        ),
        {
            "tenant": tenant_id,
            "session": session_pk,
            "seqs": list(roles),
            "roles": list(roles.values()),
        },
    )
    return sorted(result.scalars())


async def erase_chunks(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> tuple[int, int, list[str]]:
    """Tombstoned chunks lose text, terms, tsvector and embedding; (chunks, embeddings, texts)."""
    rows = await db.execute(
        select(Chunk.raw_text, Chunk.embedding.is_not(None)).where(
            Chunk.tenant_id == tenant_id,
            Chunk.session_id == session_pk,
            Chunk.status == "tombstoned",
        )
    )
    found = list(rows)
    result = await db.execute(
        update(Chunk)
        .where(
            Chunk.tenant_id == tenant_id,
            Chunk.session_id == session_pk,
            Chunk.status == "tombstoned",
        )
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
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> tuple[int, int, list[str]]:
    """(chunks, chunks with an embedding, their texts) of a session about to be deleted,
    whatever their status."""
    found = list(
        await db.execute(
            select(Chunk.raw_text, Chunk.embedding.is_not(None)).where(
                Chunk.tenant_id == tenant_id, Chunk.session_id == session_pk
            )
        )
    )
    return len(found), sum(1 for _, had in found if had), [t for t, _ in found if t]
