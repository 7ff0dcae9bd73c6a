"""Every built prompt of an agent's tool loop is a message list providers accept, at every
context limit, through the HTTP API: parallel calls, ids reused at every step (`call_0`), results
that come in a later append than their call (one after the user spoke meanwhile), a call still
waiting for its result at the end, and a call offloaded (emergency offload on append and build)
while its result, come late, stays in the window."""

import json
from typing import Any

import httpx
import pytest

from app.eval.agent import validity_problems
from tests.support.pairing import anthropic_pairing_errors

SYSTEM = "You are an airline agent. Use the tools; confirm before booking. 回答要简洁。"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_reservation_details",
            "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}}},
        },
    }
]
STEPS = 30
LATE_CALL_STEP, LATE_RESULT_STEP = 2, STEPS - 3


def call(call_id: str, step: int) -> dict[str, Any]:
    arguments = json.dumps({"reservation_id": f"R{step:03d}X", "passenger": "mia_li_3668"})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_reservation_details", "arguments": arguments},
    }


def calls(step: int, *ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(i, step) for i in ids]}


def output(step: int, part: int) -> str:
    flights = [
        {
            "flight_number": f"HAT{100 + step * 3 + n:03d}",
            "date": f"2024-05-{1 + (step + n) % 28:02d}",
            "origin": "JFK",
            "destination": "SEA" if n % 2 else "LAX",
            "price": 120 + step * 7 + n * 13,
            "status": "available",
        }
        for n in range(2 + part)
    ]
    note = "航班已确认，行李两件。" if step % 3 == 0 else "Seat 12A held until 18:00."
    return json.dumps({"reservation_id": f"R{step:03d}X", "flights": flights, "note": note})


def result(call_id: str, step: int, part: int = 0) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": output(step, part)}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def agent_loop() -> list[list[dict[str, Any]]]:
    """The appends of one agent run, in order."""
    appends: list[list[dict[str, Any]]] = [[user("Change reservation R000X to a later flight.")]]
    for step in range(STEPS):
        if step == LATE_CALL_STEP:
            appends.append([calls(step, "call_late")])  # its result comes much later
        if step == LATE_RESULT_STEP:
            appends.append([result("call_late", step)])
        kind = step % 5
        if kind == 0:  # one call, reused id, answered in the same append
            appends.append([calls(step, "call_0"), result("call_0", step)])
            appends.append([{"role": "assistant", "content": f"Found R{step:03d}X."}])
        elif kind == 1:  # parallel calls; the results in the next append
            appends.append([calls(step, "call_0", "call_1")])
            appends.append([result("call_1", step, 1), result("call_0", step)])
        elif kind == 2:  # the user speaks while the tool runs
            appends.append([calls(step, f"toolu_{step}")])
            appends.append([user("Also check the baggage allowance, please.")])
            appends.append([result(f"toolu_{step}", step)])
        elif kind == 3:  # three parallel calls, answered in another order
            ids = ("call_0", "call_1", "call_2")
            appends.append(
                [calls(step, *ids), *reversed([result(i, step, n) for n, i in enumerate(ids)])]
            )
        else:
            appends.append(
                [calls(step, "call_0"), result("call_0", step), user("And the next one?")]
            )
    appends.append([calls(STEPS, "call_0")])  # mid-step: the result is not there yet
    return appends


async def session_turns(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    listed = await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 500})
    assert listed.status_code == 200
    return list(listed.json()["turns"])


@pytest.mark.parametrize(("limit", "reserve"), [(1200, 200), (2000, 300), (3500, 500), (6000, 400)])
async def test_every_prompt_of_a_tool_loop_pairs_calls_and_results(
    client: httpx.AsyncClient, limit: int, reserve: int
) -> None:
    sid = f"loop-{limit}"
    config = {
        "context_limit": limit,
        "reserve_tokens": reserve,
        "min_recent_turns": 4,
        "min_recent_tokens": 200,
    }
    assert (await client.put(f"/v1/sessions/{sid}", json=config)).status_code == 200
    builds = 0
    late_left_out = False
    for n, turns in enumerate(agent_loop()):
        appended = await client.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
        assert appended.status_code == 201, appended.text
        fmt = "anthropic" if n % 3 == 2 else "openai"
        built = await client.post(
            f"/v1/sessions/{sid}/build-prompt",
            json={"system": SYSTEM, "tools": TOOLS, "format": fmt},
        )
        assert built.status_code == 200, built.text
        body = built.json()
        builds += 1
        messages = body["messages"]
        check = validity_problems if fmt == "openai" else anthropic_pairing_errors
        assert check(messages) == [], (n, check(messages))
        assert body["usage"]["total"] <= limit - reserve
        shown = json.dumps(messages, ensure_ascii=False)
        if turns[-1]["role"] == "tool" and turns[-1]["tool_call_id"] != "call_late":
            # The newest result is in the prompt, with its call: validity is not bought by
            # leaving the loop's latest step out.
            assert json.dumps(turns[-1]["content"], ensure_ascii=False)[1:-1] in shown
        if turns[-1].get("tool_call_id") == "call_late":
            stored = await session_turns(client, sid)
            late_call = next(
                t for t in stored if t["tool_calls"] and t["tool_calls"][0]["id"] == "call_late"
            )
            late_result = stored[-1]
            assert late_call["chunk_id"] is not None, "the late call should be offloaded by now"
            assert late_result["chunk_id"] is None
            assert json.dumps(late_result["content"], ensure_ascii=False)[1:-1] not in shown
            late_left_out = True
    assert late_left_out
    assert builds == len(agent_loop())
    # The call still waiting at the end is not in the prompt; the step before it is.
    built = await client.post(f"/v1/sessions/{sid}/build-prompt", json={"system": SYSTEM})
    # (An agent's step past its budget shows what recall found after the transcript.)
    tail = [m for m in built.json()["messages"] if m["role"] != "system"][-3:]
    assert [m["role"] for m in tail] == ["assistant", "tool", "user"]
    assert tail[1]["content"] == output(STEPS - 1, 0)
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert session["counts"]["chunks"] > 0
