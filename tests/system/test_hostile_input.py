"""Input no store can hold, or that asks for absurd amounts, gets a JSON 4xx naming the field and
writes nothing: NUL and lone surrogates in every text field, over-deep JSON, oversized metadata and
tool calls, bodies that are not UTF-8, out-of-range numbers, a second result for one tool call."""

import json
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.sessions.test_bad_input import tenant_rows
from tests.support.server import RunningServer

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def raw(payload: Any, bad: str) -> bytes:
    """`payload` as JSON text with the marker string "BAD" replaced by the escape `bad`."""
    return json.dumps(payload).replace("BAD", bad).encode()


TEXT_FIELDS: list[tuple[str, str, Any, str]] = [
    ("content", "turns", {"turns": [{"role": "user", "content": "aBADz"}]}, "turns[0].content"),
    (
        "metadata value",
        "turns",
        {"turns": [{"role": "user", "content": "x", "metadata": {"note": "BAD"}}]},
        "turns[0].metadata.note",
    ),
    (
        "metadata key",
        "turns",
        {"turns": [{"role": "user", "content": "x", "metadata": {"kBAD": 1}}]},
        "turns[0].metadata.<key>",
    ),
    (
        "name",
        "turns",
        {"turns": [{"role": "user", "content": "x", "name": "bBADb"}]},
        "turns[0].name",
    ),
    (
        "tool call arguments",
        "turns",
        {
            "turns": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "BAD"}}],
                }
            ]
        },
        "turns[0].tool_calls[0].function.arguments",
    ),
    ("appended query", "build-prompt", {"query": "BAD", "append": True}, "query"),
    ("query", "build-prompt", {"query": "where BAD"}, "query"),
    ("system prompt", "build-prompt", {"system": "You are BAD", "query": "hi"}, "system"),
    (
        "system message",
        "build-prompt",
        {"system": [{"role": "system", "content": "ok"}, {"content": "BAD"}], "query": "hi"},
        "system[1].content",
    ),
    ("remember text", "memory", {"type": "remember", "text": "keep BAD"}, "text"),
    ("recall query", "memory", {"type": "recall", "query": "BAD"}, "query"),
    ("session metadata", "", {"metadata": {"owner": "BAD"}}, "metadata.owner"),
]


