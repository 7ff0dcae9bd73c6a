"""Chunk embedding runs in the worker, never in the offload: while the provider is down the chunks
are written, found lexically and retried; once it is back they get their vectors. Meanwhile the
session's notes and offloads go on: they need no vector."""

import asyncio
import hashlib
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.domain.text import lexical_document
from app.jobs.queue import enqueue_offload
from app.offload.service import OffloadResult, offload_session
from app.store.models import SessionKey
from tests.offload.test_offload_service import check_coverage, session_pk
from tests.offload.test_worker import worker_env
from tests.support.factories import append, configure, new_caller, tenant_of, transaction
from tests.support.faults import DIM as FAULTY_DIM
from tests.support.faults import faulty_server
from tests.support.loopback import Handler, closed_port_url, loopback_server
from tests.support.waiting import wait_for
from tests.support.workers import worker_process

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py


def fake_vector(value: str, dim: int) -> list[float]:
    """A deterministic non-zero vector of `dim` floats for a text."""
    digest = hashlib.sha256(value.encode()).digest()
    return [digest[i % len(digest)] / 255 + 0.01 for i in range(dim)]


def embeddings_handler(state: dict[str, Any]) -> Handler:
    """An OpenAI-compatible /v1/embeddings server: 503 while `state["up"]` is false, else
    `state["dim"]`-d vectors."""

    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if not state["up"]:
            return 503, {"error": {"message": "embedding backend unavailable"}}
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(t, state["dim"])}
            for i, t in enumerate(body["input"])
        ]
        return 200, {"object": "list", "data": data, "model": body["model"]}

    return handle


def openai_settings(settings: Settings, url: str, model: str, dim: int) -> Settings:
    return settings.model_copy(
        update={
            "embedding": settings.embedding.model_copy(
                update={
                    "kind": "openai",
                    "openai_base_url": url,
                    "openai_model": model,
                    "openai_dim": dim,
                    "timeout_seconds": 2.0,
                    "batch_size": 4,
                }
            ),
        }
    )


def worker_env_for(settings: Settings, url: str, model: str, dim: int) -> dict[str, str]:
    """A `contextd worker` embedding with the loopback `openai` server."""
    return worker_env(settings) | {
        "CONTEXTD_EMBEDDING__KIND": "openai",
        "CONTEXTD_EMBEDDING__OPENAI_BASE_URL": url,
        "CONTEXTD_EMBEDDING__OPENAI_MODEL": model,
        "CONTEXTD_EMBEDDING__OPENAI_DIM": str(dim),
        "CONTEXTD_EMBEDDING__TIMEOUT_SECONDS": "2",
        "CONTEXTD_EMBEDDING__BATCH_SIZE": "4",
        "CONTEXTD_WORKER__CONCURRENCY": "4",
    }


def tsquery(words: str) -> str:
    """A `to_tsquery('simple', ...)` AND-query over the same terms the chunks are indexed with."""
    return " & ".join(lexical_document(words).split())


async def chunk_states(engine: AsyncEngine, pk: uuid.UUID) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT id, embed_attempts, embedding_model, embedding IS NULL AS missing, "
                "CASE WHEN embedding IS NULL THEN NULL ELSE vector_dims(embedding) END AS dims "
                "FROM chunks WHERE session_id = :s ORDER BY turn_first, part"
            ),
            {"s": pk},
        )
        return [dict(r._mapping) for r in rows]


async def lexical_hits(engine: AsyncEngine, pk: uuid.UUID, words: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT raw_text FROM chunks WHERE session_id = :s AND status = 'active' "
                "AND lexical @@ to_tsquery('simple', :q) ORDER BY turn_first"
            ),
            {"s": pk, "q": tsquery(words)},
        )
        return [r[0] for r in rows]


# All but the last two turns can be offloaded (`until_tokens=0`).
FLOOR_OF_TWO = {"min_recent_turns": 2, "min_recent_tokens": 10}
TURNS = [
    {"role": "user", "content": "Please send invoice INV-77123 to finance@example.com today."},
    {"role": "assistant", "content": "I will email the invoice to finance once it is approved."},
    {"role": "user", "content": "发票抬头写杭州云栖科技有限公司，不要纸质版。"},
    {"role": "assistant", "content": "好的，只开电子发票。"},
    {"role": "user", "content": "The refund for order AB-55810 must not exceed 240 EUR."},
    {"role": "assistant", "content": "Understood, I capped the refund at 240 EUR."},
] + [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"Filler turn {i} about trains."}
    for i in range(6)
]


