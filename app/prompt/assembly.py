"""Prompt assembly: the pure policy that turns the layers into a message list within budget.

Order (stable parts first, so prompt-prefix caches hit):
C0 system messages → C2 notes block → recalled-history block → C1 turns verbatim → x_t.

Precedence when the budget is short (`budget` = C - r):
1. x_t and C0 are mandatory. If they alone (plus reply priming and tool schemas) exceed the
   budget, `PromptTooLarge` is raised with the figures: nothing is ever cut silently.
2. The C2 notes block next, whole or not at all (`notes_dropped`). Notes are a few hundred tokens
   and carry the hard constraints and key facts of offloaded history, which exist nowhere else in
   the prompt; the spec says constraints are never dropped for space before anything else.
3. C1 turns from the newest backwards, as a contiguous recent tail. A tool call and its results
   form one group that is kept or left out whole. When the oldest turns must be left out the flag
   `window_truncated` is set (the caller should offload and tighten k).
4. Recall gets what is left, at most B: items in rank order, each counted with its framing; an
   item that does not fit is skipped (`over_budget`) and the next tried, up to `top_k` items.
   Items whose whole turn range is already in the prompt's C1 are skipped (`in_window`).

Counting: OpenAI messages are counted by `app.core.tokens.messages_tokens` (reply priming
included); an Anthropic prompt by `messages_tokens` on `blocks.anthropic_counting_view` (the system
string as one system message, content blocks as their text). Tool schemas are counted into C0 as
`count_tokens(json.dumps(tools, ensure_ascii=False))` in both formats. C1 turns are charged their
stored `TurnRecord.token_count` (which is `message_tokens` of the turn) so a build does not
re-encode the window.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from app.core.tokens import count_tokens, message_tokens
from app.domain.budget import REPLY_PRIMING_TOKENS
from app.domain.records import RecalledItem, TurnRecord
from app.prompt.blocks import (
    ITEM_SEPARATOR,
    RECALL_CLOSE,
    RECALL_FRAME,
    RECALL_OPEN,
    SYSTEM_SEPARATOR,
    anthropic_counting_view,
    anthropic_messages,
    render_item,
    render_recalled_block,
    tool_groups,
    turn_message,
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
    format: PromptFormat = "openai"

    def __post_init__(self) -> None:
        if self.format not in ("openai", "anthropic"):
            raise ValueError(f"unknown prompt format {self.format!r}")
        for name in ("budget", "recall_budget_tokens", "top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.per_item_max_tokens < 1:
            raise ValueError("per_item_max_tokens must be at least 1")


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    id: str
    layer: Layer
    source: str
    tokens: int
    score: float | None
    included: bool
    reason: str | None  # why it was left out; None when included


@dataclass(slots=True)
class AssembledPrompt:
    messages: list[dict[str, Any]]
    system: str | None  # the Anthropic system string ("" when empty); None in OpenAI format
    usage: dict[str, int]  # c0 (tools included), c1, c2, recall, query, overhead, total, limit
    included_turns: list[int]
    excluded_turns: list[int]
    recalled: list[RecalledItem]
    manifest: list[ManifestEntry]
    flags: list[str] = field(default_factory=list)


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


def _message_cost(m: Mapping[str, Any]) -> int:
    return message_tokens(
        m["role"], m.get("content"), m.get("name"), m.get("tool_calls"), m.get("tool_call_id")
    )


def _system_cost(parts: Sequence[str]) -> int:
    """Exact cost of the Anthropic system string made of `parts` (0 when there is none)."""
    text = SYSTEM_SEPARATOR.join(p for p in parts if p)
    return message_tokens("system", text) if text else 0


def _group_cost(group: list[TurnRecord], anthropic: bool) -> int:
    plain = len(group) == 1 and group[0].role in ("user", "assistant") and not group[0].name
    if not anthropic or (plain and not group[0].tool_calls):
        return sum(t.token_count for t in group)
    return sum(_message_cost(m) for m in anthropic_counting_view(None, anthropic_messages(group)))


@dataclass(slots=True)
class _RecallChoice:
    chosen: list[RecalledItem]
    outcome: dict[int, tuple[str | None, int]]  # candidate index -> (reason, marginal tokens)


@lru_cache(maxsize=1)
def _frame_tokens() -> tuple[int, int]:
    """Tokens of the block's fixed pieces: what precedes the first item, and the closing tag."""
    head = count_tokens(RECALL_OPEN + ITEM_SEPARATOR) + count_tokens(RECALL_FRAME + ITEM_SEPARATOR)
    return head, count_tokens(RECALL_CLOSE)


