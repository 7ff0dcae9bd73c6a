"""Prompt assembly: the pure policy that turns the layers into a message list within budget.

Order (stable parts first, so prompt-prefix caches hit):
C0 system messages → C2 notes block → "about this user" block → recalled-history block → value
table → offloaded tail → C1 turns → x_t. An agent's step in a tool loop (no x_t) puts the two
found blocks last, after the transcript: they change with every step of its loop. Past its
budget (`fitting.anchored_transcript`, item 6 below) it also puts the value table first and the
notes after the transcript: the head then changes only when the transcript's start moves (OpenAI
format; in Anthropic format the blocks are the system string, where any change is a change of the
whole).

Precedence when the budget is short (`budget` = C - r):
1. x_t and C0 are mandatory. If they alone (plus reply priming and tool schemas) exceed the
   budget, `PromptTooLarge` is raised with the figures: nothing is ever cut silently.
2. The C2 notes block next, whole or not at all (`notes_dropped`). Notes are a few hundred tokens
   and carry the hard constraints and key facts of offloaded history, which exist nowhere else in
   the prompt; the spec says constraints are never dropped for space before anything else.
3. C1 turns from the newest backwards, as a contiguous recent tail. A tool call and its results
   form one group that is kept or left out whole (`blocks.paired_turns` first drops pending calls
   and orphan results). Old tool results become stubs (`clearing`) before any turn is left out,
   the `keep` newest last; the value table's room (values of results and calls that no shown
   turn nor the kept notes hold) comes before old results stay whole. When not even the newest
   group fits beside that room, it alone comes first, then the table, then older turns with what
   the table leaves. When the oldest turns must be left out the flag `window_truncated` is set
   (the caller should offload and tighten k).
4. The "about this user" block (remembered items of the session's user, ranked against the
   query) gets what is left, at most its own small budget, up to its top-k, the same way as
   recall below; it is counted in C2 (remembered items are notes).
5. Recall gets what is left, at most B: items in rank order, each counted with its framing; an
   item that does not fit is skipped (`over_budget`) and the next tried, up to `top_k` items.
   Items whose whole turn range is already in the prompt's C1 are skipped (`in_window`); in an
   agent's step, also those within the offloaded turns the build read whose values the prompt
   shows in stubs, the value table or the notes (`in_tail`: far cheaper than their raw text). A
   chunk comes whole when it fits, else as its compact version (the turns that answer the
   query); one whose whole text would take over `COMPACT_FIRST_SHARE` of the budget comes compact
   first, so a small budget holds more distinct pieces of evidence. The items adjacent to one of
   the first B / `NEIGHBOUR_OF_FIRST_TOKENS` (the turns just before or after it) are tried right
   after it when they ranked among the first B / `NEIGHBOUR_TOKENS` too (`neighbour_order`):
   evidence often sits next to the best hit, and both scoring says the stretch is about the
   question. A chosen item whose turns continue another's (same UTC day, same trust) is rendered
   with it under one header (`blocks.stretch_header`): the ~26-token header is paid once. An
   item that says again what a chosen one says (`recall.rerank.repeats`: over 90 % of its words
   are in that one's and what it adds holds no number) is skipped (`near_duplicate`): repetitive
   small talk would otherwise fill the budget with the same lines.
6. The offloaded tail (the newest offloaded turns, `AssemblyInput.tail`) then fills what is left,
   newest first, its old results as stubs; the value table gets its room and what the tail left.
   In a session with tool calls, a tail that fits whole and verbatim comes before recall instead
   (recall then skips what it shows), as truncation would show it. When it does not, and the
   budget holds enough turns for it (`stretch_turns`), an agent's step (a build with no x_t)
   shows the transcript (tail and window, every result but the `keep` newest as a stub) from the
   oldest stretch boundary from which it fits beside the value table of what it leaves out,
   both chosen before recall (`anchored_transcript`): the start moves by whole stretches (or to
   the window's first turn, never past it for a boundary: a window turn is in no chunk yet), the
   table only with it, and in OpenAI format the table comes right after C0, so consecutive
   builds of an agent loop share their head.

Counting: OpenAI messages are counted by `app.domain.tokens.messages_tokens` (reply priming
included); an Anthropic prompt by `messages_tokens` on `blocks.anthropic_counting_view` (the system
string as one system message, content blocks as their text). Tool schemas are counted into C0 as
`count_tokens(json.dumps(tools, ensure_ascii=False))` in both formats. C1 turns are charged their
stored `TurnRecord.token_count` (which is `message_tokens` of the turn) so a build does not
re-encode the window.

This module holds the input and output types and `assemble_prompt`, which runs the phases in
that order; the transcript and value-table fitting is in `app.prompt.fitting`, the choice of a
found block's items (items 4 and 5) in `app.prompt.choosing`.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.domain.budget import REPLY_PRIMING_TOKENS
from app.domain.records import RecalledItem, TurnRecord
from app.domain.tokens import count_tokens, message_tokens
from app.domain.tool_groups import tool_groups
from app.prompt.blocks import (
    ABOUT_USER_SHAPE,
    RECALL_SHAPE,
    SYSTEM_SEPARATOR,
    anthropic_messages,
    paired_turns,
    render_about_user_item,
    turn_message,
)
from app.prompt.choosing import Choice, choose, choose_recalled, shown_in_tail
from app.prompt.clearing import History, ToolClearing
from app.prompt.fitting import (
    Room,
    Transcript,
    fit_tail_and_table,
    fit_verbatim_tail,
    fit_whole,
    fit_window,
    message_cost,
    system_string_cost,
    table_reserve,
)

PromptFormat = Literal["openai", "anthropic"]
Layer = Literal["c0", "c1", "c2", "c3", "query"]


class PromptTooLarge(Exception):
    """The mandatory parts (C0, tool schemas, x_t, reply priming) alone exceed the budget."""

    def __init__(self, needed: int, available: int, parts: dict[str, int]) -> None:
        super().__init__(f"the prompt needs at least {needed} tokens, {available} are available")
        self.needed = needed
        self.available = available
        self.parts = parts


@dataclass(frozen=True, slots=True, kw_only=True)
class AssemblyInput:
    system: Sequence[Mapping[str, Any]]  # C0 as system messages: {"role": "system", "content"}
    turns: Sequence[TurnRecord]  # C1, in seq order
    query: str | None  # x_t; None when the caller sends no new input
    budget: int  # C - r
    recall_budget_tokens: int  # B
    top_k: int
    per_item_max_tokens: int
    tools: Sequence[Mapping[str, Any]] | None = None
    notes_block: str = ""
    recalled: Sequence[RecalledItem] = ()  # reranked, best first
    about_user: Sequence[RecalledItem] = ()  # the user's remembered items, best first
    about_user_budget_tokens: int = 0
    about_user_top_k: int = 0
    format: PromptFormat = "openai"
    # The newest offloaded turns before `turns`, shown (old results as stubs) with what the
    # budget has left; each one's chunk id by seq.
    tail: Sequence[TurnRecord] = ()
    chunk_of: Mapping[int, str] = field(default_factory=dict)
    clearing: ToolClearing = field(default_factory=ToolClearing)
    value_table_tokens: int = 0  # the value table's share of what is left, at most

    def __post_init__(self) -> None:
        if self.format not in ("openai", "anthropic"):
            raise ValueError(f"unknown prompt format {self.format!r}")
        for name in (
            "budget",
            "recall_budget_tokens",
            "top_k",
            "about_user_budget_tokens",
            "about_user_top_k",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.per_item_max_tokens < 1:
            raise ValueError("per_item_max_tokens must be at least 1")


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~4x (one per turn)
class ManifestEntry:
    id: str
    layer: Layer
    source: str
    tokens: int
    score: float | None
    included: bool
    reason: str | None  # why it was left out; None when included
    chunk_id: str | None = None  # a cleared result's chunk (its raw text), or a tail turn's


@dataclass(slots=True)
class AssembledPrompt:
    messages: list[dict[str, Any]]
    system: str | None  # the Anthropic system string ("" when empty); None in OpenAI format
    usage: dict[str, int]  # c0 (tools included), c1, c2, recall, query, overhead, total, limit
    included_turns: list[int]
    excluded_turns: list[int]
    recalled: list[RecalledItem]
    about_user: list[RecalledItem]
    manifest: list[ManifestEntry]
    flags: list[str] = field(default_factory=list)
    tail_turns: list[int] = field(default_factory=list)  # offloaded turns shown before the window
    cleared_turns: list[int] = field(default_factory=list)  # tool results shown as stubs


def tools_tokens(tools: Sequence[Mapping[str, Any]] | None) -> int:
    return count_tokens(json.dumps(list(tools), ensure_ascii=False)) if tools else 0


def baseline_messages(
    system: Sequence[Mapping[str, Any]], turns: Sequence[TurnRecord], query: str | None
) -> list[dict[str, Any]]:
    """The plain concatenation C0 + all turns + x_t (what a session below threshold gets)."""
    messages = [dict(m) for m in system] + [turn_message(t) for t in turns]
    if query is not None:
        messages.append({"role": "user", "content": query})
    return messages


def _counted(rendered: str) -> tuple[str, int]:
    return rendered, count_tokens(rendered)


@dataclass(frozen=True, slots=True)
class MandatoryCosts:
    """What every prompt of an input holds, whatever else fits: C0 (its text and cost), the
    tool schemas, x_t and the reply priming."""

    c0_text: str
    system: int
    tools: int
    query: int

    @property
    def total(self) -> int:
        return self.system + self.tools + self.query + REPLY_PRIMING_TOKENS


def mandatory_costs(
    system: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    query: str | None,
    budget: int,
    prompt_format: PromptFormat,
) -> MandatoryCosts:
    """The mandatory parts' costs; `PromptTooLarge` when they alone exceed `budget` (what a
    build checks before it stores anything, without assembling a prompt)."""
    c0_text = SYSTEM_SEPARATOR.join(str(m["content"]) for m in system if m.get("content"))
    if prompt_format == "anthropic":
        system_cost = system_string_cost([c0_text])
    else:
        system_cost = sum(message_cost(m) for m in system)
    costs = MandatoryCosts(
        c0_text,
        system_cost,
        tools_tokens(tools),
        0 if query is None else message_tokens("user", query),
    )
    if costs.total > budget:
        parts = {"c0": costs.system, "tools": costs.tools, "query": costs.query}
        raise PromptTooLarge(costs.total, budget, {**parts, "overhead": REPLY_PRIMING_TOKENS})
    return costs


# Turn seqs count from 1 in every session (`sessions.append.append_turns`): a history whose
# first turn has it holds the whole session.
FIRST_SEQ = 1


@dataclass(frozen=True, slots=True)
class _Notes:
    """The notes block's place: its cost, whether it is kept, whether the whole history shows
    instead (`whole_history`), and the kept text ("" when left out)."""

    cost: int
    keep: bool
    whole_history: bool
    text: str


def assemble_prompt(inp: AssemblyInput) -> AssembledPrompt:
    """The prompt of `inp` within its budget, in the order and by the precedence above: the
    mandatory parts, the notes, the window, the found blocks, then the tail and the table."""
    mandatory = mandatory_costs(inp.system, inp.tools, inp.query, inp.budget, inp.format)
    # Every call shown with its result and every result with its call (`paired_turns`): the
    # history as it may be shown, in which any cut between groups keeps that true.
    history = History(paired_turns([*inp.tail, *inp.turns]), inp.chunk_of, inp.clearing)
    transcript = _transcript(inp, history)
    left = inp.budget - mandatory.total
    notes = _notes_decision(inp, transcript, mandatory, left)
    room = Room(left - notes.cost if notes.keep else left)
    anchored, window_whole, older = fit_window(
        transcript,
        room,
        table_tokens=inp.value_table_tokens,
        c0_text=mandatory.c0_text,
        notes=notes.text,
        whole_history=notes.whole_history,
        no_query=inp.query is None,
    )
    # In a tool loop, when every offloaded turn read fits beside the window verbatim, they are
    # shown before recall runs (as truncation would show them): recall then adds only what lies
    # beyond, and the prompt's head stays the same from one step to the next.
    if window_whole and transcript.split and history.has_values and not anchored:
        fit_verbatim_tail(transcript, room)
    window = [t for group in (*room.tail, *room.kept) for t in group]
    table_estimate, reserve = table_reserve(
        transcript, room, table_tokens=inp.value_table_tokens, notes=notes.text, anchored=anchored
    )
    # In Anthropic format the blocks end the system string: charge what each adds to it.
    prefix = [mandatory.c0_text, notes.text]
    about = _about_user(inp, room, reserve, _block_overhead(prefix, transcript.anthropic))
    prefix.append(ABOUT_USER_SHAPE.frame(about.rendered))
    overhead = _block_overhead(prefix, transcript.anthropic)
    recall = _recall(inp, transcript, room, reserve, overhead, window, [notes.text, table_estimate])
    prefix.append(RECALL_SHAPE.frame(recall.rendered))
    fit_tail_and_table(
        transcript,
        room,
        reserve=reserve,
        notes=notes.text,
        prefix=prefix,
        anchored=anchored,
        window_whole=window_whole,
        older=older,
    )
    return _assembled(inp, mandatory, transcript, notes, room, about, recall, prefix, anchored)


def _transcript(inp: AssemblyInput, history: History) -> Transcript:
    """`history` as tool groups, and where the window starts among them."""
    groups = tool_groups(history.turns)
    first_window_seq = inp.turns[0].seq if inp.turns else history.end
    # Groups holding a window turn (a group may reach back into the tail: a call offloaded
    # whose result is still in the window), then the tail's own.
    split = next((n for n, g in enumerate(groups) if g[-1].seq >= first_window_seq), len(groups))
    return Transcript(history, groups, split, first_window_seq, inp.format == "anthropic")


def _notes_decision(
    inp: AssemblyInput, transcript: Transcript, mandatory: MandatoryCosts, left: int
) -> _Notes:
    """Whether the notes block is kept, whole, within `left` (precedence 2 above)."""
    history, groups, anthropic = transcript.history, transcript.groups, transcript.anthropic
    notes = inp.notes_block
    if anthropic:
        notes_cost = system_string_cost([mandatory.c0_text, notes]) - mandatory.system
    else:
        notes_cost = message_tokens("system", notes) if notes else 0
    # A tool loop whose whole history, from the session's first turn, fits verbatim gets the
    # full-history prompt, as if it had never been offloaded: the notes would only sum up what
    # it shows (and take the room that keeps it whole).
    whole_history = bool(
        notes
        and inp.tail
        and history.has_values
        and history.turns[0].seq == FIRST_SEQ
        and fit_whole(groups, history, left, anthropic, most=0) is not None
    )
    keep_notes = bool(notes) and notes_cost <= left and not whole_history
    # The table lists no value the kept notes show (their facts hold values of tool output);
    # an anchored table does not depend on the notes, which change at every new version.
    return _Notes(notes_cost, keep_notes, whole_history, notes if keep_notes else "")


def _block_overhead(prefix: Sequence[str], anthropic: bool) -> int:
    """What a block after `prefix` costs beyond its own tokens: its message's framing, or in
    Anthropic format what the separator before it adds to the system string (a block starts
    with "<" after a newline: a token piece of its own, `starts_piece`)."""
    before = SYSTEM_SEPARATOR.join(p for p in prefix if p)
    if not anthropic or not before:
        return message_tokens("system", "")
    return count_tokens(before + SYSTEM_SEPARATOR) - count_tokens(before)


def _about_user(inp: AssemblyInput, room: Room, reserve: int, overhead: int) -> Choice:
    """The "about this user" block's items within what is left (precedence 4 above)."""
    per_item = inp.per_item_max_tokens
    about = choose(
        inp.about_user,
        limit=min(inp.about_user_budget_tokens, room.left - reserve),
        top_k=inp.about_user_top_k,
        in_window=set(),
        render_one=lambda item: _counted(render_about_user_item(item, per_item)),
        shape=ABOUT_USER_SHAPE,
        overhead=overhead,
    )
    room.left -= about.used
    return about


