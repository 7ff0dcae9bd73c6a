"""Tool-result clearing, the first step of the degradation waterfall (pure, no I/O).

When the transcript does not fit, old tool results go before any user or assistant turn: each
becomes a stub holding the call (tool and arguments), the values the result returned with their
field names (`app.notes.values`), its size and the chunk holding its raw text. Stubs are made
oldest first and at least `clear_at_least` tokens at a time, so the cleared part of the prompt
moves in steps. The results of `exclude_tools` are never cleared; the `keep` newest only when not
even the newest step fits otherwise.

`History` is what a build may show of a session's transcript: the newest offloaded turns (the
"tail", each with its chunk id) followed by the window (C1). It pairs every tool result with its
call (the latest earlier call with that id that has no result yet), and makes each stub once.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.domain.records import TurnRecord
from app.domain.tokens import count_tokens, message_tokens
from app.domain.tool_groups import call_name, tool_pairs
from app.notes.values import (
    STUB_PREFIX,
    VALUE_TABLE_HEADER,
    StubSource,
    TableRow,
    Value,
    call_values,
    compact_arguments,
    identifying,
    ranked_values,
    render_stub,
    render_table,
    result_values,
)

# The values part of one stub at most, tokens: enough for a user's ids and reservations or a
# search's flight numbers and dates; the rest of a long result is one recall away.
STUB_VALUE_TOKENS = 120
# Framing of one value in a rendered line ("key: value; "), tokens, beyond its own.
_PAIR_TOKENS = 2
_LINE_TOKENS = 4  # "- " before a table row's label and ": " after it


@dataclass(frozen=True, slots=True)
class ToolClearing:
    """The controls, named after the model vendors' own context editing (Anthropic's
    `clear_tool_uses`): keep the `keep` newest results verbatim, never clear `exclude_tools`,
    clear at least `clear_at_least` tokens at a time, and whether the cleared results' call
    arguments are cleared too (the stub still names them)."""

    keep: int = 3
    exclude_tools: frozenset[str] = frozenset()
    clear_at_least: int = 0
    clear_tool_inputs: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    tool: str
    arguments: Any
    assistant_seq: int


def _value_cost(value: Value) -> int:
    return count_tokens(value.value) + (count_tokens(value.key) if value.key else 0) + _PAIR_TOKENS


def budgeted(values: Sequence[Value], max_tokens: int) -> list[Value]:
    """The most identifying values (`ranked_values`) whose rendering stays within `max_tokens`
    (estimated per value)."""
    kept: list[Value] = []
    used = 0
    for value in ranked_values(values):
        cost = _value_cost(value)
        if used + cost > max_tokens:
            continue
        kept.append(value)
        used += cost
    return kept


@dataclass(slots=True)
class History:
    """The turns a build may show, oldest first: the offloaded tail then the window, paired
    (`paired_turns`)."""

    turns: Sequence[TurnRecord]
    chunk_of: Mapping[int, str]
    clearing: ToolClearing
    calls: dict[int, Call] = field(init=False)  # a tool result's seq -> its call
    order: list[int] = field(init=False)  # the results' seqs in the order they are cleared
    rank: dict[int, int] = field(init=False)  # a result's place in `order`
    unkept: int = field(init=False)  # how many of `order` come before the `keep` newest
    # Whether any turn made a tool call (only then is there a value table to make).
    has_values: bool = field(init=False)
    _values: dict[int, list[Value]] = field(init=False, default_factory=dict)
    kept_in_stub: dict[int, list[Value]] = field(init=False, default_factory=dict)
    stubs: dict[int, TurnRecord] = field(init=False, default_factory=dict)  # by seq, once made

    def __post_init__(self) -> None:
        self.calls = {}
        self.has_values = any(t.tool_calls for t in self.turns)
        pairs = tool_pairs(self.turns) if self.has_values else {}
        for at, (i, j) in pairs.items():
            call = (self.turns[i].tool_calls or [])[j]
            self.calls[self.turns[at].seq] = Call(
                call_name(call), (call.get("function") or {}).get("arguments"), self.turns[i].seq
            )
        excluded = {
            seq for seq, call in self.calls.items() if call.tool in self.clearing.exclude_tools
        }
        results = [t.seq for t in self.turns if t.role == "tool" and t.seq not in excluded]
        kept = len(results) - self.clearing.keep
        # The oldest results first; the `keep` newest (the last of the order) only when the
        # transcript cannot fit otherwise: a stub is better than the turns around it left out.
        self.order = results
        self.rank = {seq: n for n, seq in enumerate(self.order)}
        self.unkept = max(kept, 0)

    @property
    def end(self) -> int:
        """One past the newest turn's seq (0 when there is none)."""
        return max((t.seq for t in self.turns), default=-1) + 1

    def values(self, turn: TurnRecord) -> list[Value]:
        """The values a tool result returned (for another turn: the values of its calls)."""
        if turn.seq not in self._values:
            if turn.role == "tool":
                found = result_values(turn.content)
            else:
                found = [
                    v
                    for call in turn.tool_calls or []
                    for v in call_values((call.get("function") or {}).get("arguments"))
                ]
            self._values[turn.seq] = found
        return self._values[turn.seq]

    def stub(self, turn: TurnRecord) -> TurnRecord:
        """The tool result `turn` as its stub, a turn of the same seq and call id (the turn
        itself when its stub would cost as much: a short result is its own best stub)."""
        if turn.seq not in self.stubs:
            call = self.calls.get(turn.seq)
            values = self.values(turn)
            source = StubSource(
                tool=call.tool if call else "tool",
                arguments=compact_arguments(call.arguments) if call else "",
                values=values,
                tokens=turn.token_count,
                seq=turn.seq,
                chunk_id=self.chunk_of.get(turn.seq),
            )
            kept = budgeted(values, STUB_VALUE_TOKENS)
            self.kept_in_stub[turn.seq] = kept
            text = render_stub(source, kept)
            tokens = message_tokens("tool", text, turn.name, None, turn.tool_call_id)
            smaller = tokens < turn.token_count
            self.stubs[turn.seq] = (
                replace(turn, content=text, token_count=tokens) if smaller else turn
            )
        return self.stubs[turn.seq]

    def is_stub(self, turn: TurnRecord) -> bool:
        """Whether `turn` is a stub made for its seq (not the turn as stored)."""
        if not self.stubs:
            return False
        stub = self.stubs.get(turn.seq)
        return stub is turn and stub.content.startswith(STUB_PREFIX)

    def cleared(self, group: Sequence[TurnRecord], count: int) -> list[TurnRecord]:
        """`group` with the first `count` results of the clearing order as their stubs (and,
        with `clear_tool_inputs`, the arguments of calls whose results are all stubs emptied)."""
        out = [self.stub(t) if self.rank.get(t.seq, count) < count else t for t in group]
        if not self.clearing.clear_tool_inputs:
            return out
        stubbed = {
            self.calls[t.seq].assistant_seq
            for t in out
            if self.rank.get(t.seq, count) < count and t.seq in self.calls
        }
        return [_without_arguments(t) if t.seq in stubbed else t for t in out]

    def clearing_points(self) -> list[int]:
        """The counts of cleared results worth trying, fewest first, merged so that each step
        clears at least `clear_at_least` tokens (the raw results' tokens less their stubs')."""
        points: list[int] = []
        freed = 0
        by_seq = {t.seq: t for t in self.turns}
        for count, seq in enumerate(self.order, 1):
            turn = by_seq[seq]
            freed += turn.token_count - self.stub(turn).token_count
            if freed >= self.clearing.clear_at_least:
                points.append(count)
                freed = 0
        if freed:
            points.append(len(self.order))
        return points

    def table_entries(self, shown: Sequence[TurnRecord], elsewhere: str = "") -> list["TableEntry"]:
        """The value table's candidates: each value of a result or call that is not among the
        `shown` turns (as shown: a stub holds some of its result's values) and that neither a
        shown turn nor the text `elsewhere` in the prompt holds, once, under the result (or
        call) that first held it, with the latest later call that passed it on."""
        held = {
            v.value
            for t in shown
            if t.role in ("tool", "assistant")
            for v in (self.kept_in_stub[t.seq] if self.is_stub(t) else self.values(t))
        }
        said = "\n".join(
            [elsewhere, *(t.content for t in shown if t.role in ("user", "assistant"))]
        )
        entries: dict[str, TableEntry] = {}
        for turn in self.turns:
            if turn.role not in ("tool", "assistant"):
                continue
            for value in self.values(turn):
                entry = entries.get(value.value)
                if entry is not None:
                    if turn.role == "assistant" and turn.seq > entry.seq:
                        entry.used = turn.seq
                    continue
                if value.value in held or value.value in said:
                    continue
                entries[value.value] = TableEntry(value, turn.seq, self._label(turn))
        return list(entries.values())

    def stable_table_entries(self, shown: Sequence[TurnRecord]) -> list["TableEntry"]:
        """The value table's candidates when the transcript starts at `shown[0]`: every value of
        the results and calls before it, and those of shown stubs their stubs do not keep;
        used by the calls before it only, so that the table changes only when the start moves."""
        first = shown[0].seq if shown else self.end
        stubbed = {t.seq for t in shown if self.is_stub(t)}
        entries: dict[str, TableEntry] = {}
        for turn in self.turns:
            if turn.role not in ("tool", "assistant") or (
                turn.seq >= first and turn.seq not in stubbed
            ):
                continue
            kept = set(self.kept_in_stub.get(turn.seq, ())) if turn.seq in stubbed else set()
            for value in self.values(turn):
                entry = entries.get(value.value)
                if entry is not None:
                    if turn.role == "assistant" and turn.seq > entry.seq:
                        entry.used = turn.seq
                    continue
                if value in kept:
                    continue
                entries[value.value] = TableEntry(value, turn.seq, self._label(turn))
        return list(entries.values())

    def _label(self, turn: TurnRecord) -> str:
        if turn.role == "tool":
            call = self.calls.get(turn.seq)
            return f"{call.tool if call else 'tool'} result, turn {turn.seq}"
        names = ", ".join(str((c.get("function") or {}).get("name")) for c in turn.tool_calls or [])
        return f"{names} call, turn {turn.seq}"


