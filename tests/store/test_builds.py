"""Stored builds on the real PostgreSQL: a session keeps its newest `keep`, and a transaction
that wrote nothing but the manifest commits without waiting for the WAL flush, while one that
wrote before (an appended turn) keeps its durable commit."""

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store import builds as builds_store
from app.store import sessions as sessions_store
from tests.support.factories import new_caller, transaction


async def test_a_session_keeps_its_newest_builds(engine: AsyncEngine) -> None:
    caller = await new_caller(engine)
    ids = [uuid.uuid4() for _ in range(5)]
    for n, build_id in enumerate(ids):
        async with transaction(engine) as db:
            session = await sessions_store.lock_or_create_session(
                db, caller.tenant_id, "kept-builds"
            )
            await builds_store.store_build(db, build_id, session, {"n": n}, keep=3)
    async with transaction(engine) as db:
        kept = await builds_store.recent_builds(db, session.tenant_id, session.id, 10)
    assert [b.id for b in kept] == ids[:1:-1] and [b.record["n"] for b in kept] == [4, 3, 2]


async def test_only_a_manifest_alone_commits_without_the_wal_flush(engine: AsyncEngine) -> None:
    caller = await new_caller(engine)
    async with transaction(engine) as db:
        session = await sessions_store.lock_or_create_session(db, caller.tenant_id, "async-commit")
    async with transaction(engine) as db:
        await db.get(type(session), (session.id, session.tenant_id))  # a read: no transaction id
        await builds_store.store_build(db, uuid.uuid4(), session, {}, keep=5)
        assert await db.scalar(text("SHOW synchronous_commit")) == "off"
    async with transaction(engine) as db:
        await db.execute(
            text("UPDATE sessions SET metadata = metadata WHERE id = :id"), {"id": session.id}
        )
        await builds_store.store_build(db, uuid.uuid4(), session, {}, keep=5)
        assert await db.scalar(text("SHOW synchronous_commit")) == "on"
