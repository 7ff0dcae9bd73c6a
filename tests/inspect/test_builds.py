"""A stored build as the inspector shows it, without a database: each fragment's part, turns and
link, the budget as consecutive parts, and what was left out grouped by reason."""

from datetime import UTC, datetime
from typing import Any

from app.inspect.builds import Anchors, build_view

RECALLED, OVER, TAIL_CHUNK = "c1d0-recalled", "c1d0-over", "c1d0-tail"


def entry(
    entry_id: str,
    layer: str,
    source: str,
    tokens: int,
    reason: str | None = None,
    chunk_id: str | None = None,
) -> dict[str, Any]:
    return {
        "id": entry_id,
        "layer": layer,
        "source": source,
        "tokens": tokens,
        "score": 0.5 if layer == "c3" and not entry_id.startswith("turn:") else None,
        "included": reason is None,
        "reason": reason,
        "chunk_id": chunk_id,
    }


RECORD = {
    "usage": {"total": 400, "limit": 1000},
    "recall": {"items": [{"chunk_id": RECALLED, "turn_range": [2, 4]}]},
    "manifest": [
        entry("c0:system", "c0", "request.system", 50),
        entry("notes", "c2", "scratchpad", 40),
        entry("m-1", "c2", "memory", 15, "over_budget"),
        entry(RECALLED, "c3", "chunk", 60),
        entry(OVER, "c3", "chunk", 90, "over_budget"),
        entry("values", "c2", "tool_values", 20),
        entry("turn:7", "c3", "tool_result_stub", 30, chunk_id=TAIL_CHUNK),
        entry("turn:9", "c1", "user", 70, "window_truncated"),
        entry("turn:10", "c1", "assistant", 80, "window_truncated"),
        entry("turn:11", "c1", "tool_result_stub", 25),
        entry("turn:12", "c1", "user", 45),
        entry("query", "query", "request.query", 10),
    ],
}
ANCHORS = Anchors(frozenset({11, 12}), [(RECALLED, 2, 4), (OVER, 5, 6), (TAIL_CHUNK, 7, 8)])


def view() -> Any:
    return build_view(
        "b-1",
        datetime(2026, 12, 6, tzinfo=UTC),
        RECORD,
        chunk_turns={OVER: (5, 6)},
        anchors=ANCHORS,
        width=1000,
    )


def test_each_fragment_has_its_part_turns_and_link() -> None:
    rows = {f.id: (f.part, f.turns, f.href, f.chunk_href) for f in view().fragments}
    assert rows == {
        "c0:system": ("system", None, None, None),
        "notes": ("notes", None, "#notes", None),
        "m-1": ("about_user", None, "#memory-m-1", None),
        RECALLED: ("recalled", (2, 4), f"#chunk-{RECALLED}", None),
        OVER: ("recalled", (5, 6), f"#chunk-{OVER}", None),  # its range from the chunk itself
        "values": ("values", None, None, None),
        # an offloaded turn: its chunk's row; a cleared result: the chunk of its raw text too
        "turn:7": ("tail", (7, 7), f"#chunk-{TAIL_CHUNK}", f"#chunk-{TAIL_CHUNK}"),
        "turn:9": ("window", (9, 9), None, None),  # offloaded since, in no chunk shown
        "turn:10": ("window", (10, 10), None, None),
        "turn:11": ("window", (11, 11), "#turn-11", None),
        "turn:12": ("window", (12, 12), "#turn-12", None),
        "query": ("query", None, None, None),
    }
    assert [f.id for f in view().stubs] == ["turn:7", "turn:11"]


def test_budget_parts_add_up_to_the_limit_in_prompt_order() -> None:
    parts = [(p.part, p.tokens, p.x, p.width) for p in view().budget]
    assert parts == [
        ("system", 50, 0.0, 50.0),
        ("notes", 40, 50.0, 40.0),
        ("recalled", 60, 90.0, 60.0),
        ("values", 20, 150.0, 20.0),
        ("tail", 30, 170.0, 30.0),
        ("window", 70, 200.0, 70.0),
        ("query", 10, 270.0, 10.0),
        ("framing", 120, 280.0, 120.0),  # the total beyond the fragments
        ("left", 600, 400.0, 600.0),
    ]


def test_left_out_is_grouped_by_part_and_reason() -> None:
    groups = [(g.part, g.reason, g.count, g.tokens, g.turns) for g in view().left_out]
    assert groups == [
        ("about_user", "over_budget", 1, 15, None),
        ("recalled", "over_budget", 1, 90, (5, 6)),
        ("window", "window_truncated", 2, 150, (9, 10)),
    ]


def test_a_total_over_the_limit_is_scaled_into_the_bar_with_nothing_left() -> None:
    record = {**RECORD, "usage": {"total": 2000, "limit": 1000}}
    built = build_view(
        "b-2",
        datetime(2026, 12, 6, tzinfo=UTC),
        record,
        chunk_turns={},
        anchors=ANCHORS,
        width=1000,
    )
    assert "left" not in [p.part for p in built.budget]
    assert sum(p.width for p in built.budget) == 1000.0
