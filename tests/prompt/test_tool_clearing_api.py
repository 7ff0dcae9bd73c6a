"""Tool-result clearing through the HTTP API: an agent's tool loop in a small window keeps every
value its next call needs (stubs, the offloaded tail, the value table), each cleared result's raw
text stays one chunk away, and the controls are validated and obeyed."""

import json
from typing import Any

import httpx

from app.eval.agent import prompt_text, validity_problems

SYSTEM = "You are an airline agent. Use the tools; confirm before booking."
LIMIT, RESERVE = 2000, 200
ROUNDS = 10


def round_turns(n: int) -> list[dict[str, Any]]:
    """One call and its result; every third result is Chinese."""
    call_id = f"call_{n}"
    arguments = json.dumps({"reservation_id": f"R{n:03d}X"})
    call = {"id": call_id, "type": "function"}
    call["function"] = {"name": "get_reservation_details", "arguments": arguments}
    if n % 3 == 2:
        result = {
            "订单号": f"R{n:03d}X",
            "航班号": f"HAT{n:03d}",
            "备注": "靠窗座位，行李两件。" * 20,
        }
    else:
        result = {
            "reservation_id": f"R{n:03d}X",
            "flights": [{"flight_number": f"HAT{n:03d}", "date": f"2024-05-{n + 1:02d}"}],
            "remark": "a long remark about seats and meals " * 20,
        }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": json.dumps(result, ensure_ascii=False),
        },
    ]


async def build(client: httpx.AsyncClient, sid: str, **extra: Any) -> dict[str, Any]:
    built = await client.post(
        f"/v1/sessions/{sid}/build-prompt", json={"system": SYSTEM, "format": "openai", **extra}
    )
    assert built.status_code == 200, built.text
    body: dict[str, Any] = built.json()
    assert validity_problems(body["messages"]) == []
    assert body["usage"]["total"] <= LIMIT - RESERVE
    return body


async def test_a_tool_loop_keeps_every_value_and_each_cleared_result_stays_a_chunk_away(
    client: httpx.AsyncClient,
) -> None:
    sid = "clearing-loop"
    config = {"context_limit": LIMIT, "reserve_tokens": RESERVE, "min_recent_turns": 4}
    assert (await client.put(f"/v1/sessions/{sid}", json=config)).status_code == 200
    first = {"role": "user", "content": "Check all my reservations, please."}
    assert (await client.post(f"/v1/sessions/{sid}/turns", json={"turns": [first]})).is_success
    for n in range(ROUNDS):
        appended = await client.post(f"/v1/sessions/{sid}/turns", json={"turns": round_turns(n)})
        assert appended.status_code == 201, appended.text
        body = await build(client, sid)
        text = prompt_text(body["messages"])
        for m in range(n + 1):  # what any next call may need is in the prompt
            assert f"R{m:03d}X" in text and f"HAT{m:03d}" in text, (n, m)
    stubs = [e for e in body["manifest"] if e["source"] == "tool_result_stub"]
    assert stubs, "a 1,800-token prompt cannot hold ten ~250-token results verbatim"
    shown = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    assert shown[f"call_{ROUNDS - 1}"] == round_turns(ROUNDS - 1)[1]["content"]  # newest: whole
    offloaded = [e for e in stubs if e["chunk_id"] is not None]
    assert offloaded, "the session's oldest turns are offloaded by now"
    stub = offloaded[0]
    chunk = await client.get(f"/v1/sessions/{sid}/chunks/{stub['chunk_id']}")
    assert chunk.status_code == 200
    seq = int(stub["id"].removeprefix("turn:"))
    turns = (await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()
    raw = next(t["content"] for t in turns["turns"] if t["seq"] == seq)
    # The raw result, verbatim (a long one split over chunks: this one holds its start).
    assert raw[:80] in chunk.json()["raw_text"]
    cleared = next(
        m["content"]
        for m in body["messages"]
        if m.get("tool_call_id") and m["content"].startswith("[tool result cleared")
    )
    assert "get_reservation_details(" in cleared
    chinese = [m["content"] for m in body["messages"] if "订单号:" in (m.get("content") or "")]
    assert chinese, "a Chinese result's stub or table row keeps its field names"

    # Per build: results of an excluded tool are never cleared.
    kept = await build(client, sid, tool_results={"exclude_tools": ["get_reservation_details"]})
    assert not [e for e in kept["manifest"] if e["source"] == "tool_result_stub"]


async def test_clearing_controls_are_validated(client: httpx.AsyncClient) -> None:
    sid = "clearing-controls"
    bad = await client.put(f"/v1/sessions/{sid}", json={"tool_results_keep": -1})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "tool_results_keep"
    ok = await client.put(
        f"/v1/sessions/{sid}",
        json={"tool_results_exclude_tools": ["read_file"], "tool_results_clear_at_least": 500},
    )
    assert ok.status_code == 200, ok.text
    body = await client.post(
        f"/v1/sessions/{sid}/build-prompt", json={"tool_results": {"clear_at_least": -5}}
    )
    assert body.status_code == 422
    assert body.json()["error"]["field"] == "tool_results.clear_at_least"
