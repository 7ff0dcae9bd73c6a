"""A session's offload, notes and erase jobs run under the session's lock (one at a time); the
chunk embedding jobs of an offload and of a forget's re-chunk under its embedding lock, so that
an embedder that is down or hanging holds back none of the others."""

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.jobs.queue import embedding_lock, session_lock
from tests.erasure.test_erase_job import forget_turn
from tests.notes.test_notes_service import ENGLISH, as_turns, offloaded_session


async def jobs_of(engine: AsyncEngine, pk: uuid.UUID) -> list[tuple[str, str | None]]:
    """(task, lock) of the pending jobs whose arguments name the session or one of its chunks."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT j.task_name, j.lock FROM procrastinate_jobs j "
                "WHERE j.status = 'todo' AND ("
                "  j.args->>'session_pk' = :s"
                "  OR EXISTS (SELECT 1 FROM chunks c WHERE c.session_id = CAST(:s AS uuid)"
                "             AND j.args->'chunk_ids' ? c.id::text)"
                "  OR EXISTS (SELECT 1 FROM erase_receipts r"
                "             WHERE r.id::text = j.args->>'receipt_id'"
                "             AND r.target->>'session_pk' = :s)"
                ") ORDER BY j.id"
            ),
            {"s": str(pk)},
        )
        return [(task, lock) for task, lock in rows]


async def test_embedding_jobs_run_under_their_own_lock_the_others_under_the_session_lock(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    _, pk = await offloaded_session(engine, settings, cache, as_turns(ENGLISH[:6]))
    after_offload = await jobs_of(engine, pk)
    assert {task for task, _ in after_offload} >= {"offload:embed_chunks", "notes:refresh"}

    await forget_turn(engine, settings, cache, pk, 3)  # re-chunks the rest of turn 3's chunk
    jobs = await jobs_of(engine, pk)
    tasks = [task for task, _ in jobs]
    assert tasks.count("offload:embed_chunks") >= 2 and "memory:erase" in tasks
    assert embedding_lock(pk) != session_lock(pk)
    for task, lock in jobs:
        assert lock == (embedding_lock(pk) if task == "offload:embed_chunks" else session_lock(pk))
