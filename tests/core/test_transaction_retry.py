"""A real PostgreSQL deadlock: `retrying_transaction` runs the losing transaction again, and when
it keeps losing, the answer is a 409 naming the cause, never "database unavailable"."""

import asyncio
import uuid

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.core.db import create_sessionmaker, retrying_transaction
from app.core.errors import TransactionConflict
from app.http.errors import install_error_handlers
from app.store.keys import get_or_create_tenant
from tests.support.factories import transaction
from tests.support.waiting import wait_for

LOCK = text("SELECT name FROM tenants WHERE id = :id FOR UPDATE")


async def two_rows(engine: AsyncEngine) -> tuple[uuid.UUID, uuid.UUID]:
    async with transaction(engine) as db:
        first = await get_or_create_tenant(db, f"t-{uuid.uuid4().hex[:12]}")
        second = await get_or_create_tenant(db, f"t-{uuid.uuid4().hex[:12]}")
    return first.id, second.id


async def deadlock_once(engine: AsyncEngine, attempts: int) -> tuple[int, BaseException | str]:
    """`work` locks row a then row b; another transaction, holding b, asks for a once `work`
    waits on b: PostgreSQL ends `work`'s first attempt (it waited first, so its deadlock check
    runs first). Returns the attempts made and the outcome."""
    a, b = await two_rows(engine)
    calls = 0
    holding_a = asyncio.Event()

    async def work(db: AsyncSession) -> str:
        nonlocal calls
        calls += 1
        await db.execute(LOCK, {"id": a})
        holding_a.set()
        return str((await db.execute(LOCK, {"id": b})).scalar_one())

    async with engine.connect() as other:
        await other.begin()
        await other.execute(LOCK, {"id": b})
        async with create_sessionmaker(engine)() as db:
            attempt = asyncio.create_task(
                retrying_transaction(db, lambda: work(db), attempts=attempts)
            )
            await asyncio.wait_for(holding_a.wait(), 30)
            await wait_until_waiting(other, 1)
            await other.execute(LOCK, {"id": a})  # the cycle; granted once `work` is ended
            await other.commit()
            try:
                outcome: BaseException | str = await attempt
            except TransactionConflict as exc:
                outcome = exc
    return calls, outcome


async def wait_until_waiting(conn: AsyncConnection, backends: int) -> None:
    """Until `backends` sessions wait for a lock held by `conn`'s transaction."""
    pid = await conn.scalar(text("SELECT pg_backend_pid()"))
    query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")

    async def waiting() -> int:
        async with conn.engine.connect() as probe:
            return int(await probe.scalar(query, {"pid": pid}) or 0)

    await wait_for(waiting, lambda n: n >= backends, timeout=30, what="a lock wait")


async def test_a_deadlock_victim_is_run_again(engine: AsyncEngine) -> None:
    calls, outcome = await deadlock_once(engine, attempts=3)
    assert calls == 2
    assert isinstance(outcome, str) and outcome.startswith("t-")


async def test_a_deadlock_that_persists_is_a_409_with_its_cause(engine: AsyncEngine) -> None:
    calls, outcome = await deadlock_once(engine, attempts=1)
    assert calls == 1
    assert isinstance(outcome, TransactionConflict)
    assert outcome.status_code == 409 and outcome.code == "transaction_conflict"
    assert outcome.details == {"sqlstate": "40P01", "cause": "deadlock detected", "attempts": 1}

    # A deadlock no code retried, as the error handlers answer it.
    app = FastAPI()
    install_error_handlers(app, retry_after_seconds=5)
    cause = outcome.__cause__
    assert cause is not None

    @app.get("/deadlocked")
    async def deadlocked() -> None:
        raise cause

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        resp = await http.get("/deadlocked")
    assert resp.status_code == 409
    error = resp.json()["error"]
    assert error["code"] == "transaction_conflict"
    assert error["message"].startswith("deadlock detected")
    assert "cannot be reached" not in error["message"]
    assert error["details"]["sqlstate"] == "40P01"
    assert resp.headers["Retry-After"] == "1"