def _recall(
    inp: AssemblyInput,
    transcript: Transcript,
    room: Room,
    reserve: int,
    overhead: int,
    window: Sequence[TurnRecord],
    shown_blocks: Sequence[str],
) -> Choice:
    """The recalled block's items within what is left (precedence 5 above)."""
    history = transcript.history
    # An agent's step does not recall offloaded turns it read whose values the prompt already
    # shows (in stubs, the value table, the notes): their raw text again costs far more.
    agent_step = inp.query is None and history.has_values
    recall = choose_recalled(
        inp.recalled,
        limit=min(inp.recall_budget_tokens, room.left - reserve),
        top_k=inp.top_k,
        in_window={t.seq for t in window},
        in_tail=shown_in_tail(history, window, shown_blocks) if agent_step else None,
        per_item_max_tokens=inp.per_item_max_tokens,
        overhead=overhead,
    )
    room.left -= recall.used
    return recall


def _flags(inp: AssemblyInput, notes: _Notes, included: list[int], recall: Choice) -> list[str]:
    """What the caller should know was cut: window turns, the notes, recalled items."""
    flags: list[str] = []
    if len(included) < len(inp.turns):
        flags.append("window_truncated")
    if inp.notes_block and not notes.keep and not notes.whole_history:
        flags.append("notes_dropped")
    if any(reason == "over_budget" for reason, _ in recall.outcome.values()):
        flags.append("recall_over_budget")
    return flags


