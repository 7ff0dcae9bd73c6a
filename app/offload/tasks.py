"""Worker jobs of the write path: offload, chunk embedding, and the periodic sweeper."""

import logging
import uuid
from datetime import UTC, datetime, timedelta

from procrastinate import Blueprint, JobContext

from app.core.context import AppContext
from app.core.db import unit_of_work
from app.embeddings.base import EmbedderUnavailable
from app.jobs.queue import (
    DEFAULT_QUEUE,
    DEFAULT_RETRY,
    TaskName,
    app_context,
    enqueue,
    enqueue_offload,
    session_lock,
)
from app.offload import repository
from app.offload.service import offload_session
from app.sessions import repository as sessions_repository
from app.sessions.service import repair_counters

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
    """Embed chunks off the request path. A provider failure counts an attempt and retries later;
    the chunks stay searchable lexically meanwhile."""
    context = app_context(job_context)
    embedder = context.embedder
    if embedder is None:
        return 0
    ids = [uuid.UUID(c) for c in chunk_ids]
    batch = context.settings.embedding.batch_size
    done = 0
    while True:
        async with unit_of_work(context.sessionmaker) as db:
            chunks = await repository.chunks_to_embed(db, ids, embedder.name, batch)
            if not chunks:
                return done
            try:
                vectors = await embedder.embed_passages([c.raw_text for c in chunks])
            except EmbedderUnavailable:
                await repository.count_embed_failure(db, [c.id for c in chunks])
                await db.commit()
                raise
            for chunk, vector in zip(chunks, vectors, strict=True):
                await repository.store_embedding(db, chunk.id, vector.tolist(), embedder.name)
        done += len(chunks)


async def sweep(job_context: JobContext, timestamp: int) -> dict[str, int]:
    """Safety net: session counters that drifted from the rows, sessions left over their
    watermark, and chunks still lacking an embedding."""
    context = app_context(job_context)
    repaired = await recount_sessions(context, datetime.now(UTC) - RECOUNT_LOOKBACK)
    async with unit_of_work(context.sessionmaker) as db:
        over = await sessions_repository.sessions_over_watermark(
            db, context.settings.session_defaults
        )
        for session_pk in over:
            await enqueue_offload(db, session_pk, trigger="sweeper")
        embedder = context.embedder
        missing = await repository.chunks_to_embed(db, None, embedder.name, 512) if embedder else []
        by_session: dict[uuid.UUID, list[str]] = {}
        for chunk in missing:
            by_session.setdefault(chunk.session_id, []).append(str(chunk.id))
        for session_pk, chunk_ids in by_session.items():
            # Under the session's lock, like every job of a session: they run one at a time.
            await enqueue(
                db,
                TaskName.EMBED_CHUNKS,
                {"chunk_ids": chunk_ids},
                lock=session_lock(session_pk),
                queueing_lock=f"embed:{session_pk}",
            )
    return {"sessions": len(over), "chunks": len(missing), "counters_repaired": repaired}


async def recount_sessions(context: AppContext, changed_since: datetime) -> int:
    """Repair the counters of sessions whose rows say otherwise, each in its own short
    transaction (the session lock is held only while one session is recounted)."""
    async with unit_of_work(context.sessionmaker) as db:
        drifted = await sessions_repository.sessions_with_drift(
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
    tasks.task(name="embed_chunks", queue=DEFAULT_QUEUE, pass_context=True, retry=DEFAULT_RETRY)(
        embed_chunks
    )
    tasks.periodic(cron="* * * * *", periodic_id="sweep")(
        tasks.task(name="sweep", queue=DEFAULT_QUEUE, pass_context=True)(sweep)
    )
    return tasks
