"""A large session's own HNSW index: built by the worker's sweep, used by recall's vector arm, and
returning what the exact scan returns (on a real PostgreSQL+pgvector)."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import driver_connection
from app.embeddings.base import vector_literal
from app.store import chunks as chunks_store
from app.store import vector_index as vector_index_store
from tests.offload.test_offload_service import session_pk
from tests.support.factories import configure, new_caller, tenant_of, transaction

OWN_DATABASE = True  # it drops every session index it finds stale: see tests/conftest.py
MODEL = "test-e5"
DIM = 32
CHUNKS = 400


def clustered_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit vectors around 25 centres sharing a common direction, as sentence embeddings do."""
    common = rng.standard_normal(DIM)
    centres = rng.standard_normal((25, DIM)) + 2 * common
    vectors = centres[rng.integers(0, 25, n)] + 0.6 * rng.standard_normal((n, DIM))
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def add_session(
    engine: AsyncEngine, settings: Settings, cache: Cache, sid: str, vectors: np.ndarray
) -> uuid.UUID:
    caller = await new_caller(engine)
    await configure(engine, caller, settings, cache, sid)
    pk = await session_pk(engine, caller.tenant_id, sid)
    rows = [
        {
            "tenant": caller.tenant_id,
            "session": pk,
            "turn": 2 * i + 1,
            "text": f"chunk {i}",
            "vector": vector_literal(v),
        }
        for i, v in enumerate(vectors)
    ]
    async with transaction(engine) as db:
        await db.execute(
            text(
                "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last, part, "
                "parts, roles, ts_first, ts_last, raw_text, token_count, term_counts, term_total, "
                "lexical, embedding, embedding_model) VALUES (gen_random_uuid(), :tenant, "
                ":session, :turn, :turn, 1, 1, '{user}', now(), now(), :text, 3, '{}', 0, "
                "to_tsvector('simple', :text), "
                f"CAST(:vector AS vector), '{MODEL}')"
            ),
            rows,
        )
        await db.execute(
            text("UPDATE sessions SET chunk_count = :n WHERE id = :s"), {"n": len(rows), "s": pk}
        )
    return pk


async def exact_scan(
    driver: Any, tenant: uuid.UUID, pk: uuid.UUID, query: list[float]
) -> dict[str, float]:
    """The session's 10 nearest chunks by the exact scan recall runs in PostgreSQL."""
    return (await chunks_store.nearest_and_shown(driver, tenant, pk, MODEL, query, 10, [])).nearest


@pytest.fixture
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    async with engine.connect() as conn:
        yield await conn.execution_options(isolation_level="AUTOCOMMIT")


async def index_scans(autocommit: AsyncConnection, name: str) -> int:
    found = await autocommit.execute(
        text("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = :n"), {"n": name}
    )
    return int(found.scalar_one())


async def test_a_large_session_is_searched_through_its_own_index_with_the_exact_top_hits(
    engine: AsyncEngine, settings: Settings, cache: Cache, autocommit: AsyncConnection
) -> None:
    rng = np.random.default_rng(7)
    vectors = clustered_vectors(rng, CHUNKS)
    # Another session's vectors of the same model, close to the same queries: never returned.
    other = await add_session(engine, settings, cache, "other", vectors + 1e-3)
    # Statistics taken before the large session existed: the planner believes it holds ~1 row
    # and would rather sort it than use its index.
    await autocommit.execute(text("ANALYZE chunks"))
    pk = await add_session(engine, settings, cache, "large", vectors)
    name = vector_index_store.vector_index_name(pk, MODEL)

    assert pk in await vector_index_store.sessions_needing_vector_index(autocommit, MODEL, CHUNKS)
    assert other in await vector_index_store.sessions_needing_vector_index(
        autocommit, MODEL, CHUNKS
    )
    assert await vector_index_store.ensure_vector_index(autocommit, pk, MODEL, DIM, 64)
    assert not await vector_index_store.ensure_vector_index(
        autocommit, pk, MODEL, DIM, 64
    )  # built once
    needing = await vector_index_store.sessions_needing_vector_index(autocommit, MODEL, CHUNKS)
    assert pk not in needing and other in needing
    scans_before = await index_scans(autocommit, name)

    async with transaction(engine) as db:
        tenant = await tenant_of(db, pk)
    index = vector_index_store.VectorIndexScan(DIM, 100)
    queries = vectors[rng.integers(0, CHUNKS, 12)] + 0.2 * rng.standard_normal((12, DIM))
    driver = await driver_connection(autocommit)  # as the reader pool's: autocommit
    for query in queries:
        exact = await exact_scan(driver, tenant, pk, list(query))
        found = await vector_index_store.nearest_through_index(
            driver, tenant, pk, MODEL, list(query), 10, index
        )
        approximate = found.nearest
        assert list(found.shown) == list(approximate)  # the rows come with the search
        assert all(found.shown[cid].raw_text.startswith("chunk ") for cid in approximate)
        assert list(approximate) == list(exact)
        assert [round(s, 5) for s in approximate.values()] == [round(s, 5) for s in exact.values()]
    # The search's settings were local to its own transaction.
    setting = await driver.execute("SELECT current_setting('enable_sort')")
    assert await setting.fetchone() == ("on",)
    await driver.execute("SELECT pg_stat_force_next_flush()")
    # Every approximate search went through the index, none of the exact ones.
    assert await index_scans(autocommit, name) - scans_before == len(queries)

    # A forgotten chunk leaves the index's rows with its status: it is never returned again.
    query = list(queries[0])
    found = await vector_index_store.nearest_through_index(
        driver, tenant, pk, MODEL, query, 10, index
    )
    best = next(iter(found.nearest))
    async with transaction(engine) as db:
        await chunks_store.tombstone_chunks(db, tenant, [uuid.UUID(best)])
    after = (
        await vector_index_store.nearest_through_index(driver, tenant, pk, MODEL, query, 10, index)
    ).nearest
    assert best not in after and len(after) == 10
    assert list(after) == list(await exact_scan(driver, tenant, pk, query))


