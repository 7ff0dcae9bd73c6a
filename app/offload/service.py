"""The offload: move the oldest window turns into chunks, in one transaction, or not at all.

Chunks written, turns marked, the session's counters (and so the notes' staleness) updated,
follow-up jobs enqueued and the metrics row written commit together; a crash at any point leaves
the session as it was, and a rerun (the job is retried) computes the plan afresh, so nothing is
moved twice.
"""

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.cpu import batches_off_loop
from app.core.db import local_time_limits
from app.domain.budget import Budget
from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.jobs.queue import TaskName, embedding_lock, enqueue, session_args, session_lock
from app.offload.chunking import ChunkDraft, chunk_row, chunking_config, iter_chunks
from app.offload.policy import OffloadPlan, select_offload
from app.store import chunks as chunks_store
from app.store import offload_events as offload_events_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session
from app.store.sessions import session_budget, write_session

logger = logging.getLogger("contextd.offload")


@dataclass(frozen=True)
class OffloadResult:
    session_pk: uuid.UUID
    turns_moved: int
    chunks_written: int
    tokens_freed: int
    ratio_before: float
    ratio_after: float
    floor_limited: bool
    chunk_ids: tuple[uuid.UUID, ...]


# Chunks per insert while the rest of an offload is still being chunked (`batches_off_loop`).
WRITE_BATCH = 1000


async def write_chunks(
    db: AsyncSession, settings: Settings, session: Session, turns: Sequence[TurnRecord]
) -> list[uuid.UUID]:
    """Chunk consecutive live `turns`, store the chunks and mark the turns as covered by them
    (the offload, and the re-chunk of what a forget left of a chunk). Returns the chunk ids.

    Chunking and the rows' term statistics run off the event loop for long text, batch by
    batch: the database stores one batch while the next is chunked (`batches_off_loop`)."""

    def chunk(draft: ChunkDraft) -> tuple[ChunkDraft, uuid.UUID, dict[str, object]]:
        chunk_id = uuid.uuid4()
        return draft, chunk_id, chunk_row(draft, chunk_id)

    drafts = iter_chunks(turns, chunking_config(settings))
    chars = sum(len(t.content) for t in turns)
    chunk_ids: list[uuid.UUID] = []
    marked = 0
    async for batch in batches_off_loop(map(chunk, drafts), WRITE_BATCH, chars=chars):
        await chunks_store.insert_chunks(
            db, session.tenant_id, session.id, [row for _, _, row in batch]
        )
        chunk_ids.extend(chunk_id for _, chunk_id, _ in batch)
        # Pieces of one split turn share its seq: the turn is covered by the first piece; the
        # others are marked copies (part > 1) that recall deduplicates.
        marked += await turns_store.assign_turns(
            db,
            session.tenant_id,
            session.id,
            [
                (chunk_id, draft.turn_first, draft.turn_last)
                for draft, chunk_id, _ in batch
                if draft.part == 1
            ],
        )
    if marked != len(turns):
        raise RuntimeError(f"chunks cover {marked} turns, expected {len(turns)}")
    return chunk_ids


async def offload_session(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    *,
    trigger: str,
    until_tokens: int | None = None,
) -> OffloadResult | None:
    """One offload in the caller's transaction. None when the session is gone or nothing moves."""
    started = time.perf_counter()
    session = await sessions_store.lock_session_by_pk(db, tenant_id, session_pk)
    if session is None or sessions_store.erasing(session):
        return None  # deleted since the job was enqueued, or waiting for its erase job
    budget = session_budget(settings, session)
    plan = await _plan(db, settings, session, budget, until_tokens)
    if not plan.turns:
        await write_session(db, cache, session, offload_armed=budget.armed_after_offload())
        return None
    chunk_ids, after = await _move(db, settings, cache, session, budget, plan)
    return await _follow_up(db, session, plan, chunk_ids, budget, after, trigger, started)


async def _plan(
    db: AsyncSession,
    settings: Settings,
    session: Session,
    budget: Budget,
    until_tokens: int | None,
) -> OffloadPlan:
    """The oldest window turns to move: down to `until_tokens`, or to the session's goal."""
    # Plan as if the notes were already at their cap: the notes job that follows this offload
    # may grow them, and the session must still be at the target once it has.
    notes_cap = message_tokens("system", "") + settings.notes.max_tokens
    planning = budget.with_counters(c2=max(budget.c2, notes_cap))
    window = await turns_store.window_turns(db, session.tenant_id, session.id)
    return select_offload(
        window,
        fixed_tokens=planning.fixed_tokens,
        goal=planning.offload_goal() if until_tokens is None else until_tokens,
        floor=budget.recent_floor(),
    )


