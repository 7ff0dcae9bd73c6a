"""Chunks that lack a vector of the deployment's embedding model: which to embed, storing a
vector, and counting a failed attempt."""

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import Chunk


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
