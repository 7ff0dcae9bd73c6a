"""The worker's embedding loop, shared by chunks and remembered items: load a batch of rows that
lack a vector of the embedder's model, embed their texts as passages, store, repeat until none is
left. A provider failure counts an attempt on the batch, commits that, and re-raises so the job
retries later; the rows stay searchable lexically meanwhile."""

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.db import unit_of_work
from app.embeddings.base import Embedder, EmbedderUnavailable

Row = TypeVar("Row")


async def embed_pending(
    maker: async_sessionmaker[AsyncSession],
    embedder: Embedder,
    *,
    load: Callable[[AsyncSession], Awaitable[Sequence[Row]]],
    text_of: Callable[[Row], str],
    store: Callable[[AsyncSession, Row, list[float]], Awaitable[Any]],
    count_failure: Callable[[AsyncSession, Sequence[Row]], Awaitable[Any]],
    lock_sessions: Callable[[AsyncSession, Sequence[Row]], Awaitable[Any]],
) -> int:
    """Embed what `load` returns, batch after batch; rows embedded.

    The rows are read in one short transaction and stored in another: no transaction stays open
    while the encoder works (a slow batch would otherwise hold a connection and hit the
    idle-in-transaction timeout, and the job would retry forever). `store` writes only rows
    still active, so an item erased meanwhile keeps no vector. The rows' sessions are locked
    before any row is stored (`lock_sessions`, the lock order of `app.store`): an
    erase updates the same rows in its own order, under the session lock."""
    done = 0
    while True:
        async with unit_of_work(maker) as db:
            rows = await load(db)
        if not rows:
            return done
        try:
            vectors = await embedder.embed_passages([text_of(row) for row in rows])
        except EmbedderUnavailable:
            async with unit_of_work(maker) as db:
                await count_failure(db, rows)
            raise
        async with unit_of_work(maker) as db:
            await lock_sessions(db, rows)
            for row, vector in zip(rows, vectors, strict=True):
                await store(db, row, vector.tolist())
        done += len(rows)