async def test_indexes_of_deleted_sessions_and_of_other_models_are_dropped(
    engine: AsyncEngine, settings: Settings, cache: Cache, autocommit: AsyncConnection
) -> None:
    rng = np.random.default_rng(8)
    kept = await add_session(engine, settings, cache, "kept", clustered_vectors(rng, 50))
    deleted = await add_session(engine, settings, cache, "deleted", clustered_vectors(rng, 50))
    for pk, model in ((kept, MODEL), (kept, "older-model"), (deleted, MODEL)):
        assert await vector_index_store.ensure_vector_index(autocommit, pk, model, DIM, 64)
    await autocommit.execute(text("DELETE FROM sessions WHERE id = :s"), {"s": deleted})

    dropped = await vector_index_store.drop_stale_vector_indexes(autocommit, MODEL)
    assert sorted(dropped) == sorted(
        [
            vector_index_store.vector_index_name(kept, "older-model"),
            vector_index_store.vector_index_name(deleted, MODEL),
        ]
    )
    left = await autocommit.execute(
        text("SELECT indexname FROM pg_indexes WHERE starts_with(indexname, :p)"),
        {"p": vector_index_store.VECTOR_INDEX_PREFIX},
    )
    names = set(left.scalars())
    assert vector_index_store.vector_index_name(kept, MODEL) in names
    assert not names & set(dropped)
    assert await vector_index_store.drop_stale_vector_indexes(autocommit, MODEL) == []


async def test_an_interrupted_build_is_dropped_and_built_again(
    engine: AsyncEngine, settings: Settings, cache: Cache, autocommit: AsyncConnection
) -> None:
    pk = await add_session(
        engine, settings, cache, "interrupted", clustered_vectors(np.random.default_rng(9), 50)
    )
    name = vector_index_store.vector_index_name(pk, MODEL)
    assert await vector_index_store.ensure_vector_index(autocommit, pk, MODEL, DIM, 64)
    # What a cancelled CREATE INDEX CONCURRENTLY leaves behind: the index, marked invalid.
    await autocommit.execute(
        text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(:n)"),
        {"n": name},
    )
    assert pk in await vector_index_store.sessions_needing_vector_index(autocommit, MODEL, 50)
    # While a build holds the lock (elsewhere), an invalid index may be that build's: untouched.
    async with engine.connect() as other:
        builder = await other.execution_options(isolation_level="AUTOCOMMIT")
        key = {"key": vector_index_store.VECTOR_INDEX_BUILD_LOCK}
        await builder.execute(text("SELECT pg_advisory_lock(:key)"), key)
        assert not await vector_index_store.ensure_vector_index(autocommit, pk, MODEL, DIM, 64)
        await builder.execute(text("SELECT pg_advisory_unlock(:key)"), key)
    valid = await autocommit.execute(
        text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)"), {"n": name}
    )
    assert valid.scalar_one() is False
    assert await vector_index_store.ensure_vector_index(autocommit, pk, MODEL, DIM, 64)
    valid = await autocommit.execute(
        text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:n)"), {"n": name}
    )
    assert valid.scalar_one() is True