@pytest.mark.parametrize("bad", ["\\u0000", "\\ud800", "\\udfff"])
@pytest.mark.parametrize(
    ("label", "path", "payload", "field"), TEXT_FIELDS, ids=[c[0] for c in TEXT_FIELDS]
)
async def test_nul_and_lone_surrogates_are_refused_naming_the_field(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    tenant_name: str,
    bad: str,
    label: str,
    path: str,
    payload: Any,
    field: str,
) -> None:
    if path == "memory":  # the memory tool needs an existing session
        made = await client.post(
            "/v1/sessions/s/turns", json={"turns": [{"role": "user", "content": "hi"}]}
        )
        assert made.status_code == 201
    before = await tenant_rows(engine, tenant_name)
    url = f"/v1/sessions/s/{path}" if path else "/v1/sessions/s"
    method = "PUT" if not path else "POST"
    resp = await client.request(
        method, url, content=raw(payload, bad), headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_text", field)
    assert await tenant_rows(engine, tenant_name) == before


async def test_a_surrogate_pair_is_ordinary_text(client: httpx.AsyncClient) -> None:
    payload = raw({"turns": [{"role": "user", "content": "smile BAD"}]}, "\\ud83d\\ude00")
    resp = await client.post(
        "/v1/sessions/pair/turns", content=payload, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 201, resp.text
    listed = await client.get("/v1/sessions/pair/turns")
    assert listed.json()["turns"][0]["content"] == "smile 😀"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


async def test_over_deep_metadata_is_refused(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    deep = {"turns": [{"role": "user", "content": "x", "metadata": nested(40)}]}
    resp = await client.post("/v1/sessions/deep/turns", json=deep)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["code"] == "too_deep"
    assert error["field"].startswith("turns[0].metadata.n.n")
    assert await tenant_rows(engine, tenant_name) == (0, 0)
    ok = {"turns": [{"role": "user", "content": "x", "metadata": nested(20)}]}
    assert (await client.post("/v1/sessions/deep/turns", json=ok)).status_code == 201


async def test_metadata_and_tool_calls_count_against_the_turn_limits(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    big_meta = {"turns": [{"role": "user", "content": "hi", "metadata": {"blob": "m" * 20_000}}]}
    resp = await client.post("/v1/sessions/big/turns", json=big_meta)
    assert resp.status_code == 413
    assert resp.json()["error"] == {
        "code": "payload_too_large",
        "message": resp.json()["error"]["message"],
        "field": "turns[0].metadata",
    }
    arguments = json.dumps({"blob": "a" * 300_000})
    big_call = {
        "turns": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": arguments}}],
            }
        ]
    }
    resp = await client.post("/v1/sessions/big/turns", json=big_call)
    assert resp.status_code == 413
    assert resp.json()["error"]["field"] == "turns[0].tool_calls"
    resp = await client.put("/v1/sessions/big", json={"metadata": {"blob": "m" * 20_000}})
    assert resp.status_code == 413
    assert resp.json()["error"]["field"] == "metadata"
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_a_body_over_the_limit_is_refused_before_it_is_read(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    turns = [{"role": "user", "content": "x" * 200_000} for _ in range(25)]  # 5 MB > 4 MiB
    resp = await client.post("/v1/sessions/huge/turns", json={"turns": turns})
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "payload_too_large"
    assert await tenant_rows(engine, tenant_name) == (0, 0)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/sessions/u/turns"),
        ("POST", "/v1/sessions/u/build-prompt"),
        ("POST", "/v1/sessions/u/memory"),
        ("PUT", "/v1/sessions/u"),
    ],
)
async def test_a_body_that_is_not_utf8_is_a_documented_422(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    resp = await client.request(
        method, path, content=b'{"turns": "\xff\xfe"}', headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "malformed_json"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PATCH", "/v1/sessions/s", "DELETE, GET, PUT"),
        ("DELETE", "/v1/sessions/s/turns", "GET, POST"),
        ("POST", "/healthz", "GET"),
        ("GET", "/v1/sessions/s/build-prompt", "POST"),
    ],
)
async def test_405_names_the_allowed_methods(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    resp = await client.request(method, path)
    assert resp.status_code == 405
    assert resp.headers["allow"] == allow
    assert resp.json()["error"]["code"] == "method_not_allowed"


def cursor(*values: int) -> str:
    return ".".join(str(v) for v in values)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/sessions/n/turns?since_seq=9223372036854775808", "since_seq"),
        (f"/v1/sessions/n/turns?cursor={cursor(10**30)}", "cursor"),
        (f"/v1/sessions/n/chunks?cursor={cursor(1, 10**30)}", "cursor"),
        (f"/v1/sessions/n/chunks?cursor={cursor(10**19, 1)}", "cursor"),
        (f"/v1/sessions/n/chunks?cursor={cursor(1, 58405018903)}", "cursor"),
    ],
)
async def test_numbers_past_the_stored_range_are_a_422(
    client: httpx.AsyncClient, path: str, field: str
) -> None:
    made = await client.post(
        "/v1/sessions/n/turns", json={"turns": [{"role": "user", "content": "hi"}]}
    )
    assert made.status_code == 201
    resp = await client.get(path)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["field"] == field


async def test_forget_turn_range_past_the_stored_range_is_a_422(
    server: RunningServer, admin_key: str
) -> None:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}
    ) as http:
        made = await http.post(
            "/v1/sessions/f/turns", json={"turns": [{"role": "user", "content": "hi"}]}
        )
        assert made.status_code == 201
        resp = await http.post(
            "/v1/sessions/f/memory",
            content=b'{"type": "forget", "turn_range": [1, 1e30]}',
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["field"] == "turn_range[1]"


def result(call_id: str, text: str = "42") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


async def test_one_result_per_tool_call(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    twice = await client.post(
        "/v1/sessions/t/turns", json={"turns": [call, result("c1"), result("c1", "43")]}
    )
    assert twice.status_code == 422
    assert twice.json()["error"]["code"] == "duplicate_tool_result"
    assert twice.json()["error"]["field"] == "turns[2].tool_call_id"
    assert await tenant_rows(engine, tenant_name) == (0, 0)

    first = await client.post("/v1/sessions/t/turns", json={"turns": [call, result("c1")]})
    assert first.status_code == 201
    again = await client.post("/v1/sessions/t/turns", json={"turns": [result("c1", "43")]})
    assert again.status_code == 422
    assert again.json()["error"]["code"] == "duplicate_tool_result"
    assert again.json()["error"]["field"] == "turns[0].tool_call_id"
    assert await tenant_rows(engine, tenant_name) == (2, 1)
