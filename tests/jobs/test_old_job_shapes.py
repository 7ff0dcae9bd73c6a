"""Jobs queued by a version before jobs carried their tenant still run after an upgrade (a
rolling upgrade: such jobs stay in the queue, and a crash loses no accepted turn): an offload, a
notes refresh, a chunk and a remembered item embedding and an erase, each queued without its
`tenant_id` argument, are run by a real worker, which learns the tenant from the rows."""

import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.schemas import MemoryRequest, MemoryType
from app.core.cache import Cache
from app.core.config import Settings
from app.erasure.service import forget
from app.jobs.queue import TaskName, enqueue, enqueue_offload
from app.offload.service import offload_session
from app.store import memories as memories_store
from app.store import sessions as sessions_store
from app.store.memories import Change
from tests.offload.test_embedding_jobs import (
    FLOOR_OF_TWO,
    TURNS,
    embeddings_handler,
    worker_env_for,
)
from tests.offload.test_offload_service import session_pk
from tests.support.factories import append, configure, new_caller, transaction
from tests.support.loopback import loopback_server
from tests.support.waiting import wait_for
from tests.support.workers import worker_process

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

# What every task naming a session, its rows or a receipt took before the tenant was added.
OLD_SHAPES = {
    "offload:run": {"session_pk", "trigger"},
    "notes:refresh": {"session_pk"},
    "offload:embed_chunks": {"chunk_ids"},
    "memory:embed": {"memory_ids"},
    "memory:erase": {"receipt_id"},
}


async def queued(engine: AsyncEngine) -> list[tuple[str, str, set[str]]]:
    """(task, status, argument names) of every job but the periodic sweeps."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT task_name, status::text, args FROM procrastinate_jobs "
                "WHERE task_name = ANY(:tasks) ORDER BY id"
            ),
            {"tasks": list(OLD_SHAPES)},
        )
        return [(task, status, set(args)) for task, status, args in rows]


async def state(engine: AsyncEngine, pk: uuid.UUID, receipt_id: uuid.UUID) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = await conn.execute(
            text(
                "SELECT (SELECT count(*) FROM chunks WHERE session_id = :s AND status = 'active'"
                " AND embedding IS NULL) AS unembedded_chunks,"
                " (SELECT count(*) FROM memories WHERE session_id = :s AND embedding IS NULL)"
                " AS unembedded_items,"
                " (SELECT version FROM scratchpads WHERE session_id = :s) AS notes_version,"
                " (SELECT count(*) FROM offload_events WHERE session_id = :s) AS offloads,"
                " (SELECT status FROM erase_receipts WHERE id = :r) AS receipt"
            ),
            {"s": pk, "r": receipt_id},
        )
        return dict(row.one()._mapping)


async def test_jobs_queued_without_their_tenant_run_after_the_upgrade(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller = await new_caller(engine)
    sid = "old-jobs"
    await configure(engine, caller, settings, cache, sid, **FLOOR_OF_TWO)
    await append(engine, caller, settings, cache, sid, TURNS)
    pk = await session_pk(engine, caller.tenant_id, sid)
    # No worker yet: every job below waits in the queue, as across an upgrade.
    async with transaction(engine) as db:  # queues the chunks' embedding and the notes
        moved = await offload_session(
            db, settings, cache, caller.tenant_id, pk, trigger="test", until_tokens=0
        )
        assert moved is not None and moved.chunks_written >= 1
    await append(engine, caller, settings, cache, sid, TURNS[:4])
    async with transaction(engine) as db:
        session = await sessions_store.get_session_by_pk(db, caller.tenant_id, pk)
        assert session is not None
        await enqueue_offload(db, session.key, trigger="test")
        item = await memories_store.insert_memory(
            db,
            {
                "tenant_id": caller.tenant_id,
                "session_id": pk,
                "scope": "session",
                "text": "prefers the paper invoice",
                "source": "user",
            },
            "prefers the paper invoice",
            Change("user", None, "test"),
        )
        await enqueue(db, TaskName.EMBED_MEMORIES, {"memory_ids": [str(item.id)]})
    async with transaction(engine) as db:
        session = await sessions_store.get_session_by_pk(db, caller.tenant_id, pk)
        assert session is not None
        request = MemoryRequest(type=MemoryType.FORGET, turn_range=[1, 1])
        _, forgotten = await forget(db, settings, cache, session, request)
    receipt_id = uuid.UUID(forgotten["erase_receipt_id"])
    # The jobs as the previous version queued them: no tenant among their arguments.
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE procrastinate_jobs SET args = args - 'tenant_id'"))
    waiting = await queued(engine)
    assert {task for task, _, _ in waiting} == set(OLD_SHAPES)
    assert all(args <= OLD_SHAPES[task] | {"rebuild"} for task, _, args in waiting)

    handler_state: dict[str, Any] = {"up": True, "dim": 8}
    with loopback_server(embeddings_handler(handler_state)) as provider:
        model = f"loop-embed-8-{uuid.uuid4().hex[:8]}"
        with worker_process(worker_env_for(settings, provider.url, model, 8)):
            done = await wait_for(
                lambda: queued(engine),
                lambda jobs: all(status in ("succeeded", "failed") for _, status, _ in jobs),
                timeout=120,
                interval=0.2,
                what="the worker to run the jobs queued without their tenant",
            )
    assert [(task, status) for task, status, _ in done if status != "succeeded"] == []
    after = await state(engine, pk, receipt_id)
    assert after["unembedded_chunks"] == 0 and after["unembedded_items"] == 0
    assert after["notes_version"] >= 1
    assert after["offloads"] >= 1
    assert after["receipt"] == "completed"
