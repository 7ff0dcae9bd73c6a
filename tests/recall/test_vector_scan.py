"""The vector arm's exact scan in process (`app.recall.vectors`): the same nearest chunks as
PostgreSQL's exact scan, the vectors read back as stored, and through the API the same builds as
the scan in PostgreSQL and as the search through the session's own HNSW index, with chunks
embedded after the first build joining the scan, in English and Chinese (a real embeddings server
on loopback, the worker embedding the chunks)."""

import hashlib
import math
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import driver_connection
from app.embeddings.base import vector_literal
from app.recall.vectors import ChunkVectors
from app.store import chunks as chunks_store
from app.store import vector_index as vector_index_store
from app.store.models import Chunk
from tests.prompt.test_recall_needles import filler, load, offloaded, recalled_block
from tests.recall.test_kept_rows import DIM, bag_of_terms
from tests.recall.test_shown_lines import same_build
from tests.store.test_vector_index import MODEL, add_session, clustered_vectors
from tests.support.factories import tenant_of, transaction
from tests.support.loopback import loopback_server, with_openai_embedder
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py


def test_the_scan_returns_the_nearest_best_first_with_ties_by_id() -> None:
    rng = np.random.default_rng(3)
    vectors = {f"c{i:03d}": rng.standard_normal(16) * (1 + i % 3) for i in range(200)}
    vectors["twin-b"] = vectors["twin-a"] = rng.standard_normal(16)
    held = ChunkVectors("m").with_vectors(vectors)
    query = vectors["twin-a"] + 0.01 * rng.standard_normal(16)

    found = held.nearest(query, 5)

    units = {cid: v / np.linalg.norm(v) for cid, v in vectors.items()}
    q = query / np.linalg.norm(query)
    expected = sorted(units, key=lambda cid: (-float(units[cid] @ q), cid))[:5]
    assert list(found) == expected
    assert list(found)[:2] == ["twin-a", "twin-b"]  # equal vectors: by id
    assert found == pytest.approx({cid: float(units[cid] @ q) for cid in expected}, abs=1e-6)
    assert len(held.nearest(query, 1_000)) == 202
    assert held.nearest(np.zeros(16), 5) == {} and ChunkVectors("m").nearest(query, 5) == {}


def test_vectors_are_added_once_and_dropped_with_their_chunks() -> None:
    rng = np.random.default_rng(5)
    first = {f"a{i}": rng.standard_normal(8) for i in range(4)}
    held = ChunkVectors("m").with_vectors(first)
    assert held.with_vectors({"a0": rng.standard_normal(8)}) is held  # a vector never changes
    grown = held.with_vectors({"b": rng.standard_normal(8), "zero": np.zeros(8)})
    assert grown.ids == ("a0", "a1", "a2", "a3", "b", "zero") and grown.held == set(grown.ids)
    assert grown.units.shape == (6, 8) and grown.nbytes == 6 * 8 * 4
    assert np.allclose(np.linalg.norm(grown.units[:5], axis=1), 1.0)
    assert not grown.units[5].any()  # no direction: never nearer than a real vector
    assert list(grown.nearest(first["a2"], 1)) == ["a2"]

    kept = grown.kept_for({"a1", "b", "zero"})
    assert kept.ids == ("a1", "b", "zero") and kept.held == {"a1", "b", "zero"}
    assert np.array_equal(kept.units, grown.units[[1, 4, 5]])
    assert grown.kept_for(set(grown.ids)) is grown


