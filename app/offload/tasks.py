"""Worker jobs of the write path: offload, chunk embedding, and the periodic sweeper."""

import logging
import uuid

from procrastinate import Blueprint, JobContext

from app.core.db import unit_of_work
from app.jobs.embedding import embed_backlog
from app.jobs.queue import (
    BACKGROUND_QUEUE,
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    TaskName,
    app_context,
    enqueue,
    session_of_job,
)
from app.offload.service import offload_session
from app.offload.sweep import sweep
from app.store import embedding_backlog as embedding_backlog_store
from app.store.embedding_backlog import CHUNKS, TenantRows

logger = logging.getLogger("contextd.offload")


async def run_offload(
    job_context: JobContext,
    session_pk: str,
    trigger: str = "watermark",
    tenant_id: str | None = None,  # None: queued before jobs carried it (`session_of_job`)
) -> int:
    context = app_context(job_context)
    session = await session_of_job(context, tenant_id, session_pk)
    if session is None:
        return 0
    async with unit_of_work(context.sessionmaker) as db:
        result = await offload_session(
            db, context.settings, context.cache, session.tenant_id, session.id, trigger=trigger
        )
    if result is None:
        return 0
    context.metrics.observe_offload(trigger, result.tokens_freed)  # committed: count it
    logger.info(
        "offloaded %d turns into %d chunks, ratio %.3f -> %.3f",
        result.turns_moved,
        result.chunks_written,
        result.ratio_before,
        result.ratio_after,
        extra={"session": session_pk, "trigger": trigger, "tokens_freed": result.tokens_freed},
    )
    return result.turns_moved


async def embed_chunks(
    job_context: JobContext,
    chunk_ids: list[str],
    tenant_id: str | None = None,  # None: queued before jobs carried it, see below
) -> int:
    """Embed one session's chunks off the request path (see `app.jobs.embedding`), one batch
    per run: the rest goes back to the queue as a new job under the same lock (the session's
    embedding lock, `app.jobs.queue.embedding_lock`), behind the jobs other sessions queued
    meanwhile."""
    context = app_context(job_context)
    embedder = context.embedder
    if embedder is None:
        return 0
    batch = context.settings.embedding.batch_size
    ids = [uuid.UUID(c) for c in chunk_ids[:batch]]
    if tenant_id is not None:
        of_tenants = [TenantRows(uuid.UUID(tenant_id), ids)]
    else:  # queued by a version before jobs carried the tenant: read from the rows, once
        async with unit_of_work(context.sessionmaker) as db:
            of_tenants = await embedding_backlog_store.tenants_of(db, CHUNKS, ids)
    done = 0
    for rows in of_tenants:
        done += await embed_backlog(
            context, embedder, CHUNKS, rows, batch=batch, text_of=lambda chunk: chunk.raw_text
        )
    if len(chunk_ids) > batch:
        # The rest, as queued: a job without its tenant learns it again from the rows.
        rest: dict[str, object] = {"chunk_ids": chunk_ids[batch:]}
        if tenant_id is not None:
            rest["tenant_id"] = tenant_id
        async with unit_of_work(context.sessionmaker) as db:
            await enqueue(db, TaskName.EMBED_CHUNKS, rest, lock=job_context.job.lock)
    return done


def blueprint() -> Blueprint:
    """A fresh blueprint per job app: procrastinate renames a blueprint's tasks in place when an
    app adds them, so one shared module-level blueprint breaks a second app in the process."""
    tasks = Blueprint()
    tasks.task(name="run", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(run_offload)
    # Embeddings and the sweep (its vector index build takes minutes) are background work: out
    # of the slots kept for a session's offload and notes (`app.jobs.queue.QUEUE`).
    tasks.task(name="embed_chunks", queue=BACKGROUND_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(
        embed_chunks
    )
    tasks.periodic(cron="* * * * *", periodic_id="sweep")(
        tasks.task(name="sweep", queue=BACKGROUND_QUEUE, pass_context=True)(sweep)
    )
    return tasks
