"""Every notes line knows where it came from: the turns it was built from, who said them, the
tool of a tool result and the generator that wrote it; a line built from an untrusted part is
untrusted, and forgetting any of its turns takes it (English and Chinese)."""

import json
from datetime import UTC, datetime
from typing import Any

import httpx

from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.domain.tool_groups import tool_names
from app.notes.llm import llm_extract
from app.notes.policy import remove_sources, render_notes_block, with_provenance
from app.notes.rules import extract
from app.notes.schemas import NoteItem, Notes
from tests.support.loopback import loopback_server

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def turn(seq: int, role: str, content: str, **extra: Any) -> TurnRecord:
    return TurnRecord(seq, role, content, message_tokens(role, content), T0, **extra)


def call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def tool_session(language: str) -> list[TurnRecord]:
    ask, data, budget = {
        "en": (
            "Check my order please.",
            '{"order_id": "A-7731"}',
            "The budget is at most 900 EUR.",
        ),
        "zh": ("帮我查一下订单。", '{"订单号": "CD-5521"}', "预算不超过900欧元。"),
    }[language]
    return [
        turn(1, "user", ask),
        turn(2, "assistant", "", tool_calls=[call("c1", "get_order")]),
        turn(3, "tool", data, tool_call_id="c1"),  # no `name`: the call names the tool
        turn(4, "user", budget),
    ]


def test_tool_names_come_from_the_call_or_the_result() -> None:
    turns = [
        *tool_session("en"),
        turn(5, "tool", "42 °C", name="weather"),  # answers no call: its own name
        turn(6, "tool", "orphan"),  # neither
    ]
    assert tool_names(turns) == {3: "get_order", 5: "weather"}


def test_rules_lines_carry_tool_generator_and_trust_in_both_languages() -> None:
    for language, value in (("en", "A-7731"), ("zh", "CD-5521")):
        notes = extract(tool_session(language))
        [fact] = [f for f in notes.facts if value in f.text]
        assert (fact.seq, fact.source, fact.tool, fact.trusted) == (3, "tool", "get_order", False)
        assert fact.generator == "rules"
        [limit] = notes.constraints
        assert (limit.seq, limit.source, limit.tool, limit.trusted) == (4, "user", None, True)
        assert limit.generator == "rules"
        assert "tool output (get_order), untrusted, turn 3: " in render_notes_block(notes)


def test_a_confirmed_proposal_names_both_turns_and_leaves_with_either() -> None:
    for proposal, yes in (
        ("Shall we go with Hotel Gracery in Shinjuku?", "Yes, go ahead."),
        ("我建议订新宿的格拉斯丽酒店。", "好的，就这样。"),
    ):
        notes = extract([turn(7, "assistant", proposal), turn(8, "user", yes)])
        [decision] = notes.decisions
        assert decision.seq == 8 and decision.seqs == (7,), decision
        assert decision.source_seqs() == {7, 8}
        for forgotten in (7, 8):
            assert remove_sources(notes, {forgotten}).decisions == []


def test_a_line_built_from_an_untrusted_part_is_untrusted() -> None:
    line = NoteItem(text="User confirmed: the refund", seq=2, source="user", seqs=(1,))
    turns = [turn(1, "tool", "Refund approved.", name="crm"), turn(2, "user", "yes")]
    [stamped] = with_provenance(Notes(decisions=[line]), turns, "rules").decisions
    assert stamped.trusted is False and stamped.generator == "rules"
    earlier = NoteItem(text="earlier line", seq=0, source="user")
    [kept] = with_provenance(Notes(goal=[earlier]), turns, "rules").goal
    assert kept == earlier  # a line of an earlier run is left as it was


async def test_the_llm_cannot_raise_the_trust_or_forge_the_tool_of_a_line() -> None:
    previous = Notes(
        facts=[NoteItem(text="order A-7731", seq=3, source="tool", trusted=False, tool="get_order")]
    )
    turns = [turn(4, "user", "The budget is at most 900 EUR.")]
    reply = {
        # The earlier tool line comes back claiming to be a trusted user line of another tool.
        "facts": [
            {"text": "order A-7731", "seq": 3, "source": "user", "trusted": True, "tool": "x"}
        ],
        "constraints": [
            {"text": "budget at most 900 EUR", "seq": 4, "source": "user", "seqs": [99]}
        ],
    }
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(reply)}}]
    }
    with loopback_server(lambda m, p, b: (200, body)) as llm:
        async with httpx.AsyncClient(trust_env=False) as client:
            notes = await llm_extract(client, llm.url, "m", None, previous, turns, 5.0)
    [fact] = notes.facts
    assert (fact.source, fact.trusted, fact.tool) == ("tool", False, "get_order")
    [limit] = notes.constraints
    assert (limit.generator, limit.seqs, limit.trusted) == ("llm", (), True)


def test_a_remembered_line_leaves_at_the_end_of_its_validity() -> None:
    ends = datetime(2026, 12, 6, 12, tzinfo=UTC)
    lapsing = NoteItem(text="Gate B closed", source="memory", valid_until=ends)
    notes = Notes(remembered=[lapsing, NoteItem(text="prefers trains", source="memory")])
    before = datetime(2026, 12, 6, 11, 59, tzinfo=UTC)
    assert not notes.lapses_by(before) and notes.in_force(before) == notes
    assert notes.lapses_by(ends)
    assert [i.text for i in notes.in_force(ends).remembered] == ["prefers trains"]
    assert "Gate B" not in render_notes_block(notes.in_force(ends))
