"""The write path end to end: API appends, a real worker offloads, embeds and writes notes; a
worker killed with SIGKILL mid-offload loses nothing."""

import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from tests.offload.test_offload_service import SMALL, check_coverage, session_pk
from tests.support.factories import append, configure, new_caller
from tests.support.server import run_server
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py


async def test_api_append_triggers_worker_offload_and_notes(
    settings: Settings, api_key: str
) -> None:
    with run_server(settings, with_worker=True) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            assert (await http.put("/v1/sessions/w", json=SMALL)).status_code == 200
            fired = 0
            for i in range(60):
                content = (
                    f"turn {i}: the budget must not exceed {100 + i} EUR for order AB-{10000 + i}. "
                    + "We compare trains, hotels and flights for the trip to Lyon. " * 2
                    if i % 2 == 0
                    else f"第{i}轮：我们决定订酒店，价格不超过{500 + i}元。" * 4
                )
                role = "user" if i % 2 == 0 else "assistant"
                resp = await http.post(
                    "/v1/sessions/w/turns", json={"turns": [{"role": role, "content": content}]}
                )
                fired += resp.json()["offload_enqueued"]
                if resp.json()["offload_enqueued"]:
                    view = await wait_for(
                        lambda: http.get("/v1/sessions/w"),
                        lambda r: r.json()["watermark"]["ratio"] <= 0.65,
                        what="the worker to offload",
                    )
                    assert view.json()["counts"]["chunks"] > 0
            assert fired >= 2
            chunks = (await http.get("/v1/sessions/w/chunks")).json()["chunks"]
            assert chunks and chunks[0]["turn_first"] == 1
            assert all(c["embedded"] is False for c in chunks)  # lexical-only deployment
            one = (await http.get(f"/v1/sessions/w/chunks/{chunks[0]['chunk_id']}")).json()
            assert "turn 0: the budget must not exceed 100 EUR" in one["raw_text"]
            pad = await wait_for(
                lambda: http.get("/v1/sessions/w/scratchpad"),
                lambda r: r.json()["version"] >= 1 and not r.json()["stale"],
                what="notes to be written",
            )
            notes = pad.json()["notes"]
            assert any("must not exceed" in c["text"] for c in notes["constraints"])
            assert pad.json()["covers_until_seq"] >= chunks[-1]["turn_last"]
            turns = (await http.get("/v1/sessions/w/turns", params={"limit": 100})).json()["turns"]
            assert [t["seq"] for t in turns] == list(range(1, 61))
            offloaded = [t for t in turns if t["chunk_id"]]
            assert len(offloaded) >= 1 and len(turns) - len(offloaded) >= SMALL["min_recent_turns"]


def worker_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": settings.database_url or "",
            "REDIS_URL": settings.redis_url or "",
            "CONTEXTD_EMBEDDING__KIND": "none",
            "CONTEXTD_WORKER__HEARTBEAT_SECONDS": "0.5",
            "CONTEXTD_WORKER__STALLED_AFTER_SECONDS": "2",
            "CONTEXTD_WORKER__MAINTENANCE_INTERVAL_SECONDS": "0.5",
            "CONTEXTD_LOG_LEVEL": "WARNING",
        }
    )
    return env


async def counts(engine: AsyncEngine, pk: uuid.UUID) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM turns WHERE session_id = :s) AS turns, "
                    "(SELECT count(*) FROM turns WHERE session_id = :s AND chunk_id IS NOT NULL) "
                    "AS offloaded, (SELECT count(*) FROM chunks WHERE session_id = :s) AS chunks"
                ),
                {"s": pk},
            )
        ).one()
    return dict(row._mapping)


async def offload_writers(engine: AsyncEngine) -> set[int]:
    """Backends in a transaction that has inserted into chunks and is updating turns."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.granted AND l.mode = 'RowExclusiveLock' AND a.pid <> pg_backend_pid() "
                "AND l.relation IN ('chunks'::regclass, 'turns'::regclass) "
                "GROUP BY l.pid HAVING count(DISTINCT l.relation) = 2"
            )
        )
        return {pid for (pid,) in rows}


async def test_worker_killed_mid_offload_loses_nothing(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller = await new_caller(engine)
    sid = "kill"
    await configure(engine, caller, settings, cache, sid, context_limit=10_000_000)
    total = 6_000
    for start in range(0, total, 100):
        batch = [
            {
                "role": "user",
                "content": f"turn {start + i}: keep the receipt R-{start + i:05d} " * 4,
            }
            for i in range(100)
        ]
        await append(engine, caller, settings, cache, sid, batch)
    await configure(engine, caller, settings, cache, sid, context_limit=8_000, reserve_tokens=500)
    trigger = await append(
        engine, caller, settings, cache, sid, [{"role": "user", "content": "go"}]
    )
    assert trigger["offload_enqueued"] is True
    pk = await session_pk(engine, caller.tenant_id, sid)

    worker = subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "worker"], env=worker_env(settings)
    )
    try:
        # Kill only once the offload has written: its transaction holds chunks it inserted and
        # turns it is marking (row locks taken by those writes), none of it committed.
        await wait_for(
            lambda: offload_writers(engine),
            lambda pids: bool(pids),
            timeout=120,
            interval=0.01,
            what="the offload to write chunks and mark turns",
        )
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    killed = await counts(engine, pk)
    assert killed == {"turns": total + 1, "offloaded": 0, "chunks": 0}, "offload was not atomic"

    restarted = subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "worker"], env=worker_env(settings)
    )
    try:
        await wait_for(
            lambda: counts(engine, pk),
            lambda c: c["offloaded"] > 0,
            timeout=120,
            interval=0.2,
            what="the stalled offload to be retried",
        )
    finally:
        restarted.send_signal(signal.SIGINT)
        try:
            restarted.wait(timeout=20)
        except subprocess.TimeoutExpired:
            restarted.kill()
    in_window, chunks = await check_coverage(engine, pk)
    done = await counts(engine, pk)
    assert done["turns"] == total + 1
    assert done["offloaded"] + in_window == total + 1
    assert chunks == done["chunks"] > 0
    async with engine.connect() as conn:
        c1, limit = (
            await conn.execute(
                text("SELECT c1_tokens, 8000 - 500 FROM sessions WHERE id = :s"), {"s": pk}
            )
        ).one()
    assert c1 / limit <= 0.65