async def offload_all_but_two(
    engine: AsyncEngine, settings: Settings, cache: Cache, sid: str
) -> tuple[uuid.UUID, OffloadResult]:
    """A new session of `TURNS`, offloaded down to its last two turns (the embedding jobs
    queued)."""
    caller = await new_caller(engine)
    await configure(engine, caller, settings, cache, sid, **FLOOR_OF_TWO)
    await append(engine, caller, settings, cache, sid, TURNS)
    pk = await session_pk(engine, caller.tenant_id, sid)
    async with transaction(engine) as db:
        result = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test", until_tokens=0
        )
    assert result is not None and result.chunks_written >= 1
    return pk, result


async def test_embedding_outage_leaves_chunks_lexical_and_retried_until_embedded(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    state: dict[str, Any] = {"up": False, "dim": 8}
    with loopback_server(embeddings_handler(state)) as provider:
        model = f"loop-embed-8-{uuid.uuid4().hex[:8]}"
        with worker_process(worker_env_for(settings, provider.url, model, 8)):
            # The offload commits with the provider down: it never calls the embedder.
            pk, result = await offload_all_but_two(engine, settings, cache, "embed-outage")
            in_window, chunk_count = await check_coverage(engine, pk)
            assert chunk_count == result.chunks_written
            assert in_window + result.turns_moved == len(TURNS)

            mine = {str(c) for c in result.chunk_ids}
            failed = await wait_for(
                lambda: chunk_states(engine, pk),
                lambda rows: all(r["embed_attempts"] > 0 for r in rows),
                timeout=60,
                what="the worker to try (and fail) to embed the chunks",
            )
            assert {str(r["id"]) for r in failed} == mine
            assert all(r["missing"] and r["embedding_model"] is None for r in failed)
            sent = [b["input"] for m, p, b in provider.requests if p == "/v1/embeddings"]
            assert any("INV-77123" in text for batch in sent for text in batch)

            # Meanwhile every detail is still found lexically (English, IDs and Chinese).
            for words in (
                "invoice INV-77123",
                "AB-55810 refund",
                "发票 纸质版",
                "finance@example.com",
            ):
                hits = await lexical_hits(engine, pk, words)
                assert len(hits) == 1, (words, hits)
            assert "INV-77123" in (await lexical_hits(engine, pk, "INV-77123"))[0]

            # The provider comes back: procrastinate's retry (or the sweeper) embeds them.
            state["up"] = True
            done = await wait_for(
                lambda: chunk_states(engine, pk),
                lambda rows: all(not r["missing"] for r in rows),
                timeout=90,
                interval=0.2,
                what="the retried job to embed the chunks",
            )
    assert all(r["embedding_model"] == model and r["dims"] == 8 for r in done)
    assert all(r["embed_attempts"] >= 1 for r in done)
    async with engine.connect() as conn:
        stored = await conn.scalar(
            text("SELECT embedding::text FROM chunks WHERE id = :c"), {"c": done[0]["id"]}
        )
    norm = sum(float(x) ** 2 for x in stored.strip("[]").split(",")) ** 0.5
    assert abs(norm - 1.0) < 1e-4  # L2-normalised before storage
    for words in ("invoice INV-77123", "发票 纸质版"):
        assert len(await lexical_hits(engine, pk, words)) == 1  # lexical unchanged by embedding


async def transactions_open_since(engine: AsyncEngine, before: Any) -> int:
    """Transactions of the database begun before `before` and still open."""
    async with engine.connect() as conn:
        held = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%' AND xact_start < :t"
            ),
            {"t": before},
        )
    return int(held)


async def test_no_transaction_stays_open_while_the_embedder_works(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """A slow embedder must not hold a transaction: PostgreSQL's idle-in-transaction timeout
    would end the job's connection and the job would retry forever."""
    model = f"hang-embed-{uuid.uuid4().hex[:8]}"
    env = worker_env_for(settings, "", model, FAULTY_DIM)
    with faulty_server("hang") as provider:
        env |= {
            "CONTEXTD_EMBEDDING__OPENAI_BASE_URL": provider.url,
            "CONTEXTD_EMBEDDING__TIMEOUT_SECONDS": "120",  # the encoder works as long as we look
        }
        with worker_process(env):
            pk, result = await offload_all_but_two(engine, settings, cache, "embed-slow")
            assert await asyncio.to_thread(provider.arrived.wait, 60)  # the encoder is working
            async with engine.connect() as conn:
                arrived_at = await conn.scalar(text("SELECT clock_timestamp()"))
            # Other transactions (other jobs, the sweeper) end in milliseconds; one that waits
            # for the embedder would stay open until it answers (here: until released).
            await wait_for(
                lambda: transactions_open_since(engine, arrived_at),
                lambda held: held == 0,
                timeout=30,
                what="transactions begun before the embedder was called to end while it works",
            )
            provider.release.set()
            done = await wait_for(
                lambda: chunk_states(engine, pk),
                lambda rows: all(not r["missing"] for r in rows),
                timeout=90,
                interval=0.2,
                what="the chunks to be embedded once the embedder answers",
            )
    assert {r["embedding_model"] for r in done} == {model}
    assert len(done) == result.chunks_written


def tagged_turns(tag: str, first: int, count: int) -> list[dict[str, Any]]:
    """Turns of 100-200 tokens, English and Chinese in turn, each holding `tag`."""
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{tag} {i}: the refund for order AB-{55800 + i} goes to finance, "
            + "and the train leaves Lyon at nine. " * 12
            if i % 2 == 0
            else f"{tag} {i}：订单AB-{55800 + i}的退款交给财务部，" + "火车九点从里昂出发。" * 12,
        }
        for i in range(first, first + count)
    ]


