"""Tool-result clearing in assembly: stubs before dropped turns, the offloaded tail, the value
table (pure, no database)."""

import json
from itertools import pairwise
from typing import Any

import pytest

from app.domain.tokens import messages_tokens
from app.prompt.assembly import AssemblyInput, assemble_prompt
from app.prompt.clearing import History, ToolClearing, fit_table
from app.prompt.fitting import stretch_turns
from tests.prompt.test_assembly import call, item, turn

SYSTEM = [{"role": "system", "content": "You are an airline agent."}]


def reservation(n: int) -> str:
    return json.dumps(
        {
            "reservation_id": f"RES{n:03d}X",
            "flights": [
                {"flight_number": f"HAT{n:03d}", "date": f"2024-05-{n % 28 + 1:02d}", "price": n}
            ],
            "notes": " ".join(["a long remark about the booking"] * 60),
        }
    )


def loop(rounds: int) -> list[Any]:
    """A user turn, then `rounds` of assistant call + tool result."""
    turns = [turn(1, "user", "Please check my reservations.")]
    for n in range(rounds):
        seq = 2 + 2 * n
        turns.append(
            turn(
                seq,
                "assistant",
                "",
                tool_calls=[
                    call(
                        f"c{n}",
                        "get_reservation_details",
                        json.dumps({"reservation_id": f"RES{n:03d}X"}),
                    )
                ],
            )
        )
        turns.append(turn(seq + 1, "tool", reservation(n), tool_call_id=f"c{n}"))
    return turns


def shown_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(
        str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "") for m in messages
    )


def build(turns: list[Any], budget: int, *, tail: int = 0, **extra: Any) -> Any:
    return assemble_prompt(
        AssemblyInput(
            system=SYSTEM,
            turns=turns[tail:],
            tail=turns[:tail],
            chunk_of={t.seq: f"chunk-{t.seq}" for t in turns[:tail]},
            query=extra.pop("query", None),
            budget=budget,
            recall_budget_tokens=extra.pop("recall_budget_tokens", 0),
            top_k=extra.pop("top_k", 0),
            per_item_max_tokens=200,
            value_table_tokens=extra.pop("value_table_tokens", 500),
            **extra,
        )
    )


