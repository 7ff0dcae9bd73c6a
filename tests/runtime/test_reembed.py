"""`contextd reembed` against the real database and two loopback embedding "models" (8-d, 16-d):
every chunk moves to the new model batch by batch, an interrupted run resumes, and lexical search
works at every step."""

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.context import AppContext
from app.embeddings.base import EmbedderUnavailable
from app.offload.service import offload_session
from app.runtime.cli import build_parser
from app.runtime.reembed import reembed
from tests.offload.test_embedding_jobs import (
    FLOOR_OF_TWO,
    TURNS,
    embeddings_handler,
    lexical_hits,
    openai_settings,
)
from tests.offload.test_offload_service import session_pk
from tests.support.factories import append, configure, new_caller, tenant_of, transaction
from tests.support.loopback import loopback_server

SEARCHES = ("invoice INV-77123", "AB-55810 refund", "发票 纸质版")


async def chunk_models(engine: AsyncEngine, pk: uuid.UUID) -> list[tuple[str | None, int | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT embedding_model, vector_dims(embedding) FROM chunks "
                "WHERE session_id = :s ORDER BY turn_first, part"
            ),
            {"s": pk},
        )
        return [(r[0], r[1]) for r in rows]


async def models_in_database(engine: AsyncEngine) -> dict[str | None, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT embedding_model, count(*) FROM chunks WHERE status = 'active' "
                "GROUP BY embedding_model"
            )
        )
        return {r[0]: r[1] for r in rows}


async def hnsw_index_exists(engine: AsyncEngine, model: str) -> bool:
    async with engine.connect() as conn:
        return bool(
            await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_indexes WHERE tablename = 'chunks' "
                    "AND indexdef LIKE '%USING hnsw%' AND indexdef LIKE :p"
                ),
                {"p": f"%'{model}'%"},
            )
        )


async def lexical_view(engine: AsyncEngine, pk: uuid.UUID) -> dict[str, list[str]]:
    """The chunks each search finds; every search finds at least one."""
    found = {words: await lexical_hits(engine, pk, words) for words in SEARCHES}
    assert all(found.values()), found
    return found


async def run_reembed(settings: Settings, batch_size: int) -> tuple[int, list[str]]:
    lines: list[str] = []
    context = AppContext.create(settings)
    try:
        return await reembed(context, batch_size, progress=lines.append), lines
    finally:
        await context.aclose()


async def test_reembed_moves_every_chunk_to_the_new_model_and_resumes_after_a_failure(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller = await new_caller(engine)
    sid = "reembed"
    await configure(
        engine,
        caller,
        settings,
        cache,
        sid,
        **FLOOR_OF_TWO,
    )
    # Short chunks so that the session alone makes several batches.
    many = [dict(t, content=f"{t['content']} (copy {n})") for n in range(3) for t in TURNS[:6]]
    await append(engine, caller, settings, cache, sid, [*TURNS[:6], *many, *TURNS[6:]])
    pk = await session_pk(engine, caller.tenant_id, sid)
    async with transaction(engine) as db:
        result = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test", until_tokens=0
        )
    assert result is not None and result.chunks_written >= 3
    lexical = await lexical_view(engine, pk)
    assert len(lexical["invoice INV-77123"]) == 4  # the original and its three copies
    tag = uuid.uuid4().hex[:8]
    old, new = f"loop-a-8-{tag}", f"loop-b-16-{tag}"

    # Model A (8-d) embeds everything (this session's chunks and any other active chunk).
    state_a: dict[str, Any] = {"up": True, "dim": 8}
    with loopback_server(embeddings_handler(state_a)) as provider_a:
        written, lines = await run_reembed(openai_settings(settings, provider_a.url, old, 8), 2)
    assert written >= result.chunks_written
    assert lines[0].startswith(f"re-embedding {written} chunks with {old} (8-d)")
    assert lines[-1] == f"done: {written} chunks now embedded with {old}"
    assert await chunk_models(engine, pk) == [(old, 8)] * result.chunks_written
    assert await models_in_database(engine) == {old: written}
    # Recall scans a session's rows exactly: no approximate index is built for a model.
    assert not await hnsw_index_exists(engine, old)

    # Model B (16-d) fails after its first batch: that batch stays written, the rest keep A.
    state_b: dict[str, Any] = {"up": True, "dim": 16}
    calls = {"n": 0}
    handle_b = embeddings_handler(state_b)

    def flaky(method: str, path: str, body: Any) -> tuple[int, Any]:
        calls["n"] += 1
        state_b["up"] = calls["n"] == 1 or state_b.get("fixed", False)
        return handle_b(method, path, body)

    with loopback_server(flaky) as provider_b:
        settings_b = openai_settings(settings, provider_b.url, new, 16)
        with pytest.raises(EmbedderUnavailable):
            await run_reembed(settings_b, 2)
        halfway = await models_in_database(engine)
        assert halfway == {new: 2, old: written - 2}
        assert not await hnsw_index_exists(engine, new)
        models = await chunk_models(engine, pk)
        assert all((m, d) in ((old, 8), (new, 16)) for m, d in models)  # never without a vector
        assert await lexical_view(engine, pk) == lexical

        state_b["fixed"] = True
        resumed, lines = await run_reembed(settings_b, 2)
    assert resumed == written - 2  # only what was left
    assert lines[0].startswith(f"re-embedding {resumed} chunks with {new} (16-d)")
    assert await chunk_models(engine, pk) == [(new, 16)] * result.chunks_written
    assert await models_in_database(engine) == {new: written}
    assert await lexical_view(engine, pk) == lexical

    # Nothing left: a further run writes nothing.
    with loopback_server(embeddings_handler(state_b)) as provider_b:
        again, _ = await run_reembed(openai_settings(settings, provider_b.url, new, 16), 2)
    assert again == 0


async def test_reembed_with_no_embedder_does_nothing(settings: Settings) -> None:
    assert settings.embedding.kind == "none"
    written, lines = await run_reembed(settings, 8)
    assert written == 0
    assert lines == ["embedding kind is 'none': nothing to re-embed"]


def test_cli_has_a_reembed_command() -> None:
    args = build_parser().parse_args(["reembed", "--batch-size", "16"])
    assert (args.command, args.batch_size) == ("reembed", 16)
    assert build_parser().parse_args(["reembed"]).batch_size is None