async def test_the_vectors_read_back_and_the_scan_in_process_equals_the_scan_in_postgres(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    rng = np.random.default_rng(17)
    stored = clustered_vectors(rng, 300)
    pk = await add_session(engine, settings, cache, "scan-in-process", stored)
    async with transaction(engine) as db:
        tenant = await tenant_of(db, pk)
        rows = await db.execute(select(Chunk.id, Chunk.raw_text).where(Chunk.session_id == pk))
        text_of = {str(cid): raw for cid, raw in rows}
    ids = list(text_of)
    async with engine.connect() as conn:
        driver = await driver_connection(conn)
        read = await chunks_store.chunk_vectors(driver, tenant, pk, MODEL, ids)
        other_model = await chunks_store.chunk_vectors(driver, tenant, pk, "another-model", ids)
    assert other_model == {}
    assert set(read) == set(ids)
    by_text = {f"chunk {i}": v for i, v in enumerate(stored)}
    for cid, vector in read.items():
        assert vector.dtype == np.float32
        assert np.allclose(vector, by_text[text_of[cid]], atol=1e-6)  # as stored (float32)

    held = ChunkVectors(MODEL).with_vectors(read)
    for query in clustered_vectors(rng, 5):
        async with engine.connect() as conn:
            driver = await driver_connection(conn)
            scanned = await chunks_store.nearest_and_shown(
                driver, tenant, pk, MODEL, list(query), 30, []
            )
        in_postgres = scanned.nearest
        in_process = held.nearest(query, 30)
        assert list(in_process) == list(in_postgres)
        assert in_process == pytest.approx(in_postgres, abs=1e-6)


def same_but_rounding(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same build, but for scores in their last (sixth) decimal: numpy sums a dot product in
    another order than pgvector does, so a cosine may differ in its last float32 bits."""

    def scores(value: Any, found: list[float]) -> Any:
        if isinstance(value, dict):
            return {
                k: found.append(v) or None
                if k == "score" and isinstance(v, float)
                else scores(v, found)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [scores(v, found) for v in value]
        return value

    a_scores: list[float] = []
    b_scores: list[float] = []
    return same_build(scores(a, a_scores), scores(b, b_scores)) and a_scores == pytest.approx(
        b_scores, abs=2e-6
    )


# A loopback embedder that knows two synonyms in each language, so that only the vector arm can
# find the one from the other: the lexical arms share no term between them.
SYNONYMS = {"aubergine": "eggplant", "矮瓜": "茄子"}


def synonym_vector(text: str) -> list[float]:
    """`bag_of_terms` of the text with each synonym written as the other word, turned towards an
    axis of its own when it holds that word."""
    for word, same in SYNONYMS.items():
        text = text.replace(word, same)
    vector = bag_of_terms(text)
    for word in SYNONYMS.values():
        if word in text:
            vector = [x / 10 for x in vector]
            vector[(hashlib.sha1(word.encode()).digest()[0] + 1) % DIM] += 5.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
    data = [{"index": i, "embedding": synonym_vector(t)} for i, t in enumerate(body["input"])]
    return 200, {"data": data}


@pytest.mark.parametrize(
    ("lang", "late", "query"),
    [
        ("en", "I grilled the aubergine with miso last night.", "eggplant?"),
        ("zh", "昨晚我用味噌烤了矮瓜。", "茄子？"),
    ],
)
async def test_builds_scanned_in_process_equal_those_scanned_in_postgres_and_see_new_vectors(
    engine: AsyncEngine, settings: Settings, admin_key: str, lang: str, late: str, query: str
) -> None:
    sid = f"vector-scan-{lang}"
    headers = {"Authorization": f"Bearer {admin_key}"}
    with loopback_server(embeddings) as embedder:
        api_settings = with_openai_embedder(settings, embedder.url)

        def recall_with(**changed: Any) -> Settings:
            return api_settings.model_copy(
                update={"recall": api_settings.recall.model_copy(update=changed)}
            )

        with (
            run_server(api_settings, with_worker=True) as api,
            run_server(recall_with(vector_scan_in_process_mb=0)) as scanned_in_postgres,
            run_server(recall_with(vector_index_min_chunks=1)) as through_index,
        ):
            async with (
                httpx.AsyncClient(base_url=api.url, headers=headers, timeout=60) as http,
                httpx.AsyncClient(
                    base_url=scanned_in_postgres.url, headers=headers, timeout=60
                ) as pg_http,
                httpx.AsyncClient(
                    base_url=through_index.url, headers=headers, timeout=60
                ) as index_http,
            ):

                async def build(client: httpx.AsyncClient) -> dict[str, Any]:
                    resp = await client.post(
                        f"/v1/sessions/{sid}/build-prompt", json={"query": query}
                    )
                    assert resp.status_code == 200, resp.text
                    body: dict[str, Any] = resp.json()
                    assert "vector_unavailable" not in body["fallbacks"]
                    return body

                async def offload_all() -> None:
                    moved = await http.post(
                        f"/v1/sessions/{sid}/memory",
                        json={"type": "offload", "until_tokens": 1},
                    )
                    assert moved.status_code == 200, moved.text
                    await offloaded(http, sid, embedded=True)

                await load(http, sid, filler(lang, 60, seed=9))
                await offload_all()
                before = await build(http)  # every vector read and held in this process
                assert late not in recalled_block(before)
                assert same_but_rounding(before, await build(pg_http))

                await load(http, sid, [("user", late), *filler(lang, 30, seed=10)])
                await offload_all()
                after = await build(http)  # the new chunks' vectors read, the others held
                assert late in recalled_block(after), after["recall"]
                assert same_but_rounding(after, await build(pg_http))
                assert same_build(after, await build(http))  # all held now

                # Through the session's own HNSW index (built here as the worker's sweep would
                # for a large session), rows read with the search: the same build.
                async with engine.connect() as conn:
                    autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    pk, model = (
                        await autocommit.execute(
                            text(
                                "SELECT c.session_id, c.embedding_model FROM chunks c "
                                "JOIN sessions s ON s.id = c.session_id "
                                "WHERE s.external_id = :sid LIMIT 1"
                            ),
                            {"sid": sid},
                        )
                    ).one()
                    assert await vector_index_store.ensure_vector_index(
                        autocommit, pk, model, DIM, 64
                    )
                assert same_but_rounding(after, await build(index_http))

                # Held vectors are not read again (a chunk's vector never changes): rewritten
                # behind the servers' backs, the scan in PostgreSQL sees it, this one does not.
                async with transaction(engine) as db:
                    await db.execute(
                        text(
                            "UPDATE chunks SET embedding = CAST(:v AS vector) FROM sessions s "
                            "WHERE s.id = chunks.session_id AND s.external_id = :sid"
                        ),
                        {"v": vector_literal([1.0] + [0.0] * (DIM - 1)), "sid": sid},
                    )
                assert same_build(after, await build(http))
                assert not same_but_rounding(after, await build(pg_http))
