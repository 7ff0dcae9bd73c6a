"""Worker jobs of remembered items: `memory:embed` (their vectors, recall's vector arm) and the
sweep that embeds items still lacking one."""

import uuid

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.embedding import embed_backlog
from app.jobs.queue import BACKGROUND_QUEUE, DEFAULT_RETRY, TaskName, app_context, enqueue
from app.memories.policy import embedding_text
from app.store import embedding_backlog as embedding_backlog_store
from app.store.embedding_backlog import MEMORIES

SWEEP_BATCH = 512


async def embed_memories(job_context: JobContext, memory_ids: list[str]) -> int:
    """Embed remembered items with the deployment's embedder, off the request path."""
    context = app_context(job_context)
    embedder = context.embedder
    if embedder is None:
        return 0
    ids = [uuid.UUID(m) for m in memory_ids]
    batch = context.settings.embedding.batch_size
    return await embed_backlog(
        context,
        embedder,
        MEMORIES,
        ids,
        batch=batch,
        text_of=lambda memory: embedding_text(memory.text, memory.tags),
    )


async def sweep_embeddings(job_context: JobContext, timestamp: int) -> int:
    """Safety net: items written before the embedder was up, or whose job failed for good."""
    context = app_context(job_context)
    embedder = context.embedder
    if embedder is None:
        return 0
    async with unit_of_work(context.sessionmaker) as db:
        missing = await embedding_backlog_store.pending(
            db, MEMORIES, None, embedder.name, SWEEP_BATCH
        )
        if missing:
            await enqueue(
                db,
                TaskName.EMBED_MEMORIES,
                {"memory_ids": [str(m.id) for m in missing]},
                queueing_lock="embed-memories:sweep",
            )
    return len(missing)


def blueprint() -> Blueprint:
    """A fresh blueprint per job app (see `app.offload.tasks.blueprint`)."""
    tasks = Blueprint()
    # Background work, like the chunks' embeddings (`app.jobs.queue.QUEUE`).
    tasks.task(name="embed", queue=BACKGROUND_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(
        embed_memories
    )
    tasks.periodic(cron="* * * * *", periodic_id="sweep_embeddings")(
        tasks.task(name="sweep_embeddings", queue=BACKGROUND_QUEUE, pass_context=True)(
            sweep_embeddings
        )
    )
    return tasks
