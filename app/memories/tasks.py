"""Worker jobs of remembered items: `memory:embed` (their vectors, recall's vector arm), the
sweep that embeds items still lacking one, and the one that refreshes the notes of sessions
whose items entered or left force."""

import uuid
from datetime import UTC, datetime, timedelta

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.embedding import embed_backlog
from app.jobs.queue import BACKGROUND_QUEUE, DEFAULT_RETRY, TaskName, app_context, enqueue
from app.memories.policy import embedding_text
from app.memories.service import refresh_notes_of
from app.store import embedding_backlog as embedding_backlog_store
from app.store import memories as memories_store
from app.store import sessions as sessions_store
from app.store.embedding_backlog import MEMORIES, TenantRows

SWEEP_BATCH = 512
# The validity sweep runs every minute and looks back two: a tick missed is caught by the next.
VALIDITY_LOOKBACK = timedelta(minutes=2)


async def embed_memories(
    job_context: JobContext,
    memory_ids: list[str],
    tenant_id: str | None = None,  # None: queued before jobs carried it, see below
) -> int:
    """Embed remembered items of one tenant with the deployment's embedder, off the request
    path."""
    context = app_context(job_context)
    embedder = context.embedder
    if embedder is None:
        return 0
    ids = [uuid.UUID(m) for m in memory_ids]
    if tenant_id is not None:
        of_tenants = [TenantRows(uuid.UUID(tenant_id), ids)]
    else:  # queued by a version before jobs carried the tenant (the sweep's job then held
        # every tenant's items): read from the rows, once
        async with unit_of_work(context.sessionmaker) as db:
            of_tenants = await embedding_backlog_store.tenants_of(db, MEMORIES, ids)
    batch = context.settings.embedding.batch_size
    done = 0
    for rows in of_tenants:
        done += await embed_backlog(
            context,
            embedder,
            MEMORIES,
            rows,
            batch=batch,
            text_of=lambda memory: embedding_text(memory.text, memory.tags),
        )
    return done


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
        # One job per tenant: a job's rows are one tenant's.
        for rows in embedding_backlog_store.by_tenant(missing):
            await enqueue(
                db,
                TaskName.EMBED_MEMORIES,
                {"memory_ids": [str(m) for m in rows.ids], "tenant_id": str(rows.tenant_id)},
                queueing_lock=f"embed-memories:sweep:{rows.tenant_id}",
            )
    return len(missing)


async def sweep_validity(job_context: JobContext, timestamp: int) -> int:
    """Build-prompt reads the items in force at each build; the notes' `remembered` section is
    written by a job. When an item's validity starts or ends or its TTL passes, the notes of the
    sessions that see it are refreshed, so an expired item leaves them within a minute."""
    context = app_context(job_context)
    until = datetime.fromtimestamp(timestamp, UTC)
    async with unit_of_work(context.sessionmaker) as db:
        holders = await memories_store.crossed_validity(db, until - VALIDITY_LOOKBACK, until)
        for key, user_scope in holders:
            session = await sessions_store.get_session_by_pk(db, *key)
            if session is not None:
                await refresh_notes_of(db, session, user_scope=user_scope)
    return len(holders)


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
    tasks.periodic(cron="* * * * *", periodic_id="sweep_validity")(
        tasks.task(name="sweep_validity", queue=BACKGROUND_QUEUE, pass_context=True)(sweep_validity)
    )
    return tasks