def _messages(
    inp: AssemblyInput,
    transcript: Transcript,
    room: Room,
    prefix: Sequence[str],
    anchored: bool,
    shown: Sequence[TurnRecord],
) -> tuple[list[dict[str, Any]], str | None]:
    """The prompt's messages in their order (and in Anthropic format, its system string)."""
    table = room.table
    system: str | None = None
    if transcript.anthropic:
        order = [*prefix[:2], table, *prefix[2:]] if anchored else [*prefix, table]
        system = SYSTEM_SEPARATOR.join(p for p in order if p)
        messages = [m for group in (*room.tail, *room.kept) for m in anthropic_messages(group)]
    else:
        _, notes_message, about_block, block = prefix
        if anchored:
            # An agent's step past its budget: the table changes only with the transcript's
            # start, the transcript then only grows until the start moves; after it what may
            # change at any step: the notes (a worker's new version) and what the step's
            # search found (its query is the latest exchange).
            head, late = [table], [notes_message, about_block, block]
        elif inp.query is None and transcript.history.has_values:
            # An agent's step whose history fits: only what its search found comes last.
            head, late = [notes_message, table], [about_block, block]
        else:
            head, late = [notes_message, about_block, block, table], []
        # (In Anthropic format every block is in the system string, where any change is a
        # change of the whole.)
        messages = [dict(m) for m in inp.system]
        messages += [{"role": "system", "content": b} for b in head if b]
        messages += [turn_message(t) for t in shown]
        messages += [{"role": "system", "content": b} for b in late if b]
    if inp.query is not None:
        messages.append({"role": "user", "content": inp.query})
    return messages, system