def test_old_results_become_stubs_before_any_turn_is_left_out() -> None:
    turns = loop(8)
    full = sum(t.token_count for t in turns)
    prompt = build(turns, budget=full * 2 // 3)
    assert prompt.excluded_turns == []  # every turn is there, the oldest results as stubs
    assert prompt.cleared_turns == [3, 5, 7, 9, 11][: len(prompt.cleared_turns)]
    assert prompt.cleared_turns  # something had to go
    newest = [m for m in prompt.messages if m["role"] == "tool"][-3:]
    assert all(m["content"].startswith("{") for m in newest)  # keep 3: verbatim
    text = shown_text(prompt.messages)
    for n in range(8):
        assert f"RES{n:03d}X" in text and f"HAT{n:03d}" in text
    assert prompt.usage["total"] <= full * 2 // 3
    assert messages_tokens(prompt.messages) == prompt.usage["total"]


def test_a_stub_keeps_the_call_and_labelled_values() -> None:
    turns = loop(6)
    prompt = build(turns, budget=sum(t.token_count for t in turns) * 3 // 4)
    stub = next(m for m in prompt.messages if m["role"] == "tool")
    assert stub["content"].startswith(
        '[tool result cleared: get_reservation_details({"reservation_id":"RES000X"})'
    )
    assert "reservation_id: RES000X" in stub["content"]
    assert "flight_number: HAT000" in stub["content"]
    entry = next(e for e in prompt.manifest if e.id == "turn:3")
    assert (entry.source, entry.included) == ("tool_result_stub", True)
    assert entry.tokens < turns[2].token_count


def test_excluded_tools_and_keep_stay_verbatim() -> None:
    turns = loop(6)
    budget = sum(t.token_count for t in turns) * 3 // 4
    prompt = build(turns, budget, clearing=ToolClearing(keep=1, exclude_tools=frozenset({"x"})))
    assert len(prompt.cleared_turns) >= 1
    kept_all = build(
        turns, budget, clearing=ToolClearing(exclude_tools=frozenset({"get_reservation_details"}))
    )
    assert kept_all.cleared_turns == []
    assert kept_all.excluded_turns  # nothing may be cleared: the oldest turns leave instead


def test_clear_at_least_clears_in_steps() -> None:
    turns = loop(8)
    budget = sum(t.token_count for t in turns) - 50  # one stub is enough
    assert len(build(turns, budget).cleared_turns) == 1
    stepped = build(turns, budget, clearing=ToolClearing(clear_at_least=600))
    assert len(stepped.cleared_turns) > 1


def test_the_offloaded_tail_fills_the_budget_and_the_table_holds_what_left() -> None:
    turns = loop(30)
    budget = 4000
    prompt = build(turns, budget, tail=40)
    assert prompt.tail_turns  # offloaded turns are shown before the window
    assert prompt.usage["total"] <= budget
    assert prompt.usage["total"] >= 0.9 * budget  # the budget is used
    text = shown_text(prompt.messages)
    for n in range(30):  # every reservation id is in the prompt: a turn, a stub or the table
        assert f"RES{n:03d}X" in text
    table = next(m for m in prompt.messages if m["content"].startswith("Values from earlier"))
    assert "reservation_id: RES000X" in table["content"]
    # The table comes with the notes, before the transcript, which starts at a stretch boundary.
    assert prompt.messages[1] is table and prompt.tail_turns[0] % stretch_turns(turns, 4000) == 0
    tail_entry = next(e for e in prompt.manifest if e.id == f"turn:{prompt.tail_turns[-1]}")
    assert tail_entry.chunk_id == f"chunk-{prompt.tail_turns[-1]}"


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_consecutive_builds_share_their_head_and_the_start_moves_by_stretches(fmt: str) -> None:
    """A tool loop past its budget: the transcript's start stays where it is for several steps
    and then moves by a whole stretch, the value table with it; in between, a build changes
    only its end (the result that leaves the `keep` newest becomes a stub)."""
    starts: list[int] = []
    previous: Any = None
    for rounds in range(24, 40):
        turns = loop(rounds)
        prompt = build(turns, 4000, tail=2 * rounds - 6, format=fmt)
        assert prompt.usage["total"] <= 4000
        start = prompt.tail_turns[0]
        if previous is not None and start == starts[-1]:
            assert prompt.system == previous.system  # the table did not change
            before, after = previous.messages, prompt.messages
            first = next(n for n, (a, b) in enumerate(zip(before, after, strict=False)) if a != b)
            assert first >= len(before) - 8, (rounds, first, len(before))
        starts.append(start)
        previous = prompt
    moves = [b for a, b in pairwise(starts) if a != b]
    assert stretch_turns(loop(30), 4000) == 8
    assert 1 <= len(moves) <= len(starts) // 3
    assert all(start % 8 == 0 for start in moves)


def test_an_agent_step_puts_what_recall_found_after_the_transcript() -> None:
    """The recalled block changes with every step of a tool loop (its query is the latest
    exchange): after the transcript, two steps that recall different chunks still share every
    message before it; a build with a query keeps the spec's order (recall before the window).
    The build reads the offloaded turns from turn 10 on: the recalled ones are older."""
    turns = loop(30)[9:]
    prompts = [
        build(
            turns,
            4000,
            tail=45,
            recall_budget_tokens=300,
            top_k=1,
            recalled=[item(f"chunk-{seq}", f"user: the old remark {seq}", seq, seq)],
        )
        for seq in (3, 5)
    ]
    for prompt in prompts:
        assert prompt.tail_turns[0] > 5  # anchored in the offloaded tail, past the items' turns
        assert prompt.messages[-1]["role"] == "system"
        assert "the old remark" in prompt.messages[-1]["content"]
        assert prompt.usage["total"] <= 4000
    first, second = (p.messages for p in prompts)
    assert first[:-1] == second[:-1] and first[-1] != second[-1]
    asked = build(
        turns,
        4000,
        tail=45,
        query="Which remark was that?",
        recall_budget_tokens=300,
        top_k=1,
        recalled=[item("chunk-3", "user: the old remark 3", 3, 3)],
    )
    position = next(n for n, m in enumerate(asked.messages) if "the old remark" in m["content"])
    assert position < next(n for n, m in enumerate(asked.messages) if m["role"] == "tool")


def test_an_agent_step_does_not_recall_the_offloaded_turns_it_read() -> None:
    """The offloaded turns an agent's step reads before its window are shown (old results as
    stubs) or have their values in the value table: recalling them again would pay for their
    raw text twice, unless they hold a value the prompt does not show. A build with a query may
    still recall them (the question may need it)."""
    turns = loop(30)
    recalled = [item("chunk-9", "tool: RES003X, the old remark", 9, 9)]
    step = build(turns, 4000, tail=54, recall_budget_tokens=300, top_k=1, recalled=recalled)
    entry = next(e for e in step.manifest if e.id == "chunk-9")
    assert (entry.included, entry.reason) == (False, "in_tail")
    assert "the old remark" not in shown_text(step.messages)
    unseen = [item("chunk-9", "tool: RES003X, the old remark, code QZ7Y91K", 9, 9)]
    step = build(turns, 4000, tail=54, recall_budget_tokens=300, top_k=1, recalled=unseen)
    assert "QZ7Y91K" in shown_text(step.messages)
    asked = build(
        turns,
        4000,
        tail=54,
        query="Which remark?",
        recall_budget_tokens=300,
        top_k=1,
        recalled=recalled,
    )
    assert "the old remark" in shown_text(asked.messages)


def test_the_value_table_says_which_later_call_used_a_value() -> None:
    """A value a later call passed on is ranked first and marked with that call's turn (the
    latest one) when there is room; a value no call used carries no mark."""
    turns = loop(4)
    again = [call(f"c{n}", "cancel_reservation", '{"reservation_id": "RES001X"}') for n in (8, 9)]
    turns += [
        turn(10, "assistant", "", tool_calls=[again[0]]),
        turn(11, "tool", '{"status": "cancelled"}', tool_call_id="c8"),
        turn(12, "assistant", "", tool_calls=[again[1]]),
        turn(13, "tool", '{"status": "cancelled"}', tool_call_id="c9"),
    ]
    history = History(turns, {}, ToolClearing())
    entries = history.table_entries([])
    used = {e.value.value: e.used for e in entries}
    assert used["RES001X"] == 12 and used["RES000X"] is None
    text, _ = fit_table(entries, 500)
    assert "RES001X @12" in text and "RES000X @" not in text
    # Within a small budget the used value is among the first kept, and values come before
    # marks: the mark is left out when it would cost a value.
    small, _ = fit_table(entries, 100)
    assert "RES001X" in small and "RES002X" not in small and "@12" not in small


def test_stretches_scale_with_the_budget_and_small_budgets_have_none() -> None:
    turns = [turn(n, "user", "a short turn " * 20) for n in range(1, 40)]  # ~60 tokens each
    assert stretch_turns(turns, 200) == 1  # a few turns: the start moves turn by turn
    assert stretch_turns(turns, 400) == 4
    assert stretch_turns(turns, 2000) == 16
    assert stretch_turns(turns, 8000) == 64


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_every_call_keeps_its_result_at_every_budget(fmt: str) -> None:
    turns = loop(10)
    for budget in range(300, 4000, 150):
        prompt = build(turns, budget, tail=11, format=fmt)
        assert prompt.usage["total"] <= budget
        shown = [seq for seq in (*prompt.tail_turns, *prompt.included_turns)]
        by_seq = {t.seq: t for t in turns}
        for seq in shown:
            t = by_seq[seq]
            if t.role == "tool":
                assert seq - 1 in shown  # its call
            if t.tool_calls:
                assert seq + 1 in shown  # its result


def test_a_tool_loop_whose_whole_history_fits_gets_the_full_history_prompt() -> None:
    """Offloaded, but every turn from the session's first fits verbatim: the prompt is the full
    history (the notes would only sum it up); a history that does not start at the session's
    first turn keeps its notes."""
    turns = loop(4)
    notes = "Notes (goal, done, open): check the reservations RES000X to RES003X."
    whole = build(turns, 8000, tail=5, notes_block=notes)
    assert [m["content"] for m in whole.messages if m["role"] == "system"] == [SYSTEM[0]["content"]]
    assert whole.cleared_turns == [] and "notes_dropped" not in whole.flags
    entry = next(e for e in whole.manifest if e.id == "notes")
    assert (entry.included, entry.reason) == (False, "history_whole")
    later = build(turns[1:], 8000, tail=4, notes_block=notes)  # turn 1 forgotten or not read
    assert any(m["content"] == notes for m in later.messages)


def test_an_anchored_transcript_never_leaves_out_a_window_turn_for_a_stretch_boundary() -> None:
    """A 2,200-token agent step after a huge result (a layered view of ~1,900 tokens, one of the
    `keep` newest) that the offload moved: the transcript from the stretch boundary before it
    does not fit, so it starts at the window's first turn (seq 30), not at the next boundary
    inside the window (seq 32). Window turns are in no chunk yet: left out, no recall could
    bring them back."""
    turns = loop(12)
    view = "\n".join(
        f"line {i}: flight HAT{100 + i:03d} departs 2024-05-{i % 28 + 1:02d}." for i in range(105)
    )
    fetch = call("c_doc", "fetch_document", '{"url": "https://example.com/policy.txt"}')
    cancel = call("c_cx", "cancel_reservation", '{"reservation_id": "NO6JO3"}')
    update = call("c_up", "update_reservation", '{"reservation_id": "RES000X"}')
    turns += [
        turn(26, "assistant", "All twelve reservations are checked."),
        turn(27, "user", "Fetch the baggage policy, please."),
        turn(28, "assistant", "", tool_calls=[fetch]),
        turn(29, "tool", view, tool_call_id="c_doc"),
        turn(30, "user", "Cancel reservation NO6JO3."),
        turn(31, "assistant", "", tool_calls=[cancel]),
        turn(32, "tool", "Error: NO6JO3 cannot be cancelled: basic economy", tool_call_id="c_cx"),
        turn(33, "assistant", "Sorry, NO6JO3 cannot be cancelled (basic economy)."),
        turn(34, "user", "Then move RES000X to the earliest flight on 23 May."),
        turn(35, "assistant", "", tool_calls=[update]),
        turn(36, "tool", '{"status": "updated", "flight_number": "HAT230"}', tool_call_id="c_up"),
    ]
    assert 1500 < turns[28].token_count < 2000
    assert stretch_turns(turns, 2200) == 4  # boundaries at seqs 28 and 32 here
    prompt = build(turns, 2200, tail=29)
    assert prompt.usage["total"] <= 2200
    assert prompt.tail_turns == []  # from the boundary before the huge result: no room
    assert prompt.excluded_turns == []
    text = shown_text(prompt.messages)
    assert "basic economy" in text and "Cancel reservation NO6JO3." in text
    assert prompt.messages[1]["content"].startswith("Values from earlier")  # what is left out