def _choose_recall(
    inp: AssemblyInput, limit: int, in_window: set[int], block_extra: int
) -> _RecallChoice:
    """Items in rank order while the whole block (framing included) stays within `limit`.

    The block is `OPEN, FRAME, item, ..., item` joined by blank lines, then a newline and the
    closing tag, and costs `block_extra` tokens more than its text. Each of its pieces starts with
    a non-space character right after a newline, where cl100k's pre-tokeniser always starts a new
    piece, so the block's tokens are the sum of its pieces' (each item counted with what follows
    it: a blank line, or for the last one the newline before the closing tag). Each candidate is
    rendered and counted once instead of re-counting the whole block per candidate."""
    choice = _RecallChoice([], {})
    head, close = _frame_tokens()
    used = 0  # the block's cost with the chosen items (0 while there is none)
    chosen_inner = 0  # the chosen items' tokens, each followed by a blank line
    for index, item in enumerate(inp.recalled):
        first = item.turn_first
        last = first if item.turn_last is None else item.turn_last
        if first is not None and last is not None and in_window.issuperset(range(first, last + 1)):
            choice.outcome[index] = ("in_window", 0)
            continue
        # What the item's own text costs: about what it adds to the block, and cheap to count.
        rendered = render_item(item, inp.per_item_max_tokens)
        alone = count_tokens(rendered)
        if len(choice.chosen) >= inp.top_k:
            choice.outcome[index] = ("below_k", alone)
            continue
        if used + alone > limit:
            choice.outcome[index] = ("over_budget", alone)
            continue
        cost = block_extra + head + chosen_inner + count_tokens(rendered + "\n") + close
        if cost > limit:
            choice.outcome[index] = ("over_budget", cost - used)
        else:
            choice.chosen.append(item)
            choice.outcome[index] = (None, cost - used)
            used = cost
            chosen_inner += count_tokens(rendered + ITEM_SEPARATOR)
    return choice


