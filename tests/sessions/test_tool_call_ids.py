"""Tool call ids as real agents send them, through the HTTP API: a reused id is answered by its
latest call that has no result yet; duplicates inside one assistant turn, a second result and a
result for an unknown call are 422s that write nothing; odd arguments and outputs are stored as
sent and built into valid prompts."""

import asyncio
import json
from typing import Any

import httpx

from app.eval.agent import validity_problems
from tests.support.pairing import anthropic_pairing_errors


def call(call_id: str, arguments: str = '{"reservation_id": "8ZC1KX"}') -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_reservation_details", "arguments": arguments},
    }


def calls(*ids: str, content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [call(i) for i in ids]}


def result(call_id: str, content: str = '{"status": "confirmed"}') -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def append(client: httpx.AsyncClient, sid: str, *turns: dict[str, Any]) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/turns", json={"turns": list(turns)})


async def stored(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    listed = await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 500})
    return list(listed.json()["turns"]) if listed.status_code == 200 else []


async def build(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    built = await client.post(
        f"/v1/sessions/{sid}/build-prompt",
        json={"system": "You are an airline agent.", "query": "Go on.", "format": fmt},
    )
    assert built.status_code == 200, built.text
    body: dict[str, Any] = built.json()
    errors = (validity_problems if fmt == "openai" else anthropic_pairing_errors)(body["messages"])
    assert errors == [], errors
    return body


def error(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["field"]


async def test_a_reused_id_is_answered_by_the_newer_call(client: httpx.AsyncClient) -> None:
    sid = "reuse"
    first = calls("call_0")
    second = calls("call_0")
    second["tool_calls"][0]["function"]["arguments"] = '{"reservation_id": "HAT069"}'
    assert (await append(client, sid, first, result("call_0", '{"flight": "HAT001"}'))).is_success
    # The answered id again in a later call, its result in a later append (refused before).
    assert (await append(client, sid, second)).status_code == 201
    assert (await append(client, sid, result("call_0", '{"flight": "HAT069"}'))).status_code == 201
    messages = (await build(client, sid))["messages"]
    window = [m for m in messages if m["role"] in ("assistant", "tool")]
    assert [
        m.get("tool_call_id") or m["tool_calls"][0]["function"]["arguments"] for m in window
    ] == [
        '{"reservation_id": "8ZC1KX"}',
        "call_0",
        '{"reservation_id": "HAT069"}',
        "call_0",
    ]
    assert window[3]["content"] == '{"flight": "HAT069"}'
    await build(client, sid, "anthropic")
    # Every call_0 has its result now: one more is a duplicate, and nothing is written.
    again = await append(client, sid, result("call_0", "late"))
    assert error(again) == (422, "duplicate_tool_result", "turns[0].tool_call_id")
    assert len(await stored(client, sid)) == 4


async def test_two_waiting_calls_of_one_id_take_results_newest_first(
    client: httpx.AsyncClient,
) -> None:
    sid = "nested"
    assert (await append(client, sid, calls("c", content="Looking."))).status_code == 201
    assert (await append(client, sid, calls("c"), result("c", "newer"))).status_code == 201
    # The older call still waits: its result is accepted, and shown right after it.
    body = await build(client, sid)
    older = body["messages"][1]
    assert older == {"role": "assistant", "content": "Looking."}  # its call waits: not shown
    assert (await append(client, sid, result("c", "older"))).status_code == 201
    shown = [(m["role"], m["content"]) for m in (await build(client, sid))["messages"][1:-1]]
    assert shown == [
        ("assistant", "Looking."),
        ("tool", "older"),
        ("assistant", ""),
        ("tool", "newer"),
    ]
    await build(client, sid, "anthropic")
    third = await append(client, sid, result("c", "third"))
    assert error(third) == (422, "duplicate_tool_result", "turns[0].tool_call_id")


async def test_duplicate_ids_in_one_turn_are_refused_and_nothing_is_stored(
    client: httpx.AsyncClient,
) -> None:
    sid = "dups"
    refused = await append(
        client,
        sid,
        {"role": "user", "content": "Check both flights."},
        calls("dup0", "dup1", "dup0"),
        result("dup0"),
        result("dup1"),
    )
    assert error(refused) == (422, "duplicate_tool_call_id", "turns[1].tool_calls[2].id")
    assert (await client.get(f"/v1/sessions/{sid}")).status_code == 404
    # In an existing session too: its turns are as they were.
    assert (await append(client, sid, {"role": "user", "content": "hi"})).status_code == 201
    refused = await append(client, sid, calls("a", "a"))
    assert error(refused) == (422, "duplicate_tool_call_id", "turns[0].tool_calls[1].id")
    assert [t["role"] for t in await stored(client, sid)] == ["user"]


async def test_results_that_answer_no_waiting_call_are_refused_whole(
    client: httpx.AsyncClient,
) -> None:
    sid = "orphans"
    assert (await append(client, sid, calls("a"), result("a"))).status_code == 201
    unknown = await append(client, sid, calls("b"), result("b"), result("nope"))
    assert error(unknown) == (422, "unknown_tool_call", "turns[2].tool_call_id")
    second = await append(client, sid, calls("b"), result("b"), result("b"))
    assert error(second) == (422, "duplicate_tool_result", "turns[2].tool_call_id")
    assert len(await stored(client, sid)) == 2  # neither request wrote its first turns


async def test_concurrent_results_for_one_waiting_call_one_wins(client: httpx.AsyncClient) -> None:
    sid = "race"
    assert (await append(client, sid, calls("call_0"))).status_code == 201
    answers = await asyncio.gather(
        *(append(client, sid, result("call_0", f"answer {n}")) for n in range(6))
    )
    assert sorted(a.status_code for a in answers) == [201] + [422] * 5
    assert {error(a)[1] for a in answers if a.status_code == 422} == {"duplicate_tool_result"}
    assert [t["role"] for t in await stored(client, sid)] == ["assistant", "tool"]


async def test_odd_arguments_and_outputs_are_stored_as_sent_and_built(
    client: httpx.AsyncClient,
) -> None:
    sid = "odd"
    broken = '{"reservation_id": "8ZC1KX", '  # cut off: not JSON
    chinese = "航班 HAT069 已确认，乘客：李雷，行李 2 件，退款 ¥1,280 将在 7 个工作日内到账。"
    turns = [
        {"role": "user", "content": "查一下我的订单 8ZC1KX"},
        calls("call_0", content=None) | {"tool_calls": [call("call_0", broken)]},
        result("call_0", 'Traceback (most recent call last):\n  File "x.py" ... not JSON {'),
        calls("call_1") | {"tool_calls": [call("call_1", "[1, 2")]},
        result("call_1", chinese),
        calls("call_2") | {"tool_calls": [call("call_2", "")]},
        result("call_2", json.dumps({"备注": "靠窗", "seat": "12A"}, ensure_ascii=False)),
    ]
    assert (await append(client, sid, *turns)).status_code == 201
    listed = await stored(client, sid)
    assert listed[1]["tool_calls"][0]["function"]["arguments"] == broken
    assert listed[3]["tool_calls"][0]["function"]["arguments"] == "[1, 2"
    assert listed[4]["content"] == chinese
    openai = await build(client, sid)
    assert openai["messages"][2]["tool_calls"][0]["function"]["arguments"] == broken
    assert openai["messages"][5]["content"] == chinese
    anthropic = await build(client, sid, "anthropic")
    uses = [
        b
        for m in anthropic["messages"]
        for b in m["content"]
        if isinstance(m["content"], list) and b["type"] == "tool_use"
    ]
    assert [u["input"] for u in uses] == [{"arguments": broken}, {"arguments": "[1, 2"}, {}]
