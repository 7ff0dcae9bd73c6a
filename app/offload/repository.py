"""SQL for chunks (the episodic store, C3), offload events and the vector index."""

import re
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.db.models import Chunk, OffloadEvent, Turn

INSERT_BATCH = 500  # rows per multi-VALUES insert (stays far below the bind-parameter limit)


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


async def assign_turns(
    db: AsyncSession, session_pk: uuid.UUID, chunk_id: uuid.UUID, seq_first: int, seq_last: int
) -> int:
    """Mark the window turns seq_first..seq_last as covered by `chunk_id`. Returns rows marked."""
    result = await db.execute(
        update(Turn)
        .where(
            Turn.session_id == session_pk,
            Turn.seq.between(seq_first, seq_last),
            Turn.chunk_id.is_(None),
        )
        .values(chunk_id=chunk_id)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def add_offload_event(db: AsyncSession, **values: Any) -> None:
    db.add(OffloadEvent(**values))
    await db.flush()


async def chunks_to_embed(
    db: AsyncSession, chunk_ids: Sequence[uuid.UUID] | None, model: str, limit: int
) -> list[Chunk]:
    """Active chunks lacking an embedding of `model` (all of them when `chunk_ids` is None)."""
    query = (
        select(Chunk)
        .where(
            Chunk.status == "active",
            (Chunk.embedding.is_(None)) | (Chunk.embedding_model != model),
        )
        .order_by(Chunk.created_at)
        .limit(limit)
    )
    if chunk_ids is not None:
        query = query.where(Chunk.id.in_(list(chunk_ids)))
    return list((await db.execute(query)).scalars().all())


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


def _index_name(model: str) -> str:
    return "ix_chunks_embedding_" + re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")


async def ensure_vector_index(conn: AsyncConnection, model: str, dim: int) -> None:
    """An HNSW (cosine) index over the vectors of one embedding model.

    The column is untyped `vector` so that a model change needs no migration; the index is on the
    expression `embedding::vector(dim)` restricted to that model's rows, and queries use the same
    expression and predicate so the planner can pick it.
    """
    if not re.fullmatch(r"[A-Za-z0-9._:/-]{1,64}", model):
        raise ValueError(f"embedding model name not allowed in an index predicate: {model!r}")
    # CREATE INDEX IF NOT EXISTS is not safe against a concurrent creator (the loser fails on
    # pg_class's unique index): API and worker starting together must take turns.
    await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('contextd:vector_index'))"))
    await conn.execute(
        text(
            f"CREATE INDEX IF NOT EXISTS {_index_name(model)} ON chunks USING hnsw "
            f"((embedding::vector({int(dim)})) vector_cosine_ops) "
            f"WHERE embedding_model = '{model}'"
        )
    )


async def sessions_over_watermark(
    db: AsyncSession, *, context_limit: int, reserve_tokens: int, trigger_ratio: float, c0: int
) -> list[uuid.UUID]:
    """Sessions at or over their trigger ratio, changed since their last offload, with no offload
    job pending: the safety net for a job that failed for good. Ratios use the session's own
    configuration over the given defaults; the offload re-checks before moving anything.
    """
    rows = await db.execute(
        text(
            """
            SELECT s.id FROM sessions s
            WHERE s.c1_turns > 0
              AND (s.last_offload_at IS NULL OR s.updated_at > s.last_offload_at)
              AND (coalesce(s.c0_tokens, (s.config->>'c0_tokens')::int, :c0) + s.c1_tokens
                   + s.c2_tokens)::float
                  / greatest(coalesce((s.config->>'context_limit')::int, :limit)
                             - coalesce((s.config->>'reserve_tokens')::int, :reserve), 1)
                  >= coalesce((s.config->>'trigger_ratio')::float, :trigger)
              AND NOT EXISTS (
                  SELECT 1 FROM procrastinate_jobs j
                  WHERE j.queueing_lock = 'offload:' || s.id::text
                    AND j.status IN ('todo', 'doing'))
            LIMIT 500
            """
        ),
        {"limit": context_limit, "reserve": reserve_tokens, "trigger": trigger_ratio, "c0": c0},
    )
    return [row[0] for row in rows]


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
    query = select(Chunk).where(
        Chunk.id == chunk_id, Chunk.session_id == session_pk, Chunk.status == "active"
    )
    return (await db.execute(query)).scalar_one_or_none()


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
