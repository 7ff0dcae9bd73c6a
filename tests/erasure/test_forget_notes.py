"""Forget removes what the notes derived from the forgotten turns, even when a notes job writes a
new version between forget's read of the notes and its compare-and-set."""

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.schemas import MemoryRequest, MemoryType
from app.core.cache import Cache
from app.core.config import Settings
from app.erasure.service import forget
from app.notes.schemas import Notes
from app.store import sessions as sessions_store
from tests.notes.test_notes_service import (
    ENGLISH,
    as_turns,
    offloaded_session,
    refresh,
    scratchpad,
)
from tests.support.factories import tenant_of, transaction
from tests.support.waiting import wait_for

BUDGET_SEQ = 3  # "The budget must not exceed 8000 EUR." -> a constraint from turn 3


def seqs_in(notes: Notes) -> set[int]:
    return {item.seq for item in notes.items() if item.seq is not None}


async def waiting_on_scratchpads(engine: AsyncEngine) -> int:
    """Backends waiting for a row lock in an UPDATE of scratchpads."""
    async with engine.connect() as conn:
        found = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'UPDATE scratchpads%'"
            )
        )
    return int(found or 0)


async def test_forget_rewrites_notes_committed_while_it_ran(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    _, pk = await offloaded_session(engine, settings, cache, as_turns(ENGLISH[:6]))
    assert await refresh(engine, settings, cache, pk) == "written"
    v1 = await scratchpad(engine, pk)
    assert BUDGET_SEQ in seqs_in(Notes.model_validate(v1["notes"]))

    # A notes job holds the scratchpad row and is about to commit version 2, which still
    # carries the item from turn 3.
    async with engine.connect() as job:
        transaction_of_job = await job.begin()
        await job.execute(
            text("UPDATE scratchpads SET version = version + 1 WHERE session_id = :s"), {"s": pk}
        )

        async def run_forget() -> dict[str, object]:
            async with transaction(engine) as db:
                session = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
                assert session is not None
                _, data = await forget(
                    db,
                    settings,
                    cache,
                    session,
                    MemoryRequest(type=MemoryType.FORGET, turn_range=[BUDGET_SEQ, BUDGET_SEQ]),
                )
            return data

        forgetting = asyncio.create_task(run_forget())
        await wait_for(
            lambda: waiting_on_scratchpads(engine),
            lambda waiting: waiting > 0,
            timeout=60,
            what="forget to reach the notes write",
        )
        await transaction_of_job.commit()
        data = await asyncio.wait_for(forgetting, timeout=60)

    assert data["forgotten_turns"] == [BUDGET_SEQ]
    final = await scratchpad(engine, pk)
    assert final["version"] == 3 and final["notes_version"] == 3
    assert BUDGET_SEQ not in seqs_in(Notes.model_validate(final["notes"]))
    assert final["stale_writes"] == 1  # the first attempt lost the race and was counted
