"""Every bad input gets a 4xx with the JSON error shape naming the field, and writes nothing."""

from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def tenant_rows(engine: AsyncEngine, tenant: str) -> tuple[int, int]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM turns t JOIN tenants n ON n.id = t.tenant_id "
                    "WHERE n.name = :t), (SELECT count(*) FROM sessions s JOIN tenants n "
                    "ON n.id = s.tenant_id WHERE n.name = :t)"
                ),
                {"t": tenant},
            )
        ).one()
    return int(row[0]), int(row[1])


BIG = "x" * (262_144 + 1)
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

CASES: list[tuple[str, Any, int, str, str | None]] = [
    (
        "unknown role",
        {"turns": [{"role": "wizard", "content": "hi"}]},
        422,
        "invalid_value",
        "turns[0].role",
    ),
    (
        "tool without call id",
        {"turns": [{"role": "tool", "content": "42"}]},
        422,
        "missing_tool_call_id",
        "turns[0].tool_call_id",
    ),
    (
        "tool result without its call",
        {"turns": [{"role": "tool", "tool_call_id": "nope", "content": "42"}]},
        422,
        "unknown_tool_call",
        "turns[0].tool_call_id",
    ),
    (
        "oversize content",
        {"turns": [{"role": "user", "content": BIG}]},
        413,
        "payload_too_large",
        "turns[0].content",
    ),
    (
        "wrong type of content",
        {"turns": [{"role": "user", "content": 12}]},
        422,
        "wrong_type",
        "turns[0].content",
    ),
    ("turns not a list", {"turns": "hello"}, 422, "wrong_type", "turns"),
    ("empty turns", {"turns": []}, 422, "invalid_input", "turns"),
    ("missing turns", {}, 422, "missing_field", "turns"),
    (
        "second turn bad",
        {"turns": [{"role": "user", "content": "ok"}, {"role": "user"}]},
        422,
        "invalid_input",
        "turns[1].content",
    ),
    (
        "tool_calls on a user turn",
        {"turns": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
        422,
        "invalid_input",
        "turns[0].tool_calls",
    ),
]


@pytest.mark.parametrize(
    ("label", "payload", "status", "code", "field"), CASES, ids=[c[0] for c in CASES]
)
async def test_bad_turns_are_rejected_and_nothing_written(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    tenant_name: str,
    label: str,
    payload: Any,
    status: int,
    code: str,
    field: str | None,
) -> None:
    resp = await client.post("/v1/sessions/bad/turns", json=payload)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code
    assert error.get("field") == field
    assert error["message"]
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_malformed_json(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    resp = await client.post(
        "/v1/sessions/bad/turns",
        content=b'{"turns": [{"role": "user", "content": "unterminated}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "malformed_json"
    assert await tenant_rows(engine, tenant_name) == (0, 0)


@pytest.mark.parametrize("session_id", ["has space", "a" * 129, "semi;colon", "中文"])
async def test_bad_session_id(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str, session_id: str
) -> None:
    resp = await client.post(
        f"/v1/sessions/{session_id}/turns", json={"turns": [{"role": "user", "content": "hi"}]}
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "invalid_session_id"
    assert resp.json()["error"]["field"] == "session_id"
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_too_many_turns(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    turns = [{"role": "user", "content": "x"}] * 101
    resp = await client.post("/v1/sessions/bad/turns", json={"turns": turns})
    assert resp.status_code == 413
    assert resp.json()["error"]["field"] == "turns"
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_failure_in_a_later_turn_leaves_earlier_turns_unwritten(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    ok = await client.post(
        "/v1/sessions/half/turns", json={"turns": [{"role": "user", "content": "a"}]}
    )
    assert ok.status_code == 201
    resp = await client.post(
        "/v1/sessions/half/turns",
        json={
            "turns": [
                {"role": "user", "content": "b"},
                {"role": "tool", "tool_call_id": "zz", "content": "c"},
            ]
        },
    )
    assert resp.status_code == 422
    assert await tenant_rows(engine, tenant_name) == (1, 1)


async def test_negative_and_wrong_typed_config(client: httpx.AsyncClient) -> None:
    resp = await client.put("/v1/sessions/cfg", json={"reserve_tokens": -1})
    assert resp.status_code == 422
    assert resp.json()["error"]["field"] == "reserve_tokens"
    resp = await client.put("/v1/sessions/cfg", json={"context_limit": "big"})
    assert resp.status_code == 422
    assert resp.json()["error"] == {
        "code": "wrong_type",
        "message": resp.json()["error"]["message"],
        "field": "context_limit",
    }
