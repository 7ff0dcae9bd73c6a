"""Recall's one statement for the vector arm and the candidates' rows returns what the exact scan
and a read by id return, and for a caller that holds some of the rows the same scan with only
the other rows (on a real PostgreSQL+pgvector)."""

import uuid

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import driver_connection
from app.store import chunks as chunks_store
from app.store.models import Chunk
from tests.store.test_vector_index import MODEL, add_session, clustered_vectors
from tests.support.factories import tenant_of, transaction


async def test_the_vector_arm_and_the_shown_rows_come_in_one_statement(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    rng = np.random.default_rng(11)
    vectors = clustered_vectors(rng, 120)
    pk = await add_session(engine, settings, cache, "rows", vectors)
    query = [float(x) for x in clustered_vectors(rng, 1)[0]]
    async with transaction(engine) as db:
        rows = (await db.execute(select(Chunk.id, Chunk.raw_text, Chunk.turn_first).where(
            Chunk.session_id == pk))).all()  # fmt: skip
        # the 10 nearest by numpy (unit vectors: the cosine is the dot product)
        similarity = {str(cid): float(vectors[int(raw.split()[1])] @ query) for cid, raw, _ in rows}
        exact = dict(sorted(similarity.items(), key=lambda item: -item[1])[:10])
        others = [str(cid) for cid, _, _ in rows if str(cid) not in exact][:2]
        tenant = await tenant_of(db, pk)
        await chunks_store.tombstone_chunks(db, tenant, [uuid.UUID(others[1])])
    texts = {str(cid): (raw, turn) for cid, raw, turn in rows}

    async with engine.connect() as conn:
        driver = await driver_connection(conn)
        found = await chunks_store.nearest_and_shown(driver, tenant, pk, MODEL, query, 10, others)
        by_id = await chunks_store.nearest_and_shown(driver, tenant, pk, "", None, 10, [others[0]])
        nothing = await chunks_store.nearest_and_shown(driver, tenant, pk, "", None, 10, [])
        held = set(list(exact)[:4])  # rows the caller keeps: only distances come for them
        ids_only = await chunks_store.nearest_and_shown(
            driver, tenant, pk, MODEL, query, 10, others, held
        )
        all_held = await chunks_store.nearest_and_shown(
            driver, tenant, pk, MODEL, query, 10, [], set(exact)
        )

    assert list(found.nearest) == list(exact)  # the exact scan's order
    assert found.nearest == pytest.approx(exact)
    assert set(found.shown) == set(exact) | set(others)
    for cid, chunk in found.shown.items():
        assert chunk.id == cid
        assert (chunk.raw_text, chunk.turn_first) == texts[cid]
    assert found.shown[others[1]].status == "tombstoned"  # shown rows of any status
    assert found.shown[others[0]].status == "active"
    assert by_id.nearest == {} and list(by_id.shown) == [others[0]]
    assert by_id.shown[others[0]] == found.shown[others[0]]
    assert nothing.nearest == {} and nothing.shown == {}
    assert list(ids_only.nearest) == list(found.nearest)  # the same scan, in the same order
    assert ids_only.nearest == found.nearest
    assert set(ids_only.shown) == (set(found.nearest) - held) | set(others)
    assert all(ids_only.shown[cid] == found.shown[cid] for cid in ids_only.shown)
    assert all_held.nearest == found.nearest and all_held.shown == {}