def assemble_prompt(inp: AssemblyInput) -> AssembledPrompt:
    anthropic = inp.format == "anthropic"
    c0_text = SYSTEM_SEPARATOR.join(str(m["content"]) for m in inp.system if m.get("content"))
    tools_cost = tools_tokens(inp.tools)
    if anthropic:
        system_cost = _system_cost([c0_text])
    else:
        system_cost = sum(_message_cost(m) for m in inp.system)
    query_cost = 0 if inp.query is None else message_tokens("user", inp.query)
    mandatory = system_cost + tools_cost + query_cost + REPLY_PRIMING_TOKENS
    if mandatory > inp.budget:
        parts = {"c0": system_cost, "tools": tools_cost, "query": query_cost}
        raise PromptTooLarge(mandatory, inp.budget, {**parts, "overhead": REPLY_PRIMING_TOKENS})
    left = inp.budget - mandatory

    notes = inp.notes_block
    if anthropic:
        notes_cost = _system_cost([c0_text, notes]) - system_cost
    else:
        notes_cost = message_tokens("system", notes) if notes else 0
    keep_notes = bool(notes) and notes_cost <= left
    if keep_notes:
        left -= notes_cost

    kept: list[list[TurnRecord]] = []
    c1_cost = 0
    for group in reversed(tool_groups(inp.turns)):
        cost = _group_cost(group, anthropic)
        if c1_cost + cost > left:
            break
        kept.append(group)
        c1_cost += cost
    kept.reverse()
    left -= c1_cost
    window = [t for group in kept for t in group]
    in_window = {t.seq for t in window}

    # In Anthropic format the block ends the system string: charge what it adds to that string.
    prefix = [c0_text, notes if keep_notes else ""]
    # What the block costs beyond the tokens of its text: a system message of its own, or in
    # Anthropic format the separator that joins it to the system string (its own when alone).
    block_extra = message_tokens("system", "")
    if anthropic and any(prefix):
        prefix_text = SYSTEM_SEPARATOR.join(p for p in prefix if p)
        block_extra = count_tokens(prefix_text + SYSTEM_SEPARATOR) - count_tokens(prefix_text)

    recall = _choose_recall(inp, min(inp.recall_budget_tokens, left), in_window, block_extra)
    block = render_recalled_block(recall.chosen, inp.per_item_max_tokens)
    recall_cost = block_extra + count_tokens(block) if block else 0

    flags: list[str] = []
    if len(window) < len(inp.turns):
        flags.append("window_truncated")
    if notes and not keep_notes:
        flags.append("notes_dropped")
    if any(reason == "over_budget" for reason, _ in recall.outcome.values()):
        flags.append("recall_over_budget")

    system: str | None = None
    if anthropic:
        system = SYSTEM_SEPARATOR.join(p for p in (*prefix, block) if p)
        messages = [m for group in kept for m in anthropic_messages(group)]
    else:
        messages = [dict(m) for m in inp.system]
        if keep_notes:
            messages.append({"role": "system", "content": notes})
        if block:
            messages.append({"role": "system", "content": block})
        messages += [turn_message(t) for t in window]
    if inp.query is not None:
        messages.append({"role": "user", "content": inp.query})

    usage = {
        "c0": system_cost + tools_cost,
        "c1": c1_cost,
        "c2": notes_cost if keep_notes else 0,
        "recall": recall_cost,
        "query": query_cost,
        "overhead": REPLY_PRIMING_TOKENS,
    }
    usage["total"] = sum(usage.values())
    usage["limit"] = inp.budget

    costs = {"c0:system": system_cost, "c0:tools": tools_cost, "notes": notes_cost}
    return AssembledPrompt(
        messages=messages,
        system=system,
        usage=usage,
        included_turns=[t.seq for t in window],
        excluded_turns=[t.seq for t in inp.turns if t.seq not in in_window],
        recalled=list(recall.chosen),
        manifest=_manifest(inp, costs | {"query": query_cost}, keep_notes, in_window, recall),
        flags=flags,
    )


def _manifest(
    inp: AssemblyInput,
    costs: dict[str, int],
    keep_notes: bool,
    in_window: set[int],
    recall: _RecallChoice,
) -> list[ManifestEntry]:
    """Every candidate fragment, in prompt order, with why it was left out (None: included)."""
    e = ManifestEntry
    notes_reason = None if keep_notes else "over_budget"
    entries = [e("c0:system", "c0", "request.system", costs["c0:system"], None, True, None)]
    if inp.tools:
        entries.append(e("c0:tools", "c0", "request.tools", costs["c0:tools"], None, True, None))
    if inp.notes_block:
        entries.append(
            e("notes", "c2", "scratchpad", costs["notes"], None, keep_notes, notes_reason)
        )
    for index, item in enumerate(inp.recalled):
        reason, tokens = recall.outcome[index]
        entries.append(e(item.chunk_id, "c3", item.source, tokens, item.score, not reason, reason))
    for t in inp.turns:
        out = None if t.seq in in_window else "window_truncated"
        entries.append(e(f"turn:{t.seq}", "c1", t.role, t.token_count, None, not out, out))
    if inp.query is not None:
        entries.append(e("query", "query", "request.query", costs["query"], None, True, None))
    return entries
