"""Worker jobs of the write path: offload, chunk embedding, and the periodic sweeper."""

import logging
import time
import uuid
from datetime import UTC, datetime, timedelta

from procrastinate import Blueprint, JobContext

from app.core.context import AppContext
from app.core.db import unit_of_work
from app.jobs.embedding import embed_pending
from app.jobs.queue import (
    BACKGROUND_QUEUE,
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    TaskName,
    app_context,
    embedding_lock,
    enqueue,
    enqueue_offload,
)
from app.offload import repository
from app.offload.service import offload_session
from app.sessions.service import repair_counters
from app.store import sessions as sessions_store

# The sweep runs every minute; sessions changed within this much (or over their trigger) have
# their counters recounted.
RECOUNT_LOOKBACK = timedelta(minutes=3)

logger = logging.getLogger("contextd.offload")


async def run_offload(job_context: JobContext, session_pk: str, trigger: str = "watermark") -> int:
    context = app_context(job_context)
    async with unit_of_work(context.sessionmaker) as db:
        result = await offload_session(
            db, context.settings, context.cache, uuid.UUID(session_pk), trigger=trigger
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


async def embed_chunks(job_context: JobContext, chunk_ids: list[str]) -> int:
    """Embed chunks off the request path (see `app.jobs.embedding`), one batch per run: the
    rest goes back to the queue as a new job under the same lock (the session's embedding lock,
    `app.jobs.queue.embedding_lock`), behind the jobs other sessions queued meanwhile."""
    context = app_context(job_context)
    embedder = context.embedder
    if embedder is None:
        return 0
    batch = context.settings.embedding.batch_size
    ids = [uuid.UUID(c) for c in chunk_ids[:batch]]
    done = await embed_pending(
        context.sessionmaker,
        embedder,
        load=lambda db: repository.chunks_to_embed(db, ids, embedder.name, batch),
        text_of=lambda chunk: chunk.raw_text,
        store=lambda db, chunk, vector: repository.store_embedding(
            db, chunk.id, vector, embedder.name
        ),
        count_failure=lambda db, chunks: repository.count_embed_failure(db, [c.id for c in chunks]),
        lock_sessions=lambda db, chunks: sessions_store.lock_sessions(
            db, {c.session_id for c in chunks}
        ),
    )
    if len(chunk_ids) > batch:
        async with unit_of_work(context.sessionmaker) as db:
            await enqueue(
                db,
                TaskName.EMBED_CHUNKS,
                {"chunk_ids": chunk_ids[batch:]},
                lock=job_context.job.lock,
            )
    return done


async def sweep(job_context: JobContext, timestamp: int) -> dict[str, int]:
    """Safety net: session counters that drifted from the rows, sessions left over their
    watermark, and chunks still lacking an embedding."""
    context = app_context(job_context)
    repaired = await recount_sessions(context, datetime.now(UTC) - RECOUNT_LOOKBACK)
    async with unit_of_work(context.sessionmaker) as db:
        over = await sessions_store.sessions_over_watermark(db, context.settings.session_defaults)
        for session_pk in over:
            await enqueue_offload(db, session_pk, trigger="sweeper")
        embedder = context.embedder
        missing = await repository.chunks_to_embed(db, None, embedder.name, 512) if embedder else []
        by_session: dict[uuid.UUID, list[str]] = {}
        for chunk in missing:
            by_session.setdefault(chunk.session_id, []).append(str(chunk.id))
        for session_pk, chunk_ids in by_session.items():
            # Under the session's embedding lock, like the offload's: one at a time, and out of
            # the way of the session's notes and offloads.
            await enqueue(
                db,
                TaskName.EMBED_CHUNKS,
                {"chunk_ids": chunk_ids},
                lock=embedding_lock(session_pk),
                queueing_lock=f"embed:{session_pk}",
            )
    indexed = await index_large_sessions(context)
    return {
        "sessions": len(over),
        "chunks": len(missing),
        "counters_repaired": repaired,
        "vector_indexes_built": len(indexed),
    }


async def index_large_sessions(context: AppContext, at_most: int = 1) -> list[uuid.UUID]:
    """Give the largest sessions without one an HNSW index of their vectors (at most `at_most`
    per call: a build of 10^5 vectors takes minutes), and drop the indexes of deleted sessions
    and of other models. Recall searches a session through its index once it has
    `recall.vector_index_min_chunks` chunks (`app.offload.repository.nearest_through_index`)."""
    embedder = context.embedder
    if embedder is None:
        return []
    settings = context.settings.recall
    async with unit_of_work(context.sessionmaker) as db:
        wanted = await repository.sessions_needing_vector_index(
            db, embedder.name, settings.vector_index_min_chunks
        )
    built: list[uuid.UUID] = []
    async with context.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        dropped = await repository.drop_stale_vector_indexes(autocommit, embedder.name)
        if dropped:
            logger.info("dropped %d stale vector indexes", len(dropped))
        for session_pk in wanted[:at_most]:
            started = time.monotonic()
            if await repository.ensure_vector_index(
                autocommit,
                session_pk,
                embedder.name,
                embedder.dim,
                settings.vector_index_build_memory_mb,
            ):
                built.append(session_pk)
                logger.info(
                    "built the vector index of a session in %.1f s",
                    time.monotonic() - started,
                    extra={"session": str(session_pk)},
                )
    return built


async def recount_sessions(context: AppContext, changed_since: datetime) -> int:
    """Repair the counters of sessions whose rows say otherwise, each in its own short
    transaction (the session lock is held only while one session is recounted)."""
    async with unit_of_work(context.sessionmaker) as db:
        drifted = await sessions_store.sessions_with_drift(
            db,
            context.settings.session_defaults,
            repository.active_chunk_count,
            changed_since=changed_since,
        )
    repaired = 0
    for session_pk in drifted:
        async with unit_of_work(context.sessionmaker) as db:
            if await repair_counters(db, context.settings, context.cache, session_pk):
                repaired += 1
    return repaired


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
