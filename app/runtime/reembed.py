"""`contextd reembed`: move every active chunk to the configured embedding model.

After a change of embedder (another model, another dimension) the stored vectors belong to the old
model and the vector arm ignores them. This re-embeds, oldest first, every active chunk whose
`embedding_model` is not the configured one (or that has no vector yet), one batch per
transaction: a batch is committed as soon as it is embedded, so an interrupted run loses at most
one batch and the next run resumes where it stopped (the selection is "not yet at this model", not
an offset). Lexical search never depends on vectors, so every chunk stays findable throughout; a
chunk keeps its old vector until its new one is written.
"""

from collections.abc import Callable

from app.core.context import AppContext
from app.core.db import unit_of_work
from app.core.progress import say
from app.embeddings.base import EmbedderUnavailable
from app.store import embedding_backlog as embedding_backlog_store
from app.store.embedding_backlog import CHUNKS


async def reembed(
    context: AppContext, batch_size: int, progress: Callable[[str], None] = say
) -> int:
    """Re-embed every active chunk not at the configured model; returns how many were written.

    Raises `EmbedderUnavailable` when the provider fails (after counting the attempt on the
    batch); the batches already written stay written and a rerun continues from there.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    if context.embedder is None:
        await context.start_embedder(warm=("passage",))
    embedder = context.embedder
    if embedder is None:
        progress("embedding kind is 'none': nothing to re-embed")
        return 0
    async with unit_of_work(context.sessionmaker) as db:
        total = await embedding_backlog_store.count_pending(db, CHUNKS, embedder.name)
    progress(f"re-embedding {total} chunks with {embedder.name} ({embedder.dim}-d)")
    done = 0
    while True:
        async with unit_of_work(context.sessionmaker) as db:
            chunks = await embedding_backlog_store.pending(
                db, CHUNKS, None, embedder.name, batch_size
            )
            if not chunks:
                break
            try:
                vectors = await embedder.embed_passages([c.raw_text for c in chunks])
            except EmbedderUnavailable as exc:
                for rows in embedding_backlog_store.by_tenant(chunks):
                    await embedding_backlog_store.count_failure(db, CHUNKS, rows)
                await db.commit()
                progress(f"stopped after {done}/{total}: {exc}; run again to resume")
                raise
            for chunk, vector in zip(chunks, vectors, strict=True):
                await embedding_backlog_store.store_vector(
                    db, CHUNKS, chunk.tenant_id, chunk.id, vector.tolist(), embedder.name
                )
        done += len(chunks)
        progress(f"{done}/{total} chunks re-embedded")
    progress(f"done: {done} chunks now embedded with {embedder.name}")
    return done
