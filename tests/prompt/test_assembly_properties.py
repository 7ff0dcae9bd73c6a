"""Properties of prompt assembly over random sessions, budgets and formats.

Every figure is recounted independently with `app.domain.tokens.messages_tokens` on what the
assembler returned (for Anthropic, on `anthropic_counting_view` of the returned system + messages).
"""

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.records import RecalledItem, TurnRecord
from app.domain.tokens import message_tokens, messages_tokens
from app.notes.values import STUB_PREFIX
from app.prompt.assembly import (
    AssemblyInput,
    PromptTooLarge,
    assemble_prompt,
    baseline_messages,
    tools_tokens,
)
from app.prompt.blocks import ABOUT_USER_OPEN, RECALL_OPEN, anthropic_counting_view, turn_message

T0 = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)
SAMPLE = "the hotel budget is at most 120 EUR order ID-4411 must never book flights on Friday"
ENGLISH = SAMPLE.split(" ")
CHINESE = [
    "预算",
    "不超过",
    "一百二十",
    "欧元",
    "订单号",
    "必须",
    "不要",
    "周五",
    "航班",
    "酒店",
    "。",
]

words = st.lists(st.sampled_from(ENGLISH), max_size=80).map(" ".join)
hanzi = st.lists(st.sampled_from(CHINESE), max_size=80).map("".join)
texts = st.one_of(words, hanzi, st.text(max_size=40), st.tuples(words, hanzi).map("\n".join))


@st.composite
def sessions(draw: st.DrawFn) -> list[TurnRecord]:
    turns: list[TurnRecord] = []

    def add(role: str, content: str, **extra: Any) -> None:
        seq = len(turns) + 1
        tokens = message_tokens(
            role, content, extra.get("name"), extra.get("tool_calls"), extra.get("tool_call_id")
        )
        created = T0 + timedelta(minutes=seq)
        turns.append(TurnRecord(seq, role, content, tokens, created, **extra))

    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "system", "tools"]))
        if kind != "tools":
            name = draw(st.one_of(st.none(), st.just("alice"))) if kind == "user" else None
            add(kind, draw(texts), name=name)
            continue
        ids = [f"call_{len(turns)}_{i}" for i in range(draw(st.integers(1, 3)))]
        calls = [
            {"id": i, "type": "function", "function": {"name": "lookup", "arguments": a}}
            for i, a in zip(ids, draw(st.lists(texts.map(json.dumps), min_size=3)), strict=False)
        ]
        add("assistant", draw(st.sampled_from(["", "Checking."])), tool_calls=calls)
        for call_id in ids:
            add("tool", draw(texts), tool_call_id=call_id)
    return turns


@st.composite
def inputs(draw: st.DrawFn) -> AssemblyInput:
    turns = draw(sessions())
    system = [{"role": "system", "content": t} for t in draw(st.lists(texts, max_size=2))]
    recalled = [
        RecalledItem(
            f"ch_{n}",
            draw(texts),
            T0,
            turn_first=first,
            turn_last=first + draw(st.integers(0, 3)),
            trusted=draw(st.booleans()),
            score=1.0 / (n + 1),
        )
        for n, first in enumerate(draw(st.lists(st.integers(0, 15), max_size=6)))
    ]
    tools = draw(
        st.one_of(
            st.none(),
            st.just([{"type": "function", "function": {"name": "lookup", "parameters": {}}}]),
        )
    )
    query = draw(st.one_of(st.none(), texts))
    notes = draw(st.one_of(st.just(""), texts))
    # Budgets spread from "not even C0 + x_t fits" to "everything fits with room to spare".
    everything = [*baseline_messages(system, turns, query), {"role": "system", "content": notes}]
    ceiling = messages_tokens(everything) + tools_tokens(tools) + 300
    return AssemblyInput(
        system=system,
        turns=turns,
        query=query,
        budget=draw(st.integers(0, ceiling)),
        recall_budget_tokens=draw(st.integers(0, 600)),
        top_k=draw(st.integers(0, 5)),
        per_item_max_tokens=draw(st.integers(1, 120)),
        tools=tools,
        notes_block=notes,
        recalled=recalled,
        format=draw(st.sampled_from(["openai", "anthropic"])),
    )


def independent_total(
    messages: list[dict[str, Any]], system: str | None, inp: AssemblyInput
) -> int:
    if inp.format == "anthropic":
        return messages_tokens(anthropic_counting_view(system, messages)) + tools_tokens(inp.tools)
    return messages_tokens(messages) + tools_tokens(inp.tools)


def mandatory_total(inp: AssemblyInput) -> int:
    query = [] if inp.query is None else [{"role": "user", "content": inp.query}]
    if inp.format == "anthropic":
        c0 = "\n\n".join(m["content"] for m in inp.system if m["content"])
        return independent_total(query, c0, inp)
    return independent_total([*inp.system, *query], None, inp)


