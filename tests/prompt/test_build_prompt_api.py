"""build-prompt through the real API: the baseline of short sessions, budget errors, manifests."""

import json
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.support.loopback import loopback_server
from tests.support.server import run_server

SYSTEM = "You are a careful travel agent. 回答要简洁。"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a booking",
            "parameters": {"type": "object", "properties": {"ref": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"ref":"X1"}'},
}
TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "Find booking X1 please."},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_7", "content": '{"status": "confirmed"}'},
    {"role": "assistant", "content": "It is confirmed. 已确认。", "name": "agent"},
]


def expected_baseline(listed: list[dict[str, Any]], query: str) -> list[dict[str, Any]]:
    """C0 + every stored turn verbatim + x_t, written out independently of the service."""
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in listed:
        message: dict[str, Any] = {"role": turn["role"], "content": turn["content"]}
        for key in ("name", "tool_calls", "tool_call_id"):
            if turn[key]:
                message[key] = turn[key]
        out.append(message)
    out.append({"role": "user", "content": query})
    return out


async def test_short_session_gets_the_exact_baseline_and_no_embedding_call(
    settings: Settings, api_key: str
) -> None:
    def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
        return 200, {
            "data": [{"index": i, "embedding": [1.0] * 8} for i in range(len(body["input"]))]
        }

    with loopback_server(embeddings) as provider:
        own = settings.model_copy(
            update={
                "embedding": settings.embedding.model_copy(
                    update={"kind": "openai", "openai_base_url": provider.url, "openai_dim": 8}
                )
            }
        )
        with run_server(own) as server:
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}
            ) as http:
                assert (
                    await http.post("/v1/sessions/short/turns", json={"turns": TURNS})
                ).status_code == 201
                query = "Is it refundable? 可以退款吗？"
                built = await http.post(
                    "/v1/sessions/short/build-prompt",
                    json={"system": SYSTEM, "tools": TOOLS, "query": query},
                )
                assert built.status_code == 200, built.text
                body = built.json()
                listed = (await http.get("/v1/sessions/short/turns")).json()["turns"]
        assert provider.requests == []  # no embedding, no search, no rerank
    expected = expected_baseline(listed, query)
    assert json.dumps(body["messages"], ensure_ascii=False) == json.dumps(
        expected, ensure_ascii=False
    )
    assert body["recall"]["skipped_reason"] == "no_history"
    assert body["recall"]["items"] == []
    assert not [k for k in body["timings_ms"] if k.startswith("recall_")]
    assert {m["layer"] for m in body["manifest"]} == {"c0", "c1", "query"}
    assert body["usage"]["c2"] == 0 and body["usage"]["recall"] == 0
    assert body["fallbacks"] == []


async def test_query_that_cannot_fit_is_422_with_figures_and_writes_nothing(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    assert (
        await client.post("/v1/sessions/big/turns", json={"turns": TURNS[:1]})
    ).status_code == 201
    resp = await client.post(
        "/v1/sessions/big/build-prompt",
        json={
            "system": SYSTEM,
            "query": "word " * 3000,
            "append": True,
            "context_limit": 2000,
            "reserve_tokens": 500,
        },
    )
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["code"] == "budget_exceeded"
    assert error["details"]["available"] == 1500
    assert error["details"]["needed"] > 1500
    async with engine.connect() as conn:
        count = await conn.scalar(
            text(
                "SELECT count(*) FROM turns t JOIN tenants n ON n.id = t.tenant_id "
                "WHERE n.name = :t"
            ),
            {"t": tenant_name},
        )
    assert count == 1  # the appended query was rolled back with the failed build


async def test_append_and_persisted_manifest(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/sessions/m/build-prompt",
        json={
            "system": SYSTEM,
            "query": "hello there",
            "append": True,
            "persist_manifest": True,
            "format": "anthropic",
        },
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["system"] == SYSTEM
    assert body["messages"] == [{"role": "user", "content": "hello there"}]
    listed = (await client.get("/v1/sessions/m/turns")).json()["turns"]
    assert [t["content"] for t in listed] == ["hello there"]
    stored = await client.get(f"/v1/sessions/m/builds/{body['build_id']}")
    assert stored.status_code == 200
    assert stored.json()["manifest"] == body["manifest"]
    missing = await client.get("/v1/sessions/m/builds/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404
