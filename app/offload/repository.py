"""SQL for chunks (the episodic store, C3) and offload events: written by the offload, searched
by recall, tombstoned and erased by forget. Every query of the `chunks` table lives here."""

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, or_, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Chunk, OffloadEvent
from app.embeddings.base import vector_literal

INSERT_BATCH = 500  # rows per multi-VALUES insert (stays far below the bind-parameter limit)


# --- write: offload, embeddings ------------------------------------------------------------------


async def insert_chunks(db: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Insert chunks; each row's `lexical_source` becomes its `tsvector` ('simple' parser)."""
    values = [
        {
            **{k: v for k, v in row.items() if k != "lexical_source"},
            "lexical": func.to_tsvector("simple", row["lexical_source"]),
        }
        for row in rows
    ]
    for start in range(0, len(values), INSERT_BATCH):
        await db.execute(insert(Chunk).values(values[start : start + INSERT_BATCH]))


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


async def active_chunk_ids(db: AsyncSession, session_pk: uuid.UUID) -> list[uuid.UUID]:
    query = select(Chunk.id).where(Chunk.session_id == session_pk, Chunk.status == "active")
    return list((await db.execute(query)).scalars().all())


# --- recall: the lexical, exact and vector arms --------------------------------------------------


async def term_stats(db: AsyncSession, session_pk: uuid.UUID) -> list[tuple[str, dict[str, int]]]:
    """(chunk id, term counts) of the session's active chunks: the BM25 arm's statistics."""
    rows = await db.execute(
        select(Chunk.id, Chunk.term_counts).where(
            Chunk.session_id == session_pk, Chunk.status == "active"
        )
    )
    return [(str(cid), counts) for cid, counts in rows]


def _like_pattern(needle: str) -> str:
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def exact_hits(
    db: AsyncSession, session_pk: uuid.UUID, needles: Sequence[str], limit: int
) -> list[str]:
    """Chunks holding any of the IDs / quoted strings verbatim (case-insensitive), newest first."""
    if not needles:
        return []
    rows = await db.execute(
        select(Chunk.id)
        .where(
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            or_(*(Chunk.raw_text.ilike(_like_pattern(n), escape="\\") for n in needles)),
        )
        .order_by(Chunk.turn_last.desc())
        .limit(limit)
    )
    return [str(cid) for cid in rows.scalars()]


async def nearest_chunks(
    db: AsyncSession,
    session_pk: uuid.UUID,
    model: str,
    dim: int,
    vector: Sequence[float],
    limit: int,
) -> dict[str, float]:
    """Cosine similarity of the session's chunks closest to `vector`, best first, by an exact scan
    of the session's own rows (there is no approximate index: a session holds few chunks, and
    pgvector applies a session filter only after an index scan, which would return too few).
    The materialised CTE keeps the planner on the session index.
    """
    query = text(
        f"""
        WITH own AS MATERIALIZED (
            SELECT id, embedding FROM chunks
            WHERE session_id = :session AND status = 'active' AND embedding_model = :model
        )
        SELECT id, embedding::vector({int(dim)}) <=> CAST(:vector AS vector({int(dim)})) AS distance
        FROM own ORDER BY distance LIMIT :limit
        """
    )
    rows = await db.execute(
        query,
        {"session": session_pk, "model": model, "vector": vector_literal(vector), "limit": limit},
    )
    return {str(cid): 1.0 - float(distance) for cid, distance in rows}


async def chunks_by_id(db: AsyncSession, ids: Sequence[str]) -> dict[str, Chunk]:
    if not ids:
        return {}
    rows = await db.execute(select(Chunk).where(Chunk.id.in_([uuid.UUID(i) for i in ids])))
    return {str(c.id): c for c in rows.scalars()}


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


async def count_session_chunks(db: AsyncSession, session_pk: uuid.UUID) -> tuple[int, int]:
    """(chunks, chunks with an embedding) of a session, whatever their status."""
    row = await db.execute(
        select(func.count(), func.count(Chunk.embedding)).where(Chunk.session_id == session_pk)
    )
    chunks, embedded = row.one()
    return int(chunks), int(embedded)


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
