"""The embedding backlog of chunks and of remembered items (`app.store.embedding_backlog`): which
rows lack a vector of a model, and what storing a vector or a failed attempt writes. Each table
keeps its own test of "lacks a vector": a vector without a model is pending for a chunk and not
for a remembered item."""

import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.store import embedding_backlog as backlog_store
from app.store.embedding_backlog import CHUNKS, MEMORIES, Backlog, Row, TenantRows
from app.store.models import Chunk, Memory, Session
from tests.support.factories import append, new_caller, transaction

OWN_DATABASE = True  # counts every pending row of the database
MODEL = "model-a"
VECTOR = [0.5, 0.25, 0.125]


async def new_session(engine: AsyncEngine, settings: Settings, cache: Cache) -> Session:
    caller = await new_caller(engine)
    sid = f"s-{uuid.uuid4().hex[:8]}"
    await append(engine, caller, settings, cache, sid, [{"role": "user", "content": "hello"}])
    async with transaction(engine) as db:
        found = await db.scalar(select(Session).where(Session.external_id == sid))
    assert found is not None
    return found


def chunk(session: Session, status: str, vector: list[float] | None, model: str | None) -> Chunk:
    now = datetime.now(UTC)
    return Chunk(
        tenant_id=session.tenant_id,
        session_id=session.id,
        turn_first=1,
        turn_last=1,
        ts_first=now,
        ts_last=now,
        raw_text="a chunk",
        token_count=2,
        lexical=func.to_tsvector("simple", "a chunk"),
        embedding=vector,
        embedding_model=model,
        status=status,
    )


def memory(
    session: Session, status: str, text: str, vector: list[float] | None, model: str | None
) -> Memory:
    return Memory(
        tenant_id=session.tenant_id,
        session_id=session.id,
        scope="session",
        text=text,
        source="memory",
        lexical=func.to_tsvector("simple", text),
        embedding=vector,
        embedding_model=model,
        status=status,
    )


async def add_and_read_pending(
    engine: AsyncEngine, backlog: Backlog[Row], rows: dict[str, Row]
) -> tuple[set[str], int]:
    """Add the named rows (in one transaction: one `created_at`); the names of those pending,
    and how many more rows `count_pending` counts than before."""
    async with transaction(engine) as db:
        before = await backlog_store.count_pending(db, backlog, MODEL)
        db.add_all(rows.values())
    names = {row.id: name for name, row in rows.items()}
    tenant = next(iter(rows.values())).tenant_id
    async with transaction(engine) as db:
        pending = await backlog_store.pending(
            db, backlog, TenantRows(tenant, list(names)), MODEL, 10
        )
        after = await backlog_store.count_pending(db, backlog, MODEL)
    return {names[row.id] for row in pending}, after - before


async def test_chunks_lacking_a_vector_of_the_model_are_pending(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    session = await new_session(engine, settings, cache)
    rows = {
        "no vector": chunk(session, "active", None, None),
        "this model": chunk(session, "active", VECTOR, MODEL),
        "other model": chunk(session, "active", VECTOR, "model-b"),
        "vector without model": chunk(session, "active", VECTOR, None),
        "not active": chunk(session, "tombstoned", None, None),
    }
    pending, counted = await add_and_read_pending(engine, CHUNKS, rows)
    expected = {"no vector", "other model", "vector without model"}
    assert pending == expected
    assert counted == len(expected)
    async with transaction(engine) as db:
        ids = TenantRows(session.tenant_id, [row.id for row in rows.values()])
        assert len(await backlog_store.pending(db, CHUNKS, ids, MODEL, 2)) == 2
        # Another tenant's read names none of these rows.
        elsewhere = TenantRows(uuid.uuid4(), ids.ids)
        assert await backlog_store.pending(db, CHUNKS, elsewhere, MODEL, 2) == []


async def test_remembered_items_lacking_a_vector_of_the_model_are_pending(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    session = await new_session(engine, settings, cache)
    rows = {
        "no vector": memory(session, "active", "likes tea", None, None),
        "this model": memory(session, "active", "likes tea", VECTOR, MODEL),
        "other model": memory(session, "active", "likes tea", VECTOR, "model-b"),
        "vector without model": memory(session, "active", "likes tea", VECTOR, None),
        "erased": memory(session, "active", "", None, None),
        "tombstoned": memory(session, "tombstoned", "likes tea", None, None),
    }
    pending, counted = await add_and_read_pending(engine, MEMORIES, rows)
    expected = {"no vector", "other model"}
    assert pending == expected
    assert counted == len(expected)


async def test_a_vector_is_stored_on_active_rows_only_and_failures_are_counted(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    session = await new_session(engine, settings, cache)
    live, gone = chunk(session, "active", None, None), chunk(session, "tombstoned", None, None)
    item = memory(session, "active", "likes tea", None, None)
    async with transaction(engine) as db:
        db.add_all([live, gone, item])
    async with transaction(engine) as db:
        tenant = session.tenant_id
        for row_id in (live.id, gone.id):
            await backlog_store.store_vector(db, CHUNKS, tenant, row_id, VECTOR, MODEL)
        await backlog_store.store_vector(db, MEMORIES, tenant, item.id, VECTOR, MODEL)
        await backlog_store.count_failure(db, CHUNKS, TenantRows(tenant, [live.id, gone.id]))
        await backlog_store.count_failure(db, CHUNKS, TenantRows(tenant, [live.id]))
        await backlog_store.count_failure(db, MEMORIES, TenantRows(tenant, [item.id]))
    async with transaction(engine) as db:
        chunks = {
            c.id: (c.embedding_model, c.embed_attempts)
            for c in (await db.scalars(select(Chunk).where(Chunk.id.in_([live.id, gone.id]))))
        }
        stored = await db.get(Memory, (item.id, item.tenant_id))
    assert chunks == {live.id: (MODEL, 2), gone.id: (None, 1)}
    assert stored is not None
    assert (stored.embedding_model, stored.embed_attempts) == (MODEL, 1)
    assert [float(x) for x in stored.embedding] == VECTOR
