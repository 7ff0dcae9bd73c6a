"""The worker is fair: a session's offload and notes do not wait behind another tenant's
embedding backlog. Tenant A's embedding jobs hold both of the worker's shared slots at a loopback
embedder that answers only when the test lets it, more wait behind them; then B's session needs
an offload."""

import threading
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.jobs.queue import TaskName, enqueue_offload
from app.offload.service import offload_session
from app.store.models import SessionKey
from tests.offload.test_embedding_jobs import (
    FLOOR_OF_TWO,
    chunk_states,
    embeddings_handler,
    progress,
    tagged_turns,
    worker_env_for,
)
from tests.offload.test_offload_service import session_pk
from tests.support.factories import append, configure, new_caller, tenant_of, transaction
from tests.support.loopback import loopback_server
from tests.support.waiting import wait_for
from tests.support.workers import worker_process

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

B_TAG = "tenant-b-session"
A_SESSIONS = 4  # four embedding lanes: two held in the worker's slots, two waiting


class HeldEmbedder:
    """Holds every embeddings request that carries `tag` (this test's tenant A's turns; earlier
    tests' jobs pass) until the test answers it."""

    def __init__(self) -> None:
        self.tag = f"tenant-a-{uuid.uuid4().hex[:8]}"
        self.answers = threading.Semaphore(0)
        self.arrived = 0
        self._count = threading.Lock()
        self._answer = embeddings_handler({"up": True, "dim": 8})

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if any(self.tag in passage for passage in body["input"]):
            with self._count:
                self.arrived += 1
            self.answers.acquire(timeout=120)
        return self._answer(method, path, body)

    async def requests_arrived(self) -> int:
        return self.arrived


async def embedding_jobs(engine: AsyncEngine, pks: list[uuid.UUID]) -> dict[str, int]:
    """The sessions' chunk embedding jobs waiting and running."""
    locks = [f"embeddings:{pk}" for pk in pks]
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT status::text, count(*) FROM procrastinate_jobs WHERE task_name = :task"
                " AND lock = ANY(:locks) AND status IN ('todo', 'doing') GROUP BY status"
            ),
            {"task": TaskName.EMBED_CHUNKS.value, "locks": locks},
        )
        return {status: int(count) for status, count in rows}


async def backlog_of_tenant_a(
    engine: AsyncEngine, settings: Settings, cache: Cache, embedder: HeldEmbedder
) -> list[uuid.UUID]:
    """Tenant A's sessions offloaded, their embedding jobs holding both of the worker's shared
    slots at the embedder and the rest waiting; A's notes written: they need no vector, and do
    not wait for the held embeddings either."""
    tenant_a = await new_caller(engine)
    pks = []
    for s in range(A_SESSIONS):
        sid = f"a-{s}"
        await configure(engine, tenant_a, settings, cache, sid, **FLOOR_OF_TWO)
        await append(engine, tenant_a, settings, cache, sid, tagged_turns(embedder.tag, 0, 14))
        pk = await session_pk(engine, tenant_a.tenant_id, sid)
        async with transaction(engine) as db:
            done = await offload_session(
                db, settings, cache, await tenant_of(db, pk), pk, trigger="test", until_tokens=0
            )
        assert done is not None and done.chunks_written >= 3
        pks.append(pk)
    await wait_for(
        embedder.requests_arrived,
        lambda n: n == 2,
        what="A's embedding jobs to hold both shared slots of the worker",
    )
    for pk in pks:
        await wait_for(
            lambda pk=pk: progress(engine, pk),
            lambda p: p["notes_cover"] == p["offloaded"],
            what="A's notes",
        )
    # (The minute's sweep may queue one more per session.)
    jobs = await embedding_jobs(engine, pks)
    assert jobs["doing"] == 2 and jobs["todo"] >= A_SESSIONS - 2
    return pks