async def _move(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    session: Session,
    budget: Budget,
    plan: OffloadPlan,
) -> tuple[list[uuid.UUID], Budget]:
    """The plan's turns into chunks and the session's counters updated; returns the chunk ids
    and the budget once the turns left the window.

    A tool result layered on arrival has its whole text in C3 already: it is marked as covered
    by its first piece, not chunked again as its view (a second set of pieces of one turn)."""
    pieces = await chunks_store.first_pieces(
        db, session.tenant_id, session.id, [t.seq for t in plan.turns]
    )
    chunk_ids: list[uuid.UUID] = []
    for _, run in groupby(plan.turns, key=lambda t: t.seq in pieces):
        turns = list(run)
        if turns[0].seq not in pieces:
            chunk_ids.extend(await write_chunks(db, settings, session, turns))
    layered = [(chunk_id, seq, seq) for seq, chunk_id in pieces.items()]
    await turns_store.assign_turns(db, session.tenant_id, session.id, layered)
    now = datetime.now(UTC)
    after = budget.after_leaving(plan.tokens_freed)
    await write_session(
        db,
        cache,
        session,
        offloaded_until_seq=plan.turns[-1].seq,
        c1_tokens=after.c1,
        c1_turns=session.c1_turns - len(plan.turns),
        chunk_count=session.chunk_count + len(chunk_ids),
        chunks_version=Session.chunks_version + 1,
        last_offload_at=now,
        offload_armed=after.armed_after_offload(),
    )
    return chunk_ids, after


async def _follow_up(
    db: AsyncSession,
    session: Session,
    plan: OffloadPlan,
    chunk_ids: list[uuid.UUID],
    budget: Budget,
    after: Budget,
    trigger: str,
    started: float,
) -> OffloadResult:
    """The jobs that follow a move (embed the chunks, refresh the notes) and its metrics row."""
    await enqueue(
        db,
        TaskName.EMBED_CHUNKS,
        {"chunk_ids": [str(c) for c in chunk_ids], "tenant_id": str(session.tenant_id)},
        lock=embedding_lock(session.id),
    )
    await enqueue(
        db,
        TaskName.REFRESH_NOTES,
        session_args(session.key),
        lock=session_lock(session.id),
        queueing_lock=f"notes:{session.id}",
    )
    await offload_events_store.add_offload_event(
        db,
        tenant_id=session.tenant_id,
        session_id=session.id,
        trigger=trigger,
        trigger_ratio=budget.ratio(),
        ratio_after=after.ratio(),
        tokens_freed=plan.tokens_freed,
        chunks_offloaded=len(chunk_ids),
        turn_first=plan.turns[0].seq,
        turn_last=plan.turns[-1].seq,
        turns=len(plan.turns),
        duration_ms=(time.perf_counter() - started) * 1000,
    )
    return OffloadResult(
        session_pk=session.id,
        turns_moved=len(plan.turns),
        chunks_written=len(chunk_ids),
        tokens_freed=plan.tokens_freed,
        ratio_before=budget.ratio(),
        ratio_after=after.ratio(),
        floor_limited=plan.floor_limited,
        chunk_ids=tuple(chunk_ids),
    )


async def inline_offload(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    *,
    trigger: str,
    until_tokens: int | None = None,
) -> int | None:
    """An offload a request runs itself instead of leaving it to the worker (a build at the
    emergency ratio, an append that took the window there), in a savepoint of the caller's
    transaction, its lock wait and statements bounded by PostgreSQL
    (`recall.emergency_offload_timeout_seconds`): on failure or timeout nothing of it remains
    and the transaction goes on. Returns the tokens freed (0: nothing could move), None on
    failure."""
    try:
        async with db.begin_nested():
            await local_time_limits(db, settings.recall.emergency_offload_timeout_seconds)
            result = await offload_session(
                db,
                settings,
                cache,
                tenant_id,
                session_pk,
                trigger=trigger,
                until_tokens=until_tokens,
            )
    except SQLAlchemyError as exc:
        logger.warning("inline offload failed: %s", type(exc).__name__, extra={"trigger": trigger})
        return None
    return result.tokens_freed if result is not None else 0