def _without_arguments(turn: TurnRecord) -> TurnRecord:
    calls = [
        {**c, "function": {**(c.get("function") or {}), "arguments": "{}"}}
        for c in turn.tool_calls or []
    ]
    tokens = message_tokens(turn.role, turn.content, turn.name, calls, turn.tool_call_id)
    return replace(turn, tool_calls=calls, token_count=tokens)


@dataclass(slots=True)
class TableEntry:
    """A value of the value table: where it was first seen, and the latest later call that
    passed it on (None: none did)."""

    value: Value
    seq: int
    label: str
    used: int | None = None

    @property
    def cost(self) -> int:
        return _value_cost(self.value)


def fit_table(entries: Sequence[TableEntry], max_tokens: int) -> tuple[str, int]:
    """The value table within `max_tokens` (as a system message): the most identifying values
    first, among them those a call used, then the cheapest, then the newest; (text, tokens) —
    ("", 0) when nothing fits. The turn that last used a value is marked only when the marks
    fit beside the values chosen without them: a value is worth more than when it was used."""
    if max_tokens <= 0 or not entries:
        return "", 0
    ranked = sorted(
        entries, key=lambda e: (-identifying(e.value.value), e.used is None, e.cost, -e.seq)
    )
    used = message_tokens("system", VALUE_TABLE_HEADER)
    rows: set[int] = set()
    chosen: list[TableEntry] = []
    for entry in ranked:
        cost = entry.cost + (0 if entry.seq in rows else count_tokens(entry.label) + _LINE_TOKENS)
        if used + cost > max_tokens:
            continue
        chosen.append(entry)
        rows.add(entry.seq)
        used += cost
    # Each row lists its values as the result did, whatever their rank: a value a new call
    # uses moves up the ranking, not along its row.
    listed = {id(entry): n for n, entry in enumerate(entries)}
    while chosen:
        in_order = sorted(chosen, key=lambda e: listed[id(e)])
        marks = any(e.used is not None for e in in_order)
        for marked in (True, False) if marks else (False,):
            text = render_table(_rows(in_order, marked))
            tokens = message_tokens("system", text)
            if tokens <= max_tokens:
                return text, tokens
        chosen.pop()  # the estimate was short: the last chosen, least ranked, goes
    return "", 0


def _rows(entries: Sequence[TableEntry], marked: bool) -> list[TableRow]:
    by_seq: dict[int, list[TableEntry]] = {}
    for entry in entries:
        by_seq.setdefault(entry.seq, []).append(entry)
    return [
        TableRow(
            group[0].label,
            seq,
            [e.value for e in group],
            {e.value: e.used for e in group if e.used is not None} if marked else {},
        )
        for seq, group in by_seq.items()
    ]