def _assembled(
    inp: AssemblyInput,
    mandatory: MandatoryCosts,
    transcript: Transcript,
    notes: _Notes,
    room: Room,
    about: Choice,
    recall: Choice,
    prefix: Sequence[str],
    anchored: bool,
) -> AssembledPrompt:
    """The prompt the phases chose, with its usage, flags and manifest."""
    history, first_window_seq = transcript.history, transcript.first_window_seq
    shown = [t for group in (*room.tail, *room.kept) for t in group]
    shown_seqs = {t.seq for t in shown}
    included = [t.seq for group in room.kept for t in group if t.seq >= first_window_seq]
    flags = _flags(inp, notes, included, recall)
    messages, system = _messages(inp, transcript, room, prefix, anchored, shown)
    usage = {
        "c0": mandatory.system + mandatory.tools,
        "c1": room.c1_cost,
        "c2": (notes.cost if notes.keep else 0) + about.used + room.table_cost,
        "recall": recall.used,
        "query": mandatory.query,
        "overhead": REPLY_PRIMING_TOKENS,
    }
    usage["total"] = sum(usage.values())
    usage["limit"] = inp.budget

    costs = {"c0:system": mandatory.system, "c0:tools": mandatory.tools, "notes": notes.cost}
    return AssembledPrompt(
        messages=messages,
        system=system,
        usage=usage,
        included_turns=included,
        excluded_turns=[t.seq for t in inp.turns if t.seq not in shown_seqs],
        recalled=list(recall.chosen),
        about_user=list(about.chosen),
        manifest=_manifest(
            inp,
            costs | {"query": mandatory.query, "values": room.table_cost},
            None if notes.keep else "history_whole" if notes.whole_history else "over_budget",
            {t.seq: t for t in shown},
            history,
            about,
            recall,
        ),
        flags=flags,
        # (Passes over every shown turn skipped when there is nothing to find: a conversation.)
        tail_turns=[t.seq for t in shown if t.seq < first_window_seq] if room.tail else [],
        cleared_turns=[t.seq for t in shown if history.is_stub(t)] if history.stubs else [],
    )


