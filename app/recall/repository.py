"""SQL of the recall arms: term statistics, exact hits, vector neighbours, chunk bodies."""

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Chunk, Turn
from app.embeddings.base import vector_literal


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
    """Cosine similarity of the session's chunks closest to `vector`, best first, by an exact scan.

    Per-session search scans the session's own rows: pgvector 0.6 applies WHERE filters after an
    HNSW index scan, so for one session among many the index would return too few rows. The
    materialised CTE keeps the planner on the session index.
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


def chunk_fields(chunk: Chunk) -> dict[str, Any]:
    return {
        "turn_first": chunk.turn_first,
        "turn_last": chunk.turn_last,
        "part": chunk.part,
        "parts": chunk.parts,
        "ts": chunk.ts_last,
        "text": chunk.raw_text,
        "trusted": chunk.trusted,
    }


async def turns_of_chunks(
    db: AsyncSession, session_pk: uuid.UUID, chunk_ids: Sequence[str]
) -> dict[str, list[Turn]]:
    """The live turns each chunk covers, in seq order (for showing a chunk's best turns)."""
    if not chunk_ids:
        return {}
    rows = await db.execute(
        select(Turn)
        .where(
            Turn.session_id == session_pk,
            Turn.chunk_id.in_([uuid.UUID(c) for c in chunk_ids]),
            Turn.forgotten_at.is_(None),
        )
        .order_by(Turn.seq)
    )
    out: dict[str, list[Turn]] = {}
    for turn in rows.scalars():
        out.setdefault(str(turn.chunk_id), []).append(turn)
    return out
