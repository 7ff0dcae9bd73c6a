"""Forgetting a turn range never splits a tool call from its results (spec §2): the range is
widened to whole tool-call groups, in the window and in offloaded chunks alike."""

from typing import Any

import httpx
import pytest

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}


def call(call_id: str, city: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "weather", "arguments": f'{{"city": "{city}"}}'},
    }


def chat(i: int) -> dict[str, Any]:
    role = "user" if i % 2 == 0 else "assistant"
    return {
        "role": role,
        "content": f"turn {i}: we compare trains, hotels and flights for the trip, option {i} "
        "looks fine but let us keep looking at alternatives. " * 3,
    }


# seq 2: the call (two call ids), 3 and 4: its results, 5: the answer.
TOOL_GROUP = [
    {"role": "user", "content": "What is the weather in Lyon and Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("c-1", "Lyon"), call("c-2", "Paris")],
    },
    {"role": "tool", "tool_call_id": "c-1", "content": "Lyon: 14 C, light rain"},
    {"role": "tool", "tool_call_id": "c-2", "content": "Paris: 11 C, cloudy"},
    {"role": "assistant", "content": "Lyon is 14 C with light rain, Paris 11 C and cloudy."},
]


async def listed_turns(admin: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    resp = await admin.get(f"/v1/sessions/{sid}/turns", params={"limit": 200})
    assert resp.status_code == 200, resp.text
    return resp.json()["turns"]


def assert_no_orphan_results(turns: list[dict[str, Any]]) -> None:
    issued: set[str] = set()
    for turn in turns:
        issued.update(c["id"] for c in turn["tool_calls"] or [])
        if turn["role"] == "tool":
            assert turn["tool_call_id"] in issued, (turn["seq"], [t["seq"] for t in turns])


async def forget_range(admin: httpx.AsyncClient, sid: str, first: int, last: int) -> dict:
    resp = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [first, last]}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("asked", [(2, 2), (3, 3), (4, 4), (3, 4), (4, 5)])
async def test_forget_in_the_window_takes_the_whole_tool_group(
    admin: httpx.AsyncClient, asked: tuple[int, int]
) -> None:
    sid = "tool-window"
    turns = [*TOOL_GROUP, {"role": "user", "content": "Thanks, book Lyon."}]
    resp = await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text

    answer = await forget_range(admin, sid, *asked)

    expected = sorted({2, 3, 4} | set(range(asked[0], asked[1] + 1)))
    assert answer["data"]["forgotten_turns"] == expected
    assert answer["data"]["widened_to"] == [expected[0], expected[-1]]
    assert f"widened to {expected[0]}-{expected[-1]}" in answer["text"]
    left = await listed_turns(admin, sid)
    assert [t["seq"] for t in left] == [s for s in range(1, 7) if s not in expected]
    assert_no_orphan_results(left)


async def test_a_range_without_tool_turns_is_not_widened(admin: httpx.AsyncClient) -> None:
    sid = "tool-plain"
    turns = [*TOOL_GROUP, {"role": "user", "content": "Thanks, book Lyon."}]
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201

    answer = await forget_range(admin, sid, 5, 6)

    assert answer["data"]["forgotten_turns"] == [5, 6]
    assert "widened_to" not in answer["data"] and "widened" not in answer["text"]


@pytest.mark.parametrize("asked", [3, 4, 5])
async def test_forget_in_offloaded_chunks_takes_the_whole_tool_group(
    admin: httpx.AsyncClient, asked: int
) -> None:
    sid = "tool-offloaded"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    # seq 1: chat, 2: user question, 3: call, 4 and 5: results, 6: answer, then more chat.
    turns = [chat(0), *TOOL_GROUP, *(chat(i) for i in range(6, 30))]
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201
    resp = await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
    assert resp.status_code == 200, resp.text
    before = {t["seq"]: t for t in await listed_turns(admin, sid)}
    assert all(before[s]["chunk_id"] is not None for s in (3, 4, 5))

    answer = await forget_range(admin, sid, asked, asked)

    assert answer["data"]["forgotten_turns"] == [3, 4, 5]
    assert answer["data"]["widened_to"] == [3, 5]
    assert answer["data"]["tombstoned_chunks"]
    left = await listed_turns(admin, sid)
    assert not {3, 4, 5} & {t["seq"] for t in left}
    assert {1, 2, 6} <= {t["seq"] for t in left}
    assert_no_orphan_results(left)
    # Every kept offloaded turn is still covered by an active chunk.
    chunks = (await admin.get(f"/v1/sessions/{sid}/chunks")).json()["chunks"]
    active = {c["chunk_id"] for c in chunks if c["status"] == "active"}
    assert all(t["chunk_id"] is None or t["chunk_id"] in active for t in left)
