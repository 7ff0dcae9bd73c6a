"""An append whose turns take the window to the emergency ratio offloads before it answers (the
worker's job would come after the build that usually follows at once); one that stops in the
offload band leaves the offload to the worker. No worker runs here: what moves, the append moved."""

from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.offload.test_offload_service import check_coverage
from tests.support.factories import session_of_key

SMALL = {"context_limit": 3000, "reserve_tokens": 200, "min_recent_turns": 2}


def turns(n: int, chinese: bool = False) -> list[dict[str, Any]]:
    """Turns of about 40 tokens, English or Chinese."""
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"第{i}轮：订单AB-{10000 + i}坐火车去里昂，靠窗座位，预算不超过120欧元。"
            if chinese
            else f"Turn {i}: order AB-{10000 + i} goes to Lyon by train, window seat, "
            "budget at most 120 EUR.",
        }
        for i in range(n)
    ]


async def offload_triggers(engine: AsyncEngine, api_key: str, sid: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT trigger FROM offload_events WHERE session_id = :s ORDER BY created_at"),
            {"s": await session_of_key(engine, api_key, sid)},
        )
        return [trigger for (trigger,) in rows]


async def fill_to_offload_band(client: httpx.AsyncClient, sid: str, chinese: bool) -> int:
    """Appends that stop in the offload band: the job is enqueued, nothing moves. Returns the
    number of turns stored."""
    assert (await client.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    stored = 0
    while True:
        resp = await client.post(f"/v1/sessions/{sid}/turns", json={"turns": turns(4, chinese)})
        assert resp.status_code == 201, resp.text
        stored += 4
        if resp.json()["watermark"]["level"] == "offload":
            break
        assert resp.json()["watermark"]["level"] == "normal"
    assert resp.json()["offload_enqueued"] is True
    assert (await client.get(f"/v1/sessions/{sid}")).json()["counts"]["chunks"] == 0
    return stored


async def test_an_append_past_the_emergency_ratio_offloads_before_it_answers(
    client: httpx.AsyncClient, engine: AsyncEngine, api_key: str
) -> None:
    for sid, chinese in (("overflow-en", False), ("overflow-zh", True)):
        stored = await fill_to_offload_band(client, sid, chinese)
        assert await offload_triggers(engine, api_key, sid) == []

        resp = await client.post(f"/v1/sessions/{sid}/turns", json={"turns": turns(30, chinese)})
        assert resp.status_code == 201, resp.text
        # The answer says what the turns did to the window ...
        assert resp.json()["watermark"]["level"] == "emergency"
        assert resp.json()["offload_enqueued"] is True
        # ... and by the time it came, the offload had moved the oldest turns.
        view = (await client.get(f"/v1/sessions/{sid}")).json()
        assert view["watermark"]["level"] == "normal" and view["watermark"]["ratio"] <= 0.65
        assert view["counts"]["turns"] == stored + 30
        assert view["counts"]["chunks"] > 0 and view["last_offload_at"] is not None
        assert await offload_triggers(engine, api_key, sid) == ["append"]
        # Every turn is in the window or in exactly one chunk, verbatim.
        in_window, _ = await check_coverage(engine, await session_of_key(engine, api_key, sid))
        assert 2 <= in_window < stored + 30

        # The build that follows finds the window below the emergency ratio: it moves nothing.
        build = await client.post(
            f"/v1/sessions/{sid}/build-prompt", json={"query": "Which order goes to Lyon?"}
        )
        assert build.status_code == 200, build.text
        assert build.json()["watermark"]["level"] == "normal"
        assert not {"window_truncated", "emergency_offload_failed"} & set(build.json()["fallbacks"])
        assert await offload_triggers(engine, api_key, sid) == ["append"]


async def test_a_replayed_emergency_append_writes_and_moves_nothing(
    client: httpx.AsyncClient, engine: AsyncEngine, api_key: str
) -> None:
    sid = "overflow-replay"
    stored = await fill_to_offload_band(client, sid, chinese=False)
    key = {"Idempotency-Key": "overflow-1"}
    body = {"turns": turns(30)}
    first = await client.post(f"/v1/sessions/{sid}/turns", json=body, headers=key)
    assert first.status_code == 201 and first.json()["watermark"]["level"] == "emergency"
    before = (await client.get(f"/v1/sessions/{sid}")).json()

    again = await client.post(f"/v1/sessions/{sid}/turns", json=body, headers=key)
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    after = (await client.get(f"/v1/sessions/{sid}")).json()
    assert after["counts"] == before["counts"] and after["counts"]["turns"] == stored + 30
    assert await offload_triggers(engine, api_key, sid) == ["append"]