def tool_pairs(turns: list[TurnRecord]) -> list[tuple[int, int]]:
    call_seq = {c["id"]: t.seq for t in turns for c in (t.tool_calls or [])}
    return [(call_seq[t.tool_call_id], t.seq) for t in turns if t.role == "tool"]


def ids_included(prompt: Any) -> set[str]:
    return {e.id for e in prompt.manifest if e.included}


def assert_tool_blocks_paired(messages: list[dict[str, Any]]) -> None:
    """Every tool_use is answered in the next message, every tool_result answers the one before."""
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if uses:
            answer = messages[index + 1]
            assert answer["role"] == "user"
            assert [b["tool_use_id"] for b in answer["content"]] == uses
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if results:
            previous = messages[index - 1]["content"]
            assert [b["id"] for b in previous if b["type"] == "tool_use"] == results


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs())
def test_assembly_properties(inp: AssemblyInput) -> None:
    try:
        prompt = assemble_prompt(inp)
    except PromptTooLarge as exc:
        assert mandatory_total(inp) > inp.budget
        assert exc.needed == mandatory_total(inp)
        return

    total = independent_total(prompt.messages, prompt.system, inp)
    assert total <= inp.budget
    assert total == prompt.usage["total"]

    if inp.query is not None:
        assert prompt.messages[-1] == {"role": "user", "content": inp.query}

    included = prompt.included_turns
    assert len(included) == len(set(included))
    all_seqs = [t.seq for t in inp.turns]
    assert included == all_seqs[len(all_seqs) - len(included) :]  # newest contiguous tail, in order
    assert sorted(included + prompt.excluded_turns) == all_seqs
    assert ("window_truncated" in prompt.flags) == bool(prompt.excluded_turns)

    for call_seq, result_seq in tool_pairs(list(inp.turns)):
        assert (call_seq in included) == (result_seq in included)

    # Only tool results are cleared, and a stub costs less than its result.
    cleared = set(prompt.cleared_turns)
    assert all(t.role == "tool" for t in inp.turns if t.seq in cleared)
    if inp.format == "openai":
        window = [turn_message(t) for t in inp.turns if t.seq in included]
        query = [] if inp.query is None else prompt.messages[-1:]
        end = len(prompt.messages) - len(query)
        # An agent's step (no query, a tool loop) puts the notes and what its search found
        # after the transcript; elsewhere a system turn may read like the notes.
        agent_step = inp.query is None and any(t.tool_calls for t in (*inp.tail, *inp.turns))
        notes_kept = any(e.id == "notes" and e.included for e in prompt.manifest)
        # The late blocks in reverse order, each at most once.
        late = (RECALL_OPEN, ABOUT_USER_OPEN, inp.notes_block if notes_kept else "")
        for head in late if agent_step else ():
            last = prompt.messages[end - 1] if end > len(inp.system) else {}
            if head and last.get("role") == "system":
                end -= last["content"].startswith(head)
        shown = [*prompt.messages[end - len(window) : end], *query]
        for message, turn in zip(shown, [t for t in inp.turns if t.seq in included], strict=False):
            if turn.seq in cleared:
                assert message["content"].startswith(STUB_PREFIX)
                assert message_tokens("tool", message["content"], None, None, turn.tool_call_id) < (
                    turn.token_count
                )
                message = {**message, "content": turn.content}
            assert message == turn_message(turn)
        assert shown[len(window) :] == query
        assert prompt.messages[: len(inp.system)] == [dict(m) for m in inp.system]
        injected = (
            ("notes" in ids_included(prompt))
            + bool(prompt.recalled)
            + ("values" in ids_included(prompt))
        )
        assert len(prompt.messages) == len(inp.system) + injected + len(window) + len(query)
    else:
        assert {m["role"] for m in prompt.messages} <= {"user", "assistant"}
        assert_tool_blocks_paired(prompt.messages)

    assert len(prompt.recalled) <= inp.top_k
    assert prompt.usage["recall"] <= inp.recall_budget_tokens
    ids = [e.id for e in prompt.manifest]
    assert len(ids) == len(set(ids))
    assert [e.id for e in prompt.manifest if e.layer == "c1"] == [f"turn:{s}" for s in all_seqs]
    assert len([e for e in prompt.manifest if e.layer == "c3"]) == len(inp.recalled)
    assert all(e.included == (e.reason is None) for e in prompt.manifest)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs())
def test_baseline_when_everything_fits(inp: AssemblyInput) -> None:
    baseline = baseline_messages(inp.system, inp.turns, inp.query)
    plain = replace(
        inp,
        format="openai",
        notes_block="",
        recalled=(),
        budget=messages_tokens(baseline) + tools_tokens(inp.tools),
    )
    prompt = assemble_prompt(plain)
    assert json.dumps(prompt.messages, ensure_ascii=False) == json.dumps(
        baseline, ensure_ascii=False
    )
    assert prompt.flags == []
    assert prompt.usage["total"] == plain.budget
