"""The sweep leaves a session waiting for its erase job alone: its tombstone forgot every turn
and tombstoned every chunk without touching the counters, which a recount would call drift."""

from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.domain.callers import ALL_SCOPES, Caller
from app.erasure.service import delete_session
from app.offload.sweep import repair_counters
from app.store import sessions as sessions_store
from app.store.chunks import active_chunk_count
from app.store.models import SessionKey
from app.store.sessions import Counters
from tests.support.factories import session_of_key, tenant_of, transaction

SMALL = {
    "context_limit": 2500,
    "reserve_tokens": 200,
    "min_recent_turns": 2,
    "min_recent_tokens": 60,
}


async def test_the_sweep_skips_a_session_waiting_for_its_erase(
    admin: httpx.AsyncClient,
    admin_key: str,
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
) -> None:
    sid = "erase-pending"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: trains " * 20}
        for i in range(12)
    ]
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).is_success
    offload = await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
    assert offload.json()["data"]["chunks_written"] > 0
    pk = await session_of_key(engine, admin_key, sid)
    # Tombstoned without the request's inline erase, and this server runs no worker: the
    # session stays tombstoned, its erase job waiting.
    async with transaction(engine) as db:
        row = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
        assert row is not None
        caller = Caller(row.tenant_id, "admin", frozenset(s.value for s in ALL_SCOPES), None)
        await delete_session(db, caller, settings, cache, sid)

    async with transaction(engine) as db:
        row = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
        assert row is not None and sessions_store.erasing(row)
        stored = Counters(row.c1_tokens, row.c1_turns, row.turn_count, row.chunk_count)
        counted = await sessions_store.recount(db, await tenant_of(db, pk), pk, active_chunk_count)
        assert stored != counted  # what the sweep took for drift
        drifted = await sessions_store.sessions_with_drift(
            db,
            settings.session_defaults,
            active_chunk_count,
            changed_since=datetime.now(UTC) - timedelta(hours=1),
            written_since=datetime.now(UTC) - timedelta(hours=1),
        )
        assert pk not in {key.id for key in drifted}
        over = await sessions_store.sessions_over_watermark(
            db, settings.session_defaults, datetime.now(UTC) - timedelta(hours=1)
        )
        assert pk not in {key.id for key in over}
        assert (
            await repair_counters(db, settings, cache, SessionKey(await tenant_of(db, pk), pk))
            is None
        )
