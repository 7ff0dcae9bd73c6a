"""The pool of the hot path's single-statement reads (`core.db.read_once`)."""

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from app.core.config import Settings
from app.core.db import create_reader_pool, read_once
from app.store.turns import turns_of_chunks


async def test_reads_beyond_the_pool_wait_for_its_connections_instead_of_opening_more(
    settings: Settings,
) -> None:
    """Two waves of 9 overlapping reads on a pool of 3 run on the same 3 PostgreSQL backends:
    a read beyond the pool waits for a pooled connection. An overflow connection would be a new
    backend, closed again when returned (a fork and a login every few builds under load)."""
    own = settings.model_copy(update={"db": settings.db.model_copy(update={"pool_size": 3})})
    reader = create_reader_pool(own)
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
            while reader.lent < 3:
                assert time.monotonic() < deadline, "the reads never got their connections"
                await asyncio.sleep(0.01)
            assert reader.lent == 3
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
    reader = create_reader_pool(own)
    tenant, session = uuid.uuid4(), uuid.uuid4()
    try:
        for n in range(7):
            chunk_ids = [str(uuid.uuid4()) for _ in range(1 + n % 3)]
            await read_once(
                reader, lambda conn, ids=chunk_ids: turns_of_chunks(conn, tenant, session, ids)
            )

        async def plans(conn: psycopg.AsyncConnection[Any]) -> list[tuple[int, int]]:
            cursor = await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%FROM turns WHERE tenant_id = $1 AND session_id = $2 "
                "AND chunk_id = ANY%'"
            )
            return [(int(g), int(c)) for g, c in await cursor.fetchall()]

        [(generic, custom)] = await read_once(reader, plans)
        assert (generic, custom) == (2, 0)
    finally:
        await reader.dispose()


async def test_a_connection_postgresql_closed_is_replaced_and_the_read_runs_again(
    settings: Settings,
) -> None:
    """The backend of the pooled connection ends (PostgreSQL restarted, an administrator): the
    next read finds it dead, opens a new one and answers."""
    own = settings.model_copy(update={"db": settings.db.model_copy(update={"pool_size": 1})})
    reader = create_reader_pool(own)
    admin = await psycopg.AsyncConnection.connect(
        settings.sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    )
    try:
        first = await read_once(reader, backend_pid)
        await admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        second = await read_once(reader, backend_pid)
        assert second != first
        assert (reader.lent, await read_once(reader, backend_pid)) == (0, second)
    finally:
        await admin.close()
        await reader.dispose()


async def until_statement_runs(settings: Settings, statement: str, deadline_s: float = 10) -> None:
    """Return once PostgreSQL runs `statement` in another backend (fail after `deadline_s`);
    each check is one round trip to PostgreSQL."""
    admin = await psycopg.AsyncConnection.connect(
        settings.sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    )
    try:
        give_up = time.monotonic() + deadline_s
        while True:
            row = await (
                await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'active'",
                    (statement,),
                )
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            assert time.monotonic() < give_up, f"{statement!r} did not start"
    finally:
        await admin.close()


async def test_a_read_cancelled_mid_statement_leaves_its_connection_usable(
    settings: Settings,
) -> None:
    """A read cancelled while its statement runs (a client that left): the connection comes
    back idle (psycopg cancels the statement in PostgreSQL) or is closed; either way the next
    read on the pool of one answers at once, with no statement still running before it."""
    own = settings.model_copy(update={"db": settings.db.model_copy(update={"pool_size": 1})})
    reader = create_reader_pool(own)
    try:
        started = asyncio.Event()

        async def slow(conn: psycopg.AsyncConnection[Any]) -> None:
            started.set()
            await conn.execute("SELECT pg_sleep(30)")

        stuck = asyncio.create_task(read_once(reader, slow))
        await started.wait()
        await until_statement_runs(settings, "SELECT pg_sleep(30)")
        stuck.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stuck
        assert reader.lent == 0
        pid = await asyncio.wait_for(read_once(reader, backend_pid), timeout=10)

        async def running(conn: psycopg.AsyncConnection[Any]) -> int:
            row = await (
                await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%%' "
                    "AND state = 'active' AND pid <> pg_backend_pid()"
                )
            ).fetchone()
            assert row is not None
            return int(row[0])

        assert (await read_once(reader, running), await read_once(reader, backend_pid)) == (0, pid)
    finally:
        await reader.dispose()


async def test_a_database_that_cannot_be_reached_fails_the_read_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    """No PostgreSQL where the URL points: the read fails with SQLAlchemy's `OperationalError`
    (answered 503) without waiting for one to appear, and nothing stays counted as open."""
    down = settings.model_copy(
        update={"database_url": f"postgresql://postgres@/contextd?host={tmp_path}"}
    )
    reader = create_reader_pool(down)
    for _ in range(2):  # a failed open leaves no connection counted: the pool is not exhausted
        with pytest.raises(OperationalError):
            await read_once(reader, backend_pid)
    assert reader.lent == 0


async def backend_pid(conn: psycopg.AsyncConnection[Any]) -> int:
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])
