"""The worker's embedding loop, shared by chunks and remembered items: load a batch of rows that
lack a vector of the embedder's model, embed their texts as passages, store, repeat until none is
left. A provider failure counts an attempt on the batch, commits that, and re-raises so the job
retries later; the rows stay searchable lexically meanwhile."""

from collections.abc import Callable

from app.core.context import AppContext
from app.core.db import unit_of_work
from app.embeddings.base import Embedder, EmbedderUnavailable
from app.store import embedding_backlog as embedding_backlog_store
from app.store import sessions as sessions_store
from app.store.embedding_backlog import Backlog, Row, TenantRows


async def embed_backlog(
    context: AppContext,
    embedder: Embedder,
    backlog: Backlog[Row],
    of: TenantRows,
    *,
    batch: int,
    text_of: Callable[[Row], str],
) -> int:
    """Embed the rows `of` one tenant that lack a vector of the embedder's model, batch after batch;
    rows embedded.

    The rows are read in one short transaction and stored in another: no transaction stays open
    while the encoder works (a slow batch would otherwise hold a connection and hit the
    idle-in-transaction timeout, and the job would retry forever). `store_vector` writes only
    rows still active, so an item erased meanwhile keeps no vector. The rows' sessions are locked
    before any row is stored (the lock order of `app.store`): an erase updates the same rows in
    its own order, under the session lock."""
    maker = context.sessionmaker
    done = 0
    while True:
        async with unit_of_work(maker) as db:
            rows = await embedding_backlog_store.pending(db, backlog, of, embedder.name, batch)
        if not rows:
            return done
        try:
            vectors = await embedder.embed_passages([text_of(row) for row in rows])
        except EmbedderUnavailable:
            async with unit_of_work(maker) as db:
                await embedding_backlog_store.count_failure(
                    db, backlog, TenantRows(of.tenant_id, [r.id for r in rows])
                )
            raise
        async with unit_of_work(maker) as db:
            await sessions_store.lock_sessions(
                db, of.tenant_id, {r.session_id for r in rows if r.session_id is not None}
            )
            for row, vector in zip(rows, vectors, strict=True):
                await embedding_backlog_store.store_vector(
                    db, backlog, of.tenant_id, row.id, vector.tolist(), embedder.name
                )
        done += len(rows)
