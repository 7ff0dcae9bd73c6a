"""The periodic sweep (task `offload:sweep`): offloads for sessions over their watermark that
no job holds, embedding backlogs, per-session vector indexes, and the repair of counters that
drifted from a recount of the rows."""

import logging
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from procrastinate import JobContext
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.context import AppContext
from app.core.db import unit_of_work
from app.jobs.queue import TaskName, app_context, embedding_lock, enqueue, enqueue_offload
from app.offload.watermark import observe_watermark
from app.store import chunks as chunks_store
from app.store import embedding_backlog as embedding_backlog_store
from app.store import sessions as sessions_store
from app.store import vector_index as vector_index_store
from app.store.chunks import active_chunk_count
from app.store.embedding_backlog import CHUNKS
from app.store.models import SessionKey
from app.store.sessions import Counters, session_budget, write_session

logger = logging.getLogger("contextd.offload")
# The counter repair's drift warning keeps the logger it always had.
sessions_logger = logging.getLogger("contextd.sessions")


# The sweep runs every minute; sessions changed within this much (or over their trigger) have
# their counters recounted.
RECOUNT_LOOKBACK = timedelta(minutes=3)


async def sweep(job_context: JobContext, timestamp: int) -> dict[str, int]:
    """Safety net: session counters that drifted from the rows, sessions left over their
    watermark, and chunks still lacking an embedding."""
    context = app_context(job_context)
    now = datetime.now(UTC)
    written_since = now - timedelta(hours=context.settings.worker.sweep_lookback_hours)
    repaired = await recount_sessions(context, now - RECOUNT_LOOKBACK, written_since)
    async with unit_of_work(context.sessionmaker) as db:
        over = await sessions_store.sessions_over_watermark(
            db, context.settings.session_defaults, written_since
        )
        for session in over:
            await enqueue_offload(db, session, trigger="sweeper")
        embedder = context.embedder
        missing = await embedding_backlog_store.never_embedded(db, CHUNKS, 512) if embedder else []
        by_session: dict[SessionKey, list[str]] = {}
        for chunk in missing:
            by_session.setdefault(SessionKey(chunk.tenant_id, chunk.session_id), []).append(
                str(chunk.id)
            )
        for session, chunk_ids in by_session.items():
            # Under the session's embedding lock, like the offload's: one at a time, and out of
            # the way of the session's notes and offloads.
            await enqueue(
                db,
                TaskName.EMBED_CHUNKS,
                {"chunk_ids": chunk_ids, "tenant_id": str(session.tenant_id)},
                lock=embedding_lock(session.id),
                queueing_lock=f"embed:{session.id}",
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
    `recall.vector_index_min_chunks` chunks (`app.store.vector_index.nearest_through_index`)."""
    embedder = context.embedder
    if embedder is None:
        return []
    settings = context.settings.recall
    async with unit_of_work(context.sessionmaker) as db:
        wanted = await vector_index_store.sessions_needing_vector_index(
            db, embedder.name, settings.vector_index_min_chunks
        )
    built: list[uuid.UUID] = []
    async with context.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        dropped = await vector_index_store.drop_stale_vector_indexes(autocommit, embedder.name)
        if dropped:
            logger.info("dropped %d stale vector indexes", len(dropped))
        for session_pk in wanted[:at_most]:
            started = time.monotonic()
            if await vector_index_store.ensure_vector_index(
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


async def recount_sessions(
    context: AppContext, changed_since: datetime, written_since: datetime
) -> int:
    """Repair the counters of sessions whose rows say otherwise, each in its own short
    transaction (the session lock is held only while one session is recounted)."""
    async with unit_of_work(context.sessionmaker) as db:
        drifted = await sessions_store.sessions_with_drift(
            db,
            context.settings.session_defaults,
            chunks_store.active_chunk_count,
            changed_since=changed_since,
            written_since=written_since,
        )
    repaired = 0
    for session in drifted:
        async with unit_of_work(context.sessionmaker) as db:
            if await repair_counters(db, context.settings, context.cache, session):
                repaired += 1
    return repaired


@dataclass(frozen=True)
class CounterRepair:
    session: SessionKey
    stored: Counters
    counted: Counters


async def repair_counters(
    db: AsyncSession, settings: Settings, cache: Cache, key: SessionKey
) -> CounterRepair | None:
    """Recount the session's counters from its rows under the session lock; when they drifted,
    store the recount (and the watermark state it implies) and log the drift."""
    session = await sessions_store.lock_session_by_pk(db, key.tenant_id, key.id)
    if session is None or sessions_store.erasing(session):  # tombstoned since it was read
        return None
    counted = await sessions_store.recount(db, key.tenant_id, key.id, active_chunk_count)
    stored = Counters(session.c1_tokens, session.c1_turns, session.turn_count, session.chunk_count)
    if counted == stored:
        return None
    session.c1_tokens, session.c1_turns = counted.c1_tokens, counted.c1_turns
    session.turn_count, session.chunk_count = counted.turn_count, counted.chunk_count
    observation = await observe_watermark(db, session_budget(settings, session), session)
    await write_session(db, cache, session, **asdict(counted), offload_armed=observation.armed)
    sessions_logger.warning(
        "session counters drifted from the rows; repaired",
        extra={
            "session": session.external_id,
            "stored": asdict(stored),
            "counted": asdict(counted),
        },
    )
    return CounterRepair(key, stored, counted)