async def progress(engine: AsyncEngine, pk: uuid.UUID) -> dict[str, int]:
    """The session's offloads so far, the last offloaded seq, and the seq its notes cover."""
    async with engine.connect() as conn:
        row = await conn.execute(
            text(
                "SELECT (SELECT count(*) FROM offload_events WHERE session_id = s.id) AS offloads,"
                " s.offloaded_until_seq AS offloaded,"
                " coalesce((SELECT covers_until_seq FROM scratchpads WHERE session_id = s.id), 0)"
                " AS notes_cover FROM sessions s WHERE s.id = :s"
            ),
            {"s": pk},
        )
        return dict(row.one()._mapping)


async def notes_and_offloads_without_vectors(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    tag: str,
    embedding_tried: Callable[[uuid.UUID], Awaitable[Any]],
) -> None:
    """An offload whose chunks cannot be embedded, then (once the worker has tried) an offload
    job for more turns: both offloads and the notes covering them must be done while none of
    the session's chunks has a vector."""
    caller = await new_caller(engine)
    await configure(engine, caller, settings, cache, tag, **FLOOR_OF_TWO)
    await append(engine, caller, settings, cache, tag, tagged_turns(tag, 0, 14))
    pk = await session_pk(engine, caller.tenant_id, tag)
    async with transaction(engine) as db:
        first = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test", until_tokens=0
        )
    assert first is not None and first.chunks_written >= 1
    await embedding_tried(pk)
    # More turns, and a window that no longer holds them: an offload job for the worker.
    await append(engine, caller, settings, cache, tag, tagged_turns(tag, 14, 8))
    await configure(engine, caller, settings, cache, tag, context_limit=2000, reserve_tokens=500)
    async with transaction(engine) as db:
        await enqueue_offload(
            db, SessionKey(await tenant_of(db, pk), pk), trigger="test"
        )  # unless the new limit enqueued it
    done = await wait_for(
        lambda: progress(engine, pk),
        lambda p: p["offloads"] >= 2 and p["notes_cover"] == p["offloaded"],
        timeout=60,
        interval=0.2,
        what="the offload job and the notes covering both offloads",
    )
    assert done["offloaded"] > first.turns_moved
    chunks = await chunk_states(engine, pk)
    assert len(chunks) > first.chunks_written
    assert all(c["missing"] for c in chunks)


async def test_notes_and_offloads_go_on_while_the_embedder_is_down(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """The embedding job fails and waits for its retry (seconds, then minutes): the session's
    notes and offloads do not wait with it."""
    model = f"down-embed-{uuid.uuid4().hex[:8]}"

    async def failed_once(pk: uuid.UUID) -> None:
        await wait_for(
            lambda: chunk_states(engine, pk),
            lambda rows: any(r["embed_attempts"] > 0 for r in rows),
            timeout=60,
            what="the worker to try (and fail) to embed the first batch of chunks",
        )

    with worker_process(worker_env_for(settings, closed_port_url(), model, 8)):
        await notes_and_offloads_without_vectors(
            engine, settings, cache, "vectors-down", failed_once
        )


async def test_notes_and_offloads_go_on_while_the_embedder_hangs(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """The embedding job waits on an embedder that holds the session's requests: the session's
    notes and offloads do not wait with it."""
    tag = "vectors-held"
    arrived, release = threading.Event(), threading.Event()
    answer = embeddings_handler({"up": True, "dim": 8})

    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if any(tag in text for text in body["input"]):  # other sessions' chunks pass
            arrived.set()
            release.wait(120)
        return answer(method, path, body)

    async def request_held(pk: uuid.UUID) -> None:
        assert await asyncio.to_thread(arrived.wait, 60)

    with loopback_server(handle) as provider:
        model = f"held-embed-{uuid.uuid4().hex[:8]}"
        env = worker_env_for(settings, provider.url, model, 8)
        env["CONTEXTD_EMBEDDING__TIMEOUT_SECONDS"] = "120"  # held until released, not timed out
        with worker_process(env):
            try:
                await notes_and_offloads_without_vectors(engine, settings, cache, tag, request_held)
            finally:
                release.set()  # the worker stops once its running jobs end
