"""Statement and lock timeouts: PostgreSQL bounds every wait of the service's connections.

A session row held by another transaction (`SELECT ... FOR UPDATE` in psql, a stuck client) is
the case the issue saw: an append then waits at most `lock_timeout` and answers 503 with
`Retry-After` (was: waits without bound), and a build that would write the system prompt's size
or offload inline goes on without the write (was: waited, then 500). Each request below is
answered while the lock is still held, so a wait without bound would hang the test."""

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.config import Settings
from app.core.db import create_engine
from tests.support.factories import session_of_key
from tests.support.server import RunningServer, run_server

SMALL = {"context_limit": 2000, "reserve_tokens": 200, "min_recent_turns": 2}


def with_limits(settings: Settings, *, lock: float, inline: float) -> Settings:
    return settings.model_copy(
        update={
            "db": settings.db.model_copy(update={"lock_timeout_seconds": lock}),
            "recall": settings.recall.model_copy(
                update={"emergency_offload_timeout_seconds": inline}
            ),
        }
    )


@pytest.fixture(scope="module")
def short_locks(settings: Settings) -> Iterator[RunningServer]:
    """Appends give up on a held row after 0.5 s."""
    with run_server(with_limits(settings, lock=0.5, inline=0.5)) as server:
        yield server


@pytest.fixture(scope="module")
def long_locks(settings: Settings) -> Iterator[RunningServer]:
    """Engine-wide lock waits of 10 minutes: only the build's own short budget can end a wait."""
    with run_server(with_limits(settings, lock=600, inline=0.5)) as server:
        yield server


async def client(server: RunningServer, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )


@pytest.fixture
async def held(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    async with engine.connect() as conn:
        yield conn
        await conn.rollback()


async def lock_row(conn: AsyncConnection, pk: Any) -> None:
    await conn.execute(text("SELECT 1 FROM sessions WHERE id = :pk FOR UPDATE"), {"pk": pk})


def turns(n: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Turn {i}: order AB-{10000 + i} goes to Lyon by train, window seat. " * 3,
        }
        for i in range(n)
    ]


async def test_every_connection_carries_the_configured_limits(settings: Settings) -> None:
    engine = create_engine(with_limits(settings, lock=1.5, inline=1))
    try:
        async with engine.connect() as conn:
            shown = [
                await conn.scalar(text(f"SHOW {name}"))
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            ]
    finally:
        await engine.dispose()
    assert shown == ["1min", "1500ms", "1min"]


async def test_an_append_on_a_held_session_row_is_a_503_then_succeeds(
    short_locks: RunningServer, engine: AsyncEngine, api_key: str, held: AsyncConnection
) -> None:
    async with await client(short_locks, api_key) as http:
        assert (await http.post("/v1/sessions/held/turns", json={"turns": turns(1)})).is_success
        pk = await session_of_key(engine, api_key, "held")
        await lock_row(held, pk)
        refused = await http.post("/v1/sessions/held/turns", json={"turns": turns(1)})
        listed = await http.get("/v1/sessions/held/turns")  # reads take no row lock
        await held.rollback()
        accepted = await http.post("/v1/sessions/held/turns", json={"turns": turns(1)})
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "unavailable"
    assert refused.headers["Retry-After"]
    assert listed.status_code == 200 and len(listed.json()["turns"]) == 1
    assert accepted.status_code == 201
    assert accepted.json()["turns"][0]["seq"] == 2  # the refused append wrote nothing


async def test_a_build_on_a_held_row_answers_without_its_writes(
    long_locks: RunningServer, engine: AsyncEngine, api_key: str, held: AsyncConnection
) -> None:
    """The build would store a new system prompt size and offload inline; both need the row."""
    async with await client(long_locks, api_key) as http:
        # A window shrunk under its turns: past the emergency ratio (an append that took it
        # there would have offloaded itself).
        large = {**SMALL, "context_limit": 100_000}
        assert (await http.put("/v1/sessions/busy", json=large)).status_code == 200
        assert (await http.post("/v1/sessions/busy/turns", json={"turns": turns(40)})).is_success
        assert (await http.put("/v1/sessions/busy", json=SMALL)).status_code == 200
        assert (await http.get("/v1/sessions/busy")).json()["watermark"]["level"] == "emergency"
        pk = await session_of_key(engine, api_key, "busy")
        await lock_row(held, pk)
        body = {"system": "You are a careful travel agent.", "query": "Which train to Lyon?"}
        blocked = await http.post("/v1/sessions/busy/build-prompt", json=body)
        await held.rollback()
        view = (await http.get("/v1/sessions/busy")).json()
        freed = await http.post("/v1/sessions/busy/build-prompt", json=body)
        after = (await http.get("/v1/sessions/busy")).json()
    assert blocked.status_code == 200, blocked.text
    assert "emergency_offload_failed" in blocked.json()["fallbacks"]
    assert (view["usage"]["c0"], view["counts"]["chunks"]) == (0, 0)  # nothing written
    assert freed.status_code == 200
    assert "emergency_offload_failed" not in freed.json()["fallbacks"]
    assert after["usage"]["c0"] > 0 and after["counts"]["chunks"] > 0