def _manifest(
    inp: AssemblyInput,
    costs: dict[str, int],
    notes_reason: str | None,
    shown: Mapping[int, TurnRecord],
    history: History,
    about: Choice,
    recall: Choice,
) -> list[ManifestEntry]:
    """Every candidate fragment, in prompt order, with why it was left out (None: included).
    Offloaded turns are listed only when shown; a cleared result as its stub (its tokens, the
    chunk of its raw text)."""
    e = ManifestEntry
    entries = [e("c0:system", "c0", "request.system", costs["c0:system"], None, True, None)]
    if inp.tools:
        entries.append(e("c0:tools", "c0", "request.tools", costs["c0:tools"], None, True, None))
    if inp.notes_block:
        entries.append(
            e("notes", "c2", "scratchpad", costs["notes"], None, not notes_reason, notes_reason)
        )
    for index, item in enumerate(inp.about_user):
        reason, tokens = about.outcome[index]
        entries.append(e(item.chunk_id, "c2", item.source, tokens, item.score, not reason, reason))
    for index, item in enumerate(inp.recalled):
        reason, tokens = recall.outcome[index]
        entries.append(e(item.chunk_id, "c3", item.source, tokens, item.score, not reason, reason))
    if costs["values"]:
        entries.append(e("values", "c2", "tool_values", costs["values"], None, True, None))
    for t in inp.tail:
        if t.seq in shown:
            shown_as = shown[t.seq]
            source = "tool_result_stub" if history.is_stub(shown_as) else t.role
            chunk = inp.chunk_of.get(t.seq)
            entries.append(
                e(f"turn:{t.seq}", "c3", source, shown_as.token_count, None, True, None, chunk)
            )
    for t in inp.turns:
        if t.seq not in shown:
            entries.append(
                e(f"turn:{t.seq}", "c1", t.role, t.token_count, None, False, "window_truncated")
            )
        elif history.stubs and history.is_stub(shown[t.seq]):
            tokens = shown[t.seq].token_count
            entries.append(e(f"turn:{t.seq}", "c1", "tool_result_stub", tokens, None, True, None))
        else:
            entries.append(e(f"turn:{t.seq}", "c1", t.role, t.token_count, None, True, None))
    if inp.query is not None:
        entries.append(e("query", "query", "request.query", costs["query"], None, True, None))
    return entries
