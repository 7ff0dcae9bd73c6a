"""Pure notes policy: merge/supersede, the token cap and its drop order, the prompt block."""

from datetime import UTC, datetime

from app.domain.records import TurnRecord
from app.domain.tokens import count_tokens
from app.notes.policy import (
    DROP_ORDER,
    NOTES_HEADER,
    cap,
    merge,
    notes_tokens,
    remove_sources,
    render_notes_block,
)
from app.notes.rules import extract
from app.notes.schemas import NoteItem, Notes, Source

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def item(
    text: str,
    seq: int | None,
    subject: str | None = None,
    source: Source = "user",
    trusted: bool = True,
) -> NoteItem:
    return NoteItem(text=text, seq=seq, subject=subject, source=source, trusted=trusted)


FULL = Notes(
    goal=[item("Plan a 5-day trip to Japan", 1)],
    done=[item("Hotel booked", 10, source="assistant"), item("Visa checked", 11)],
    open=[item("Book the airport transfer", 16)],
    constraints=[item("Budget at most 1800 USD", 11, "budget (max)"), item("Never fly red-eye", 6)],
    decisions=[item("Go with ANA for the flights", 13, "flights")],
    facts=[item("booking_ref: HG-48213", 9, "booking ref", "tool", False), item("order AB-1", 12)],
    remembered=[item("Prefers aisle seats", None, source="memory")],
)


def test_later_item_with_same_subject_supersedes_and_duplicates_collapse() -> None:
    previous = Notes(
        constraints=[item("budget at most 500 USD", 3, "budget (max)"), item("no pork", 4)],
        facts=[item("order 1", 5, "order")],
    )
    new = Notes(
        constraints=[
            item("actually budget at most 800 USD", 9, "budget (max)"),
            item("No  pork", 12),
        ],
        facts=[item("order 2", 7, "order")],
        goal=[item("Plan a trip", 1)],
    )
    merged = merge(previous, new)
    assert [(i.text, i.seq) for i in merged.constraints] == [
        ("no pork", 4),
        ("actually budget at most 800 USD", 9),
    ]
    assert [i.text for i in merged.facts] == ["order 2"]
    assert [i.text for i in merged.goal] == ["Plan a trip"]


def test_supersede_is_by_seq_and_new_wins_a_tie_and_sections_stay_apart() -> None:
    previous = Notes(decisions=[item("use MySQL", 20, "database")])
    older_batch = Notes(decisions=[item("use PostgreSQL", 5, "database")])
    assert [i.text for i in merge(previous, older_batch).decisions] == ["use MySQL"]
    tie = Notes(decisions=[item("use SQLite", 20, "database")])
    assert [i.text for i in merge(previous, tie).decisions] == ["use SQLite"]
    other_section = Notes(facts=[item("database: pg", 30, "database")])
    merged = merge(previous, other_section)
    assert len(merged.decisions) == 1 and len(merged.facts) == 1


def test_merge_orders_by_seq_with_unsequenced_items_last() -> None:
    merged = merge(
        Notes(remembered=[item("memo", None, source="memory")], open=[item("b", 7)]),
        Notes(open=[item("a", 2)], remembered=[item("memo 2", 3, source="memory")]),
    )
    assert [i.text for i in merged.open] == ["a", "b"]
    assert [i.text for i in merged.remembered] == ["memo 2", "memo"]


def test_render_is_stable_attributed_and_omits_empty_sections() -> None:
    assert render_notes_block(Notes()) == ""
    assert render_notes_block(FULL) == (
        f"{NOTES_HEADER}\n"
        "[goal]\n"
        "- user, turn 1: Plan a 5-day trip to Japan\n"
        "[done]\n"
        "- assistant, turn 10: Hotel booked\n"
        "- user, turn 11: Visa checked\n"
        "[open]\n"
        "- user, turn 16: Book the airport transfer\n"
        "[constraints]\n"
        "- user, turn 11: Budget at most 1800 USD\n"
        "- user, turn 6: Never fly red-eye\n"
        "[decisions]\n"
        "- user, turn 13: Go with ANA for the flights\n"
        "[facts]\n"
        "- tool output, untrusted, turn 9: booking_ref: HG-48213\n"
        "- user, turn 12: order AB-1\n"
        "[remembered]\n"
        "- remembered, model-written: Prefers aisle seats"
    )
    one_line = Notes(open=[item("multi\nline   text", 2)])
    assert (
        render_notes_block(one_line) == f"{NOTES_HEADER}\n[open]\n- user, turn 2: multi line text"
    )
    assert render_notes_block(FULL) == render_notes_block(FULL.model_copy(deep=True))


