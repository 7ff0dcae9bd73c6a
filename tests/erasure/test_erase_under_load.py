"""A user erase while the user's sessions are appended to and offloaded (by the worker, by the
appends' inline offloads and by the memory tool), against the real PostgreSQL: every erase is
answered 2xx, its receipts complete, nothing of the user is left in any table, no acknowledged
append of another user is lost, and PostgreSQL saw no deadlock."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.runtime.embedded import EmbeddedStack
from tests.support.server import RunningServer
from tests.support.traces import all_text
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

ROUNDS = 5
SESSIONS_PER_USER = 4
# Small windows: a few appends take a session over its watermark (the worker's offload) and to
# the emergency ratio (the append's inline offload).
SMALL = {
    "context_limit": 2500,
    "reserve_tokens": 200,
    "min_recent_turns": 2,
    "min_recent_tokens": 60,
}


def turn(i: int, words: str) -> dict[str, str]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"turn {i}: {words} we compare trains, hotels and flights; option {i} "
        "looks fine, but let us keep looking. " * 3,
    }


@pytest.fixture
async def admin_http(contextd: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=120
    ) as http:
        yield http


def deadlocks_logged(log: Path, since: int) -> list[str]:
    """The `deadlock detected` errors PostgreSQL logged after byte `since` of its log."""
    with log.open("rb") as found:
        found.seek(since)
        lines = found.read().decode("utf-8", "replace").splitlines()
    return [line for line in lines if "deadlock detected" in line]


async def user_rows(engine: AsyncEngine, user: str) -> dict[str, int]:
    async with engine.connect() as conn:
        sessions = await conn.scalar(
            text("SELECT count(*) FROM sessions WHERE user_id = :u"), {"u": user}
        )
        memories = await conn.scalar(
            text("SELECT count(*) FROM memories WHERE user_id = :u"), {"u": user}
        )
    return {"sessions": int(sessions or 0), "memories": int(memories or 0)}


async def prepare_user(http: httpx.AsyncClient, user: str, marker: str) -> list[str]:
    """The user's sessions, each with turns and a remembered item quoting `marker`."""
    sids = [f"s{n}-{uuid.uuid4().hex[:8]}" for n in range(SESSIONS_PER_USER)]
    for sid in sids:
        resp = await http.put(f"/v1/sessions/{sid}", json={**SMALL, "user_id": user})
        assert resp.status_code == 200, resp.text
        turns = [turn(i, f"secret {marker}") for i in range(6)]
        resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
        assert resp.status_code == 201, resp.text
        remember = {"type": "remember", "text": f"Locker {marker} {sid}", "scope": "user"}
        resp = await http.post(f"/v1/sessions/{sid}/memory", json=remember)
        assert resp.status_code == 200, resp.text
    return sids


async def test_a_user_erase_beside_appends_and_offloads_never_deadlocks(
    admin_http: httpx.AsyncClient, engine: AsyncEngine, stack: EmbeddedStack
) -> None:
    http = admin_http
    log_start = stack.postgres_log.stat().st_size
    bystander = f"by-{uuid.uuid4().hex[:8]}"
    assert (await http.put(f"/v1/sessions/{bystander}", json=SMALL)).status_code == 200
    acknowledged: dict[int, str] = {}  # the bystander's seq -> content
    failures: list[str] = []

    async def bystander_appends(stop: asyncio.Event, start: int) -> None:
        i = start
        while not stop.is_set():
            sent = turn(i, "bystander")
            resp = await http.post(f"/v1/sessions/{bystander}/turns", json={"turns": [sent]})
            if resp.status_code == 201:
                acknowledged[resp.json()["turns"][0]["seq"]] = sent["content"]
            else:
                failures.append(f"bystander append {resp.status_code} {resp.text}")
            i += 1

    async def appends(sid: str, stop: asyncio.Event) -> None:
        i = 100
        while not stop.is_set():
            resp = await http.post(
                f"/v1/sessions/{sid}/turns", json={"turns": [turn(i, "load"), turn(i + 1, "load")]}
            )
            if resp.status_code >= 500:
                failures.append(f"append {resp.status_code} {resp.text}")
            i += 2

    async def offloads(sid: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            body = {"type": "offload", "until_tokens": 100}
            resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
            if resp.status_code >= 500:
                failures.append(f"offload {resp.status_code} {resp.text}")

    for round_ in range(ROUNDS):
        user, marker = f"user-{uuid.uuid4().hex[:8]}", f"zx{uuid.uuid4().hex[:10]}"
        sids = await prepare_user(http, user, marker)
        stop = asyncio.Event()
        load = [
            asyncio.create_task(bystander_appends(stop, round_ * 1000)),
            *(asyncio.create_task(appends(sid, stop)) for sid in sids),
            *(asyncio.create_task(offloads(sid, stop)) for sid in sids),
        ]
        # Erase once the load is under way: the sessions are being offloaded meanwhile.
        await wait_for(
            partial(session_chunks, http, sids),
            lambda chunks: chunks > 0,
            what="offloads under way",
        )
        erased = await http.delete(f"/v1/users/{user}")
        stop.set()
        await asyncio.gather(*load)
        assert erased.status_code == 202, erased.text
        body: dict[str, Any] = erased.json()
        assert body["remaining_sessions"] == 0
        assert sorted(s["session_id"] for s in body["sessions"]) == sorted(sids)
        receipts = [r["erase_receipt_id"] for r in [*body["sessions"], *body["memories"]]]
        for receipt_id in receipts:
            await wait_for(
                partial(http.get, f"/v1/erase-receipts/{receipt_id}"),
                lambda r: r.json().get("status") == "completed",
                what="the user's erase receipts",
            )
        assert await user_rows(engine, user) == {"sessions": 0, "memories": 0}
        assert await all_text(engine, marker) == []

    assert failures == []
    listed = await http.get(f"/v1/sessions/{bystander}/turns", params={"limit": 500})
    stored = {t["seq"]: t["content"] for t in listed.json()["turns"]}
    assert stored == acknowledged
    assert deadlocks_logged(stack.postgres_log, log_start) == []


async def session_chunks(http: httpx.AsyncClient, sids: list[str]) -> int:
    total = 0
    for sid in sids:
        resp = await http.get(f"/v1/sessions/{sid}")
        if resp.status_code == 200:
            total += resp.json()["counts"]["chunks"]
    return total
