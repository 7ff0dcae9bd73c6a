"""The pool of the hot path's single-statement reads (`core.db.read_once`)."""

import asyncio
import time
import uuid
from typing import Any

import psycopg

from app.core.config import Settings
from app.core.db import create_reader_engine, read_once
from app.sessions.repository import turns_of_chunks


async def test_reads_beyond_the_pool_wait_for_its_connections_instead_of_opening_more(
    settings: Settings,
) -> None:
    """Two waves of 9 overlapping reads on a pool of 3 run on the same 3 PostgreSQL backends:
    a read beyond the pool waits for a pooled connection. An overflow connection would be a new
    backend, closed again when returned (a fork and a login every few builds under load)."""
    own = settings.model_copy(update={"db": settings.db.model_copy(update={"pool_size": 3})})
    reader = create_reader_engine(own)
    try:
        backends: set[int] = set()
        for _ in range(2):
            release = asyncio.Event()

            async def hold(
                conn: psycopg.AsyncConnection[Any], release: asyncio.Event = release
            ) -> int:
                row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
                assert row is not None
                await release.wait()
                return int(row[0])

            reads = [asyncio.create_task(read_once(reader, hold)) for _ in range(9)]
            deadline = time.monotonic() + 30
            while reader.pool.checkedout() < 3:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "the reads never got their connections"
                await asyncio.sleep(0.01)
            assert reader.pool.checkedout() == 3  # type: ignore[attr-defined]
            release.set()
            backends.update(await asyncio.gather(*reads))
        assert len(backends) == 3
    finally:
        await reader.dispose()


async def test_the_reader_pools_statements_are_planned_once_per_connection(
    settings: Settings,
) -> None:
    """The shown chunks' turns (an array of ids as a parameter), read seven times on one pooled
    connection: once psycopg has prepared the statement (its fifth run), PostgreSQL runs the plan
    it made once. Left to choose, it makes a new plan on every run: the kept plan's estimate for
    10 ids looks dearer than the plans for the few ids given."""
    own = settings.model_copy(update={"db": settings.db.model_copy(update={"pool_size": 1})})
    reader = create_reader_engine(own)
    session = uuid.uuid4()
    try:
        for n in range(7):
            chunk_ids = [str(uuid.uuid4()) for _ in range(1 + n % 3)]
            await read_once(reader, lambda conn, ids=chunk_ids: turns_of_chunks(conn, session, ids))

        async def plans(conn: psycopg.AsyncConnection[Any]) -> list[tuple[int, int]]:
            cursor = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%FROM turns WHERE session_id = $1 AND chunk_id = ANY%'"
            )
            return [(int(g), int(c)) for g, c in await cursor.fetchall()]

        [(generic, custom)] = await read_once(reader, plans)
        assert (generic, custom) == (2, 0)
    finally:
        await reader.dispose()
