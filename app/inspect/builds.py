"""A stored build seen by the inspector, pure (no I/O): each fragment of its manifest with the
part of the prompt it belongs to, its turns and where the page shows them, and the budget as
consecutive parts (what each took, the framing, what was left) with what was left out and why.

A manifest (`app.prompt.assembly._manifest`) lists every candidate in prompt order: `c0:system`,
`c0:tools`, `notes`, the user's remembered items (c2), recalled chunks and items (c3), `values`
(the value table), the offloaded tail's turns (c3, `turn:N`), the window's turns (c1, `turn:N`,
a cleared tool result as source `tool_result_stub`) and the `query`.
"""

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# The parts of a prompt, in prompt order, with the names the page shows.
PARTS = {
    "system": "C0 system",
    "tools": "C0 tools",
    "notes": "notes",
    "about_user": "about the user",
    "recalled": "recalled",
    "values": "value table",
    "tail": "offloaded tail",
    "window": "window",
    "query": "query",
    "framing": "framing",
    "left": "left",
}
TOOL_RESULT_STUB = "tool_result_stub"


@dataclass(frozen=True)
class Fragment:
    id: str
    part: str
    layer: str
    source: str
    tokens: int
    score: float | None
    included: bool
    reason: str | None
    turns: tuple[int, int] | None  # the turns it holds, first..last
    href: str | None  # where the page shows those turns
    chunk_id: str | None  # the chunk holding the raw text (an offloaded turn, a cleared result)
    chunk_href: str | None

    @property
    def is_stub(self) -> bool:
        return self.source == TOOL_RESULT_STUB


@dataclass(frozen=True)
class BudgetPart:
    part: str
    label: str
    tokens: int
    x: float
    width: float


@dataclass(frozen=True)
class LeftOut:
    part: str
    reason: str
    count: int
    tokens: int
    turns: tuple[int, int] | None  # first..last turn of what was left out, when turns


@dataclass(frozen=True)
class BuildView:
    build_id: str
    created_at: datetime
    record: dict[str, Any]
    fragments: list[Fragment]
    budget: list[BudgetPart]
    left_out: list[LeftOut]

    @property
    def stubs(self) -> list[Fragment]:
        return [f for f in self.fragments if f.is_stub]


@dataclass
class Anchors:
    """Where the session page shows a turn: its row in the window table, else the row of a
    shown chunk that covers it (`chunks`: id, first turn, last turn, ordered by first turn)."""

    window: frozenset[int]
    chunks: Sequence[tuple[str, int, int]]
    firsts: list[int] = field(init=False)
    shown_chunks: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.firsts = [first for _, first, _ in self.chunks]
        self.shown_chunks = frozenset(chunk_id for chunk_id, _, _ in self.chunks)

    def turn(self, seq: int) -> str | None:
        if seq in self.window:
            return f"#turn-{seq}"
        # chunks cover disjoint turn ranges: the last one starting at or before `seq`, if any
        at = bisect_right(self.firsts, seq) - 1
        if at >= 0 and self.chunks[at][2] >= seq:
            return f"#chunk-{self.chunks[at][0]}"
        return None

    def chunk(self, chunk_id: str | None) -> str | None:
        return f"#chunk-{chunk_id}" if chunk_id in self.shown_chunks else None


def part_of(entry: Mapping[str, Any]) -> str:
    """The part of the prompt a manifest entry belongs to."""
    entry_id, layer = entry["id"], entry["layer"]
    if entry_id == "c0:system":
        return "system"
    if entry_id == "c0:tools":
        return "tools"
    if entry_id == "notes":
        return "notes"
    if entry_id == "values":
        return "values"
    if layer == "query":
        return "query"
    if layer == "c1":
        return "window"
    if layer == "c2":
        return "about_user"
    return "tail" if entry_id.startswith("turn:") else "recalled"


def build_view(
    build_id: str,
    created_at: datetime,
    record: dict[str, Any],
    *,
    chunk_turns: Mapping[str, tuple[int, int]],
    anchors: Anchors,
    width: int = 760,
) -> BuildView:
    """The fragments of one stored build (`record`: the build-prompt response as stored), each
    with its turns: a turn's own seq, a chunk's range (from the build's recall items, else
    `chunk_turns`); and the budget bar scaled so that the limit spans `width`."""
    recalled_ranges = {
        item["chunk_id"]: (item["turn_range"][0], item["turn_range"][1])
        for item in record.get("recall", {}).get("items", [])
        if item.get("turn_range")
    }
    fragments = []
    for entry in record.get("manifest", []):
        part = part_of(entry)
        entry_id = entry["id"]
        turns: tuple[int, int] | None = None
        href: str | None = None
        if entry_id.startswith("turn:"):
            seq = int(entry_id.removeprefix("turn:"))
            turns, href = (seq, seq), anchors.turn(seq)
        elif part == "recalled" and entry["source"] == "chunk":
            turns = recalled_ranges.get(entry_id) or chunk_turns.get(entry_id)
            href = anchors.chunk(entry_id) or (anchors.turn(turns[0]) if turns else None)
        elif entry["source"] == "memory":
            href = f"#memory-{entry_id}"
        elif part == "notes":
            href = "#notes"
        chunk_id = entry.get("chunk_id")
        fragments.append(
            Fragment(
                id=entry_id,
                part=part,
                layer=entry["layer"],
                source=entry["source"],
                tokens=int(entry["tokens"]),
                score=entry.get("score"),
                included=bool(entry["included"]),
                reason=entry.get("reason"),
                turns=turns,
                href=href,
                chunk_id=chunk_id,
                chunk_href=anchors.chunk(chunk_id),
            )
        )
    usage = record.get("usage", {})
    return BuildView(
        build_id=build_id,
        created_at=created_at,
        record=record,
        fragments=fragments,
        budget=budget_parts(
            fragments, int(usage.get("total", 0)), int(usage.get("limit", 0)), width
        ),
        left_out=left_out(fragments),
    )


def budget_parts(
    fragments: Sequence[Fragment], total: int, limit: int, width: int
) -> list[BudgetPart]:
    """What each part of the prompt took, in prompt order, then the framing (message overhead,
    reply priming: the total beyond the fragments) and what was left of the limit; scaled so
    that the limit (or a larger total) spans `width`."""
    taken: dict[str, int] = {}
    for fragment in fragments:
        if fragment.included:
            taken[fragment.part] = taken.get(fragment.part, 0) + fragment.tokens
    framing = total - sum(taken.values())
    if framing > 0:
        taken["framing"] = framing
    if limit > total:
        taken["left"] = limit - total
    scale = width / max(limit, total, 1)
    parts, x = [], 0.0
    for part, tokens in taken.items():
        parts.append(BudgetPart(part, PARTS[part], tokens, x, tokens * scale))
        x += tokens * scale
    return parts


def left_out(fragments: Sequence[Fragment]) -> list[LeftOut]:
    """The fragments left out, by part and reason: how many, their tokens, their turns."""
    groups: dict[tuple[str, str], list[Fragment]] = {}
    for fragment in fragments:
        if not fragment.included:
            groups.setdefault((fragment.part, fragment.reason or "—"), []).append(fragment)
    out = []
    for (part, reason), members in groups.items():
        seqs = [seq for f in members if f.turns for seq in f.turns]
        out.append(
            LeftOut(
                part=part,
                reason=reason,
                count=len(members),
                tokens=sum(f.tokens for f in members),
                turns=(min(seqs), max(seqs)) if seqs else None,
            )
        )
    return out