async def session_of_tenant_b_over_its_watermark(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> uuid.UUID:
    """Tenant B's session, its offload queued after A's backlog."""
    tenant_b = await new_caller(engine)
    await configure(engine, tenant_b, settings, cache, "b", **FLOOR_OF_TWO)
    await append(engine, tenant_b, settings, cache, "b", tagged_turns(B_TAG, 0, 14))
    await configure(engine, tenant_b, settings, cache, "b", context_limit=2000, reserve_tokens=500)
    pk = await session_pk(engine, tenant_b.tenant_id, "b")
    async with transaction(engine) as db:
        await enqueue_offload(
            db, SessionKey(await tenant_of(db, pk), pk), trigger="test"
        )  # unless the new limit did
    return pk


def held_worker_env(settings: Settings, url: str, session_slots: int) -> dict[str, str]:
    return worker_env_for(settings, url, f"held-{uuid.uuid4().hex[:8]}", 8) | {
        "CONTEXTD_WORKER__CONCURRENCY": "2",
        "CONTEXTD_WORKER__SESSION_SLOTS": str(session_slots),
        "CONTEXTD_EMBEDDING__BATCH_SIZE": "2",  # several batches per session's chunks
        "CONTEXTD_EMBEDDING__TIMEOUT_SECONDS": "120",  # held, not timed out
    }


async def test_offload_and_notes_run_while_another_tenants_embeddings_hold_the_worker(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """The slot kept for a session's jobs: B's offload and notes are done while A's embedding
    jobs still hold both shared slots and the others wait."""
    embedder = HeldEmbedder()
    with (
        loopback_server(embedder.handle) as provider,
        worker_process(held_worker_env(settings, provider.url, session_slots=1)),
    ):
        try:
            a_pks = await backlog_of_tenant_a(engine, settings, cache, embedder)
            b_pk = await session_of_tenant_b_over_its_watermark(engine, settings, cache)
            b = await wait_for(
                lambda: progress(engine, b_pk),
                lambda p: p["offloads"] >= 1 and p["notes_cover"] == p["offloaded"],
                what="B's offload and notes",
            )
            assert b["offloads"] == 1 and b["offloaded"] > 0
            assert embedder.arrived == 2  # A's two requests, still unanswered
            pending = await embedding_jobs(engine, a_pks)
            assert pending["doing"] == 2 and pending["todo"] >= A_SESSIONS - 2
        finally:
            embedder.answers.release(1000)  # the worker stops once its jobs end


async def test_offload_and_notes_take_a_freed_slot_before_older_embedding_jobs(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """No slot kept (`session_slots` 0): when one embedding batch ends, the freed slot runs B's
    offload and notes before A's embedding jobs queued earlier."""
    embedder = HeldEmbedder()
    with (
        loopback_server(embedder.handle) as provider,
        worker_process(held_worker_env(settings, provider.url, session_slots=0)),
    ):
        try:
            a_pks = await backlog_of_tenant_a(engine, settings, cache, embedder)
            b_pk = await session_of_tenant_b_over_its_watermark(engine, settings, cache)
            assert (await progress(engine, b_pk))["offloads"] == 0  # no slot is free

            # One answer frees one slot; the slot reaches the embedder again after whatever
            # it ran in between.
            embedder.answers.release()
            await wait_for(
                embedder.requests_arrived,
                lambda n: n == 3,
                what="the freed slot to reach A's embedder again",
            )
            b = await progress(engine, b_pk)
            assert b["offloads"] == 1 and b["offloaded"] > 0
            assert b["notes_cover"] == b["offloaded"]
            pending = await embedding_jobs(engine, a_pks)
            assert pending["doing"] == 2 and pending["todo"] >= A_SESSIONS - 2
        finally:
            embedder.answers.release(1000)  # the worker stops once its jobs end


async def test_a_sessions_first_embedding_job_goes_before_another_sessions_backlog(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """One shared slot: A's session has three embedding jobs queued (three offloads), B's
    session one, queued last. Once A's first batch is answered, B's chunks get their vectors
    before A's second job runs."""
    embedder = HeldEmbedder()
    env = held_worker_env(settings, "", session_slots=1) | {
        "CONTEXTD_WORKER__CONCURRENCY": "1",
        "CONTEXTD_EMBEDDING__BATCH_SIZE": "32",  # one batch per offload's job
    }
    with loopback_server(embedder.handle) as provider:
        env["CONTEXTD_EMBEDDING__OPENAI_BASE_URL"] = provider.url
        with worker_process(env):
            try:
                tenant_a = await new_caller(engine)
                await configure(engine, tenant_a, settings, cache, "a", **FLOOR_OF_TWO)
                a_pk = None
                for first in (0, 14, 22):
                    count = 14 if first == 0 else 8
                    turns = tagged_turns(embedder.tag, first, count)
                    await append(engine, tenant_a, settings, cache, "a", turns)
                    a_pk = await session_pk(engine, tenant_a.tenant_id, "a")
                    async with transaction(engine) as db:
                        done = await offload_session(
                            db,
                            settings,
                            cache,
                            await tenant_of(db, a_pk),
                            a_pk,
                            trigger="test",
                            until_tokens=0,
                        )
                    assert done is not None and done.chunks_written >= 1
                assert a_pk is not None
                await wait_for(
                    embedder.requests_arrived,
                    lambda n: n == 1,
                    what="A's first embedding job to hold the shared slot",
                )
                a_jobs = await embedding_jobs(engine, [a_pk])  # (the sweep's may come too)
                assert a_jobs["doing"] == 1 and a_jobs["todo"] >= 2

                tenant_b = await new_caller(engine)
                await configure(engine, tenant_b, settings, cache, "b", **FLOOR_OF_TWO)
                await append(engine, tenant_b, settings, cache, "b", tagged_turns(B_TAG, 0, 14))
                b_pk = await session_pk(engine, tenant_b.tenant_id, "b")
                async with transaction(engine) as db:
                    b_done = await offload_session(
                        db,
                        settings,
                        cache,
                        await tenant_of(db, b_pk),
                        b_pk,
                        trigger="test",
                        until_tokens=0,
                    )
                assert b_done is not None and b_done.chunks_written >= 1

                embedder.answers.release()  # A's first batch
                await wait_for(
                    embedder.requests_arrived,
                    lambda n: n == 2,
                    what="the slot to reach A's embedder again",
                )
                b_chunks = await chunk_states(engine, b_pk)
                assert len(b_chunks) == b_done.chunks_written
                assert not any(c["missing"] for c in b_chunks)
                a_jobs = await embedding_jobs(engine, [a_pk])
                assert a_jobs["doing"] == 1 and a_jobs["todo"] >= 1
            finally:
                embedder.answers.release(1000)  # the worker stops once its jobs end
