"""The worker's sweep reads only what may need it: sessions written to lately, chunks with no
vector, large sessions; each read can be served by an index, so idle sessions do not add to the
sweep's cost (`benchmarks/sweep_scale.py` measures it)."""

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import driver_connection
from app.store import chunks as chunks_store
from app.store import embedding_backlog as embedding_backlog_store
from app.store import sessions as sessions_store
from app.store import vector_index as vector_index_store
from app.store.embedding_backlog import CHUNKS
from app.store.models import Session
from tests.store.test_vector_index import MODEL, add_session
from tests.support.factories import transaction

HOUR = timedelta(hours=1)


async def over_trigger_session(
    engine: AsyncEngine, settings: Settings, cache: Cache, sid: str
) -> uuid.UUID:
    """A session far over its watermark, never offloaded, with 3 embedded chunks."""
    pk = await add_session(engine, settings, cache, sid, np.eye(3, 32))
    async with transaction(engine) as db:
        await db.execute(
            update(Session)
            .where(Session.id == pk)
            .values(c1_tokens=10_000_000, c1_turns=5, last_offload_at=None)
        )
    return pk


async def written(engine: AsyncEngine, pk: uuid.UUID, ago: timedelta) -> None:
    async with transaction(engine) as db:
        await db.execute(
            text("UPDATE sessions SET updated_at = now() - :ago WHERE id = :pk"),
            {"ago": ago, "pk": pk},
        )


async def test_a_session_idle_past_the_lookback_is_left_to_its_next_write(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """Over its watermark with no job, an idle session is the sweep's while it was written to
    within the lookback (its counters too, once they drift), and its next append's after."""
    pk = await over_trigger_session(engine, settings, cache, f"idle-{uuid.uuid4().hex[:8]}")
    async with transaction(engine) as db:
        await db.execute(update(Session).where(Session.id == pk).values(turn_count=99))
    defaults = settings.session_defaults

    async def seen(lookback: timedelta) -> tuple[bool, bool]:
        since = datetime.now(UTC) - lookback
        async with transaction(engine) as db:
            over = await sessions_store.sessions_over_watermark(db, defaults, since)
            drifted = await sessions_store.sessions_with_drift(
                db,
                defaults,
                chunks_store.active_chunk_count,
                changed_since=datetime.now(UTC) - HOUR,
                written_since=since,
            )
        return pk in {key.id for key in over}, pk in {key.id for key in drifted}

    assert await seen(24 * HOUR) == (True, True)
    await written(engine, pk, 2 * 24 * HOUR)
    assert await seen(24 * HOUR) == (False, False)
    assert await seen(3 * 24 * HOUR) == (True, True)


async def test_never_embedded_is_the_active_rows_without_a_vector(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """A chunk with no vector is the sweep's; one holding another model's vector is `contextd
    reembed`'s, one no longer active is nobody's."""
    pk = await add_session(engine, settings, cache, f"emb-{uuid.uuid4().hex[:8]}", np.eye(4, 32))
    async with transaction(engine) as db:
        rows = await db.execute(
            text("SELECT id FROM chunks WHERE session_id = :pk ORDER BY turn_first"), {"pk": pk}
        )
        none, other_model, forgotten, embedded = list(rows.scalars())
        await db.execute(
            text("UPDATE chunks SET embedding = NULL, embedding_model = NULL WHERE id IN (:a, :b)"),
            {"a": none, "b": forgotten},
        )
        await db.execute(
            text("UPDATE chunks SET embedding_model = 'another-model' WHERE id = :c"),
            {"c": other_model},
        )
        await db.execute(
            text("UPDATE chunks SET status = 'forgotten' WHERE id = :c"), {"c": forgotten}
        )
    async with transaction(engine) as db:
        found = {c.id for c in await embedding_backlog_store.never_embedded(db, CHUNKS, 10_000)}
        lacking = {
            c.id for c in await embedding_backlog_store.pending(db, CHUNKS, None, MODEL, 10_000)
        }
    assert none in found and not {other_model, forgotten, embedded} & found
    assert {none, other_model} <= lacking  # what `contextd reembed` reads


@pytest.fixture
async def sent(engine: AsyncEngine) -> AsyncIterator[list[tuple[str, Any]]]:
    """The SELECT statements the engine sends, with their parameters."""
    statements: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", keep)
    yield statements
    event.remove(engine.sync_engine, "before_cursor_execute", keep)


async def plan(db: AsyncSession, statement: str, params: Any) -> str:
    """The plan PostgreSQL picks for `statement` when a sequential scan is the last resort."""
    driver = await driver_connection(await db.connection())
    async with driver.cursor() as cursor:
        await cursor.execute("SET LOCAL enable_seqscan = off")
        await cursor.execute("EXPLAIN " + statement, params)
        return "\n".join(row[0] for row in await cursor.fetchall())


async def test_each_sweep_read_can_go_through_an_index(
    engine: AsyncEngine, settings: Settings, sent: list[tuple[str, Any]]
) -> None:
    """The sessions over their watermark and with drifted counters through `updated_at`, the
    chunks lacking a vector through the partial index of exactly those, the sessions needing a
    vector index through `chunk_count`: none of them a scan of the whole table."""
    since = datetime.now(UTC) - 24 * HOUR
    defaults = settings.session_defaults
    reads: list[tuple[str, Callable[[AsyncSession], Awaitable[object]]]] = [
        (
            "ix_sessions_updated",
            lambda db: sessions_store.sessions_over_watermark(db, defaults, since),
        ),
        (
            "ix_sessions_updated",
            lambda db: sessions_store.sessions_with_drift(
                db,
                defaults,
                chunks_store.active_chunk_count,
                changed_since=datetime.now(UTC) - HOUR,
                written_since=since,
            ),
        ),
        (
            "ix_chunks_unembedded",
            lambda db: embedding_backlog_store.never_embedded(db, CHUNKS, 512),
        ),
        (
            "ix_sessions_chunk_count",
            lambda db: vector_index_store.sessions_needing_vector_index(db, MODEL, 20_000),
        ),
    ]
    for index, read in reads:
        sent.clear()
        async with transaction(engine) as db:
            await read(db)
            statement, params = sent[0]
            shown = await plan(db, statement, params)
        assert index in shown, shown
        assert "Seq Scan on sessions" not in shown and "Seq Scan on chunks" not in shown, shown
