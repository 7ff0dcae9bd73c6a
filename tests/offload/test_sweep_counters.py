"""Session counters equal a recount of the rows: under appends racing inline offloads, and, when
they drifted anyway, after the worker's sweep repaired them (and logged the drift)."""

import asyncio
import logging
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.jobs.queue import TaskName, enqueue
from app.store import sessions as sessions_store
from app.store.chunks import active_chunk_count
from app.store.models import Session
from app.store.sessions import Counters
from tests.support.factories import session_of_key, tenant_of, transaction
from tests.support.server import run_server
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

SMALL_WINDOW = {
    "context_limit": 3000,
    "reserve_tokens": 200,
    "min_recent_turns": 2,
    "min_recent_tokens": 50,
}


async def stored_and_counted(engine: AsyncEngine, pk: uuid.UUID) -> tuple[Counters, Counters]:
    async with transaction(engine) as db:
        row = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
        assert row is not None
        stored = Counters(row.c1_tokens, row.c1_turns, row.turn_count, row.chunk_count)
        return stored, await sessions_store.recount(
            db, await tenant_of(db, pk), pk, active_chunk_count
        )


def turn(writer: int, i: int) -> dict[str, Any]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"writer {writer} turn {i}: order AB-{writer}{i:03d} ships to Lyon by train, "
        "window seat, budget at most 120 EUR. " * 2,
    }


async def test_appends_racing_inline_offloads_leave_counters_equal_to_a_recount(
    settings: Settings, engine: AsyncEngine, api_key: str
) -> None:
    """Builds load the session without a lock, then offload inline under it: counters written
    from the values loaded before the lock would lose the appends committed in between."""
    acknowledged: list[int] = []
    statuses: list[int] = []
    with run_server(settings) as server:  # no worker: every offload is a build's inline one
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        ) as http:
            assert (await http.put("/v1/sessions/hot", json=SMALL_WINDOW)).status_code == 200

            async def writer(w: int) -> None:
                for i in range(12):
                    resp = await http.post("/v1/sessions/hot/turns", json={"turns": [turn(w, i)]})
                    statuses.append(resp.status_code)
                    if resp.status_code == 201:
                        acknowledged.extend(t["seq"] for t in resp.json()["turns"])

            async def builder(b: int) -> None:
                for i in range(10):
                    # A large system prompt puts the session in the emergency band; one builder
                    # alternates it with a small one, so that its builds write c0 too.
                    system = "You are a travel agent. " * (10 if b == 0 and i % 2 else 300)
                    resp = await http.post(
                        "/v1/sessions/hot/build-prompt",
                        json={"system": system, "query": f"Which order ships by train? {b}.{i}"},
                    )
                    statuses.append(resp.status_code)

            await asyncio.gather(*(writer(w) for w in range(4)), *(builder(b) for b in range(3)))
            turns = (await http.get("/v1/sessions/hot/turns", params={"limit": 500})).json()
    assert all(s < 500 for s in statuses), statuses
    assert sorted(acknowledged) == [t["seq"] for t in turns["turns"]] == list(range(1, 49))
    pk = await session_of_key(engine, api_key, "hot")
    stored, counted = await stored_and_counted(engine, pk)
    assert counted.chunk_count > 0  # the builds did offload inline
    assert stored == counted


async def test_the_sweep_recounts_drifted_counters_and_logs_the_drift(
    settings: Settings, engine: AsyncEngine, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The drift seen in the field (a window of 1,387 tokens / 18 turns stored as 14,847 / 193,
    chunks 317 for 410, the session 'emergency' with offloading disarmed) is repaired."""
    with run_server(settings, with_worker=True) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        ) as http:
            assert (await http.put("/v1/sessions/drift", json=SMALL_WINDOW)).status_code == 200
            for i in range(45):
                resp = await http.post("/v1/sessions/drift/turns", json={"turns": [turn(0, i)]})
                assert resp.status_code == 201
            pk = await session_of_key(engine, api_key, "drift")
            await wait_for(
                lambda: stored_and_counted(engine, pk),
                lambda pair: pair[0] == pair[1] and pair[1].chunk_count > 0,
                what="the worker's offload",
            )
            _, truth = await stored_and_counted(engine, pk)
            async with transaction(engine) as db:
                await db.execute(
                    update(Session)
                    .where(Session.id == pk)
                    .values(c1_tokens=14_847, c1_turns=193, chunk_count=317, offload_armed=False)
                )
            drifted = (await http.get("/v1/sessions/drift")).json()
            assert drifted["watermark"]["level"] == "emergency"

            caplog.set_level(logging.WARNING, logger="contextd.sessions")
            async with transaction(engine) as db:
                await enqueue(db, TaskName.SWEEP, {"timestamp": 0})
            _, counted = await wait_for(
                lambda: stored_and_counted(engine, pk),
                lambda pair: pair[0] == pair[1],
                what="the sweep to repair the counters",
            )
            assert counted == truth
            view = (await http.get("/v1/sessions/drift")).json()
            assert view["watermark"]["level"] == "normal"
            assert view["counts"]["chunks"] == truth.chunk_count
    drift_logs = [r for r in caplog.records if "counters drifted" in r.getMessage()]
    assert len(drift_logs) == 1
    assert drift_logs[0].__dict__["stored"]["c1_tokens"] == 14_847
    assert drift_logs[0].__dict__["counted"] == {
        "c1_tokens": truth.c1_tokens,
        "c1_turns": truth.c1_turns,
        "turn_count": truth.turn_count,
        "chunk_count": truth.chunk_count,
    }
    async with engine.connect() as conn:
        armed = await conn.scalar(
            text("SELECT offload_armed FROM sessions WHERE id = :pk"), {"pk": pk}
        )
    assert armed is True  # below θ again: the trigger re-arms