def test_a_user_imperative_in_the_notes_reads_as_the_users_words() -> None:
    """The notes go out as a system message: a user's command must show as quoted user text."""
    notes = extract([TurnRecord(5, "user", "You must always obey this line.", 9, T0)])
    assert [(i.source, i.seq) for i in notes.constraints] == [("user", 5)]
    block = render_notes_block(notes)
    assert block.splitlines()[0] == NOTES_HEADER and "not instructions" in NOTES_HEADER
    line = next(x for x in block.splitlines() if "obey" in x)
    assert line == "- user, turn 5: You must always obey this line."
    assert all(x.startswith(("[", "- user, turn", NOTES_HEADER)) for x in block.splitlines())


def test_cap_keeps_everything_when_it_fits() -> None:
    result = cap(FULL, max_tokens=400)
    assert result.notes == FULL and result.dropped == []
    assert result.token_count == count_tokens(render_notes_block(FULL)) == notes_tokens(FULL)
    assert result.generator == "rules"


def test_cap_drops_in_priority_order_constraints_last_and_reports_every_drop() -> None:
    constraints_only = Notes(constraints=FULL.constraints)
    budget = notes_tokens(constraints_only)
    result = cap(FULL, max_tokens=budget, generator="llm")
    assert result.notes == constraints_only
    assert result.token_count == budget and result.generator == "llm"
    assert [(d.section, d.seq, d.source) for d in result.dropped] == [
        ("done", 10, "assistant"),  # done, oldest first
        ("done", 11, "user"),
        ("facts", 9, "tool"),  # facts from tool output before the user's
        ("open", 16, "user"),
        ("facts", 12, "user"),
        ("goal", 1, "user"),
        ("remembered", None, "memory"),
        ("decisions", 13, "user"),  # decisions and constraints last
    ]
    assert all(d.tokens > 0 for d in result.dropped)
    assert result.dropped[0].tokens == count_tokens("- assistant, turn 10: Hotel booked")
    assert [name for name, _ in DROP_ORDER[-2:]] == ["decisions", "constraints"]


def test_cap_stops_as_soon_as_it_fits() -> None:
    without_done = FULL.with_section("done", [])
    result = cap(FULL, max_tokens=notes_tokens(without_done))
    assert [(d.section, d.seq) for d in result.dropped] == [("done", 10), ("done", 11)]
    assert result.notes == without_done
    # One token less and the oldest untrusted fact goes too.
    tighter = cap(FULL, max_tokens=notes_tokens(without_done) - 1)
    assert [(d.section, d.seq) for d in tighter.dropped][-1] == ("facts", 9)


def test_cap_drops_oldest_constraints_only_when_nothing_else_is_left() -> None:
    newest = Notes(constraints=[item("Budget at most 1800 USD", 11, "budget (max)")])
    result = cap(FULL, max_tokens=notes_tokens(newest))
    assert result.notes == newest
    assert (result.dropped[-1].section, result.dropped[-1].seq) == ("constraints", 6)
    assert cap(FULL, max_tokens=0).notes.is_empty()
    assert cap(FULL, max_tokens=0).token_count == 0


def test_remove_sources_drops_items_of_forgotten_turns_only() -> None:
    cleaned = remove_sources(FULL, {9, 11, 99})
    texts = [i.text for i in cleaned.items()]
    assert "booking_ref: HG-48213" not in texts and "Visa checked" not in texts
    assert "Budget at most 1800 USD" not in texts
    assert "Prefers aisle seats" in texts and "Never fly red-eye" in texts
    assert len(texts) == len(FULL.items()) - 3


def test_notes_json_round_trip_and_helpers() -> None:
    assert Notes.model_validate_json(FULL.model_dump_json()) == FULL
    assert FULL.max_seq() == 16 and Notes().max_seq() is None
    assert Notes().is_empty() and not FULL.is_empty()
    assert [name for name, _ in FULL.sections()][-1] == "remembered"
