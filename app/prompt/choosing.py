"""Choosing the items of a found block (what recall found, what the user asked to keep): in
rank order or with their neighbours first, each whole or compact, adjacent ones under one header,
near-duplicates and what the prompt already shows left out, while the block stays within its
budget (pure)."""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.domain.records import RecalledItem, TurnRecord
from app.domain.tokens import count_tokens
from app.notes.values import result_values
from app.prompt.blocks import (
    RECALL_SHAPE,
    BlockShape,
    counted_item,
    counted_stretch,
    format_ts,
    quoted_body,
    starts_piece,
    tokens_with,
    trust_label,
)
from app.prompt.clearing import History
from app.recall.rerank import repeats, word_set


@dataclass(slots=True)
class Choice:
    """The items a block holds and why each candidate was left out."""

    chosen: list[RecalledItem]
    rendered: list[str]  # the chosen items as rendered, in order
    outcome: dict[int, tuple[str | None, int]]  # candidate index -> (reason, marginal tokens)
    used: int = 0  # what the block of the chosen items costs (0: no block)


# An item whose whole text would take more than this share of its budget comes compact first.
# LoCoMo tune split B250 .544 -> .554 (check .523 -> .533); at 0.3 B500 lost on the check split
# (.693 -> .681). Chunks are at most ~180 tokens with their header: B500 and up are unchanged.
COMPACT_FIRST_SHARE = 0.4


# Neighbour expansion: the items adjacent to one of the first B / NEIGHBOUR_OF_FIRST_TOKENS
# candidates are tried right after it when they rank among the first B / NEIGHBOUR_TOKENS
# candidates themselves (a wider reach for a larger budget). The rerank's adjacency feature
# already ranks a stretch of conversation up together, so a small budget (below 1000 tokens)
# takes its items in rank order: with the fitted rerank, LoCoMo B250 / B500 / B1000 / B2000 tune
# .555 / .704 / .795 / .867 with the first two expanded at every budget, .571 / .711 / .798 / .867
# with this rule (check .549 / .725 / .813 / .851 and .579 / .727 / .813 / .851); the grid is in
# the tuning decisions of docs/BENCHMARKS.md.
NEIGHBOUR_OF_FIRST_TOKENS = 1000
NEIGHBOUR_TOKENS = 33


def _turn_range(item: RecalledItem) -> tuple[int, int] | None:
    if item.turn_first is None:
        return None
    return item.turn_first, item.turn_first if item.turn_last is None else item.turn_last


def neighbour_order(
    ranges: Sequence[tuple[int, int] | None], *, first: int, within: int
) -> list[int]:
    """Positions of candidates (their turn ranges, best first; None: no range) in the order to
    try them: rank order, except that right after each of the first `first` come the candidates
    whose range ends just before or starts just after its own (earlier turns first), when they
    are among the first `within` themselves."""
    ends: dict[int, int] = {}
    starts: dict[int, int] = {}
    for position, span in enumerate(ranges[:within]):
        if span is not None:
            starts.setdefault(span[0], position)
            ends.setdefault(span[1], position)
    order: list[int] = []
    seen: set[int] = set()
    for position, span in enumerate(ranges):
        if position in seen:
            continue
        order.append(position)
        seen.add(position)
        if position >= first or span is None:
            continue
        for neighbour in (ends.get(span[0] - 1), starts.get(span[1] + 1)):
            if neighbour is not None and neighbour not in seen:
                order.append(neighbour)
                seen.add(neighbour)
    return order


@dataclass(slots=True, eq=False)
class _Entry:
    """One item of a block as rendered: a chosen item, or a stretch of chosen items adjacent in
    turns rendered under one header (`items` in turn order)."""

    items: list[RecalledItem]
    span: tuple[int, int] | None
    text: str
    tokens: int  # count_tokens(text)
    separated: int  # count_tokens(text + the block's separator)


def _stretch_span(item: RecalledItem) -> tuple[int, int]:
    span = _turn_range(item)
    if span is None:
        raise ValueError("only items with turns join a stretch")
    return span


def _stretch_key(item: RecalledItem) -> tuple[str, str]:
    """Items join one stretch only on the same UTC day and with the same label: the stretch
    shows one time and one label."""
    return format_ts(item.ts)[:10], trust_label(item)


@dataclass(slots=True)
class _Rendering:
    """How a block renders and counts its items. Each item is rendered and counted once
    (`render_one`: text and tokens). Every item starts a token piece (`BlockShape`), so a
    block's tokens are its head's, each entry's with the separator after it, and the last one's
    with the tail: a fit test counts only the tested item's last line again, not the whole
    block."""

    render_one: Callable[[RecalledItem], tuple[str, int]]
    render_stretch: Callable[[Sequence[RecalledItem]], tuple[str, int]] | None
    shape: BlockShape
    overhead: int
    head: int = field(init=False)
    counted: dict[int, tuple[str, int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.head = count_tokens(self.shape.head)

    def own(self, option: RecalledItem) -> tuple[str, int]:
        if id(option) not in self.counted:
            self.counted[id(option)] = self.render_one(option)
        return self.counted[id(option)]

    def own_cost(self, option: RecalledItem) -> int:
        return self.own(option)[1]

    def header_cost(self, option: RecalledItem) -> int:
        """What the first line of the option's rendering (its header) costs."""
        return count_tokens(self.own(option)[0].split("\n", 1)[0] + "\n")

    def checked(self, text: str) -> str:
        if not starts_piece(self.shape.separator + text, len(self.shape.separator)):
            raise ValueError(f"a rendered item must start with a non-space: {text[:20]!r}")
        return text

    def block_cost(self, body: int, option: RecalledItem) -> int:
        """The block of the entries costing `body` (with their separators) and `option` last."""
        text, tokens = self.own(option)
        last = tokens_with(self.checked(text), tokens, self.shape.tail)
        return self.overhead + self.head + body + last

    def block_of(self, kept: list[_Entry]) -> int:
        """The block of the entries `kept`."""
        last = kept[-1]
        body = sum(e.separated for e in kept[:-1])
        ending = tokens_with(last.text, last.tokens, self.shape.tail)
        return self.overhead + self.head + body + ending

    def entry(self, option: RecalledItem) -> _Entry:
        """The option as an entry of its own."""
        text, tokens = self.own(option)
        separated = tokens_with(text, tokens, self.shape.separator)
        return _Entry([option], _turn_range(option), text, tokens, separated)

    def stretch(self, members: list[RecalledItem]) -> _Entry:
        """`members` (in turn order) as one entry under one header."""
        assert self.render_stretch is not None
        text, tokens = self.render_stretch(members)
        span = (_stretch_span(members[0])[0], max(_stretch_span(i)[1] for i in members))
        entry = _Entry(members, span, self.checked(text), tokens, 0)
        entry.separated = tokens_with(text, tokens, self.shape.separator)
        return entry


@dataclass(slots=True)
class _Block:
    """The entries chosen so far, in block order, and what they hold."""

    entries: list[_Entry] = field(default_factory=list)
    chosen_tokens: int = 0  # the entries', each with the separator after it
    ending: dict[int, _Entry] = field(default_factory=dict)  # an entry by its last turn
    starting: dict[int, _Entry] = field(default_factory=dict)  # an entry by its first turn
    words: list[frozenset[str]] = field(default_factory=list)  # each chosen item's
    union: frozenset[str] = frozenset()

    def adjacent(self, option: RecalledItem, rendering: _Rendering) -> list[_Entry]:
        """The entries the option's turns continue (before it, after it) that it may join."""
        span = _turn_range(option)
        if rendering.render_stretch is None or span is None:
            return []
        before, after = self.ending.get(span[0] - 1), self.starting.get(span[1] + 1)
        found = [e for e in (before, after) if e is not None]
        key = _stretch_key(option) if found else None
        return [e for e in found if _stretch_key(e.items[0]) == key]

    def stretched(
        self, option: RecalledItem, joins: list[_Entry], rendering: _Rendering
    ) -> tuple[_Entry, list[_Entry]]:
        """`option` and the items of `joins` as one entry, and the entries with it in place of
        the first of `joins` (the others gone)."""
        members = sorted([option, *(i for e in joins for i in e.items)], key=_stretch_span)
        entry = rendering.stretch(members)
        at = min(self.entries.index(e) for e in joins)
        kept = [
            entry if i == at else e for i, e in enumerate(self.entries) if i == at or e not in joins
        ]
        return entry, kept

    def take(
        self, entry: _Entry, kept: list[_Entry], joins: list[_Entry], words: frozenset[str]
    ) -> None:
        """Choose `entry`: the entries become `kept` (with it, without `joins`)."""
        for old in joins:
            if old.span is not None:
                self.ending.pop(old.span[1], None)
                self.starting.pop(old.span[0], None)
        if entry.span is not None:
            self.ending[entry.span[1]] = entry
            self.starting[entry.span[0]] = entry
        self.entries = kept
        self.chosen_tokens = sum(e.separated for e in self.entries)
        self.words.append(words)
        self.union |= words


def choose(
    items: Sequence[RecalledItem],
    *,
    limit: int,
    top_k: int,
    in_window: set[int],
    render_one: Callable[[RecalledItem], tuple[str, int]],
    shape: BlockShape,
    overhead: int,
    in_tail: Callable[[RecalledItem], bool] | None = None,
    neighbours: bool = False,
    render_stretch: Callable[[Sequence[RecalledItem]], tuple[str, int]] | None = None,
) -> Choice:
    """Items in rank order (with `neighbours`, each of the first few followed by its adjacent
    candidates: `neighbour_order`) while the whole block (`shape` around the rendered items,
    costing `overhead` + its tokens) stays within `limit`. With `render_stretch`, an item whose
    turns continue a chosen one's (same day, same label) is rendered with it under one header,
    in place of the chosen one: the header it saves is room for more evidence. An item that
    `repeats` a chosen one is left out (`near_duplicate`); one whose turns are all in the window
    (`in_window`) or that `in_tail` says the prompt holds otherwise (`in_tail`), too."""
    choice = Choice([], [], {})
    rendering = _Rendering(render_one, render_stretch, shape, overhead)
    block = _Block()
    for index in _candidates(items, choice, limit, in_window, in_tail, neighbours):
        item = items[index]
        if len(choice.chosen) >= top_k:
            choice.outcome[index] = ("below_k", rendering.own_cost(item))
            continue
        choice.outcome[index] = _fit(item, choice, block, rendering, limit)
    choice.rendered = [e.text for e in block.entries]
    return choice


def choose_recalled(
    items: Sequence[RecalledItem],
    *,
    limit: int,
    top_k: int,
    in_window: set[int],
    per_item_max_tokens: int,
    overhead: int,
    in_tail: Callable[[RecalledItem], bool] | None = None,
) -> Choice:
    """The recalled-history items of `items` (recall's hits with their best turns, best first)
    within `limit` tokens of the recalled block: build-prompt's block and the memory tool's
    answer pack alike, so the two paths differ only in their budget. Each item whole or compact,
    the first few followed by their neighbours, adjacent ones under one header (`choose`)."""
    bodies: dict[int, tuple[str, int]] = {}

    def body(item: RecalledItem) -> tuple[str, int]:
        if id(item) not in bodies:
            bodies[id(item)] = quoted_body(item, per_item_max_tokens)
        return bodies[id(item)]

    return choose(
        items,
        limit=limit,
        top_k=top_k,
        in_window=in_window,
        in_tail=in_tail,
        render_one=lambda item: counted_item(item, per_item_max_tokens),
        shape=RECALL_SHAPE,
        overhead=overhead,
        neighbours=True,
        render_stretch=lambda stretch: counted_stretch(stretch, [body(i) for i in stretch]),
    )


def _candidates(
    items: Sequence[RecalledItem],
    choice: Choice,
    limit: int,
    in_window: set[int],
    in_tail: Callable[[RecalledItem], bool] | None,
    neighbours: bool,
) -> list[int]:
    """The positions of the items to try, in the order to try them (with `neighbours`:
    `neighbour_order`); those the prompt holds already get their reason in `choice.outcome`."""
    candidates: list[int] = []
    for index, item in enumerate(items):
        span = _turn_range(item)
        if span is not None and in_window.issuperset(range(span[0], span[1] + 1)):
            choice.outcome[index] = ("in_window", 0)
        elif in_tail is not None and in_tail(item):
            choice.outcome[index] = ("in_tail", 0)
        else:
            candidates.append(index)
    if neighbours:
        order = neighbour_order(
            [_turn_range(items[i]) for i in candidates],
            first=limit // NEIGHBOUR_OF_FIRST_TOKENS,
            within=-(-limit // NEIGHBOUR_TOKENS),
        )
        candidates = [candidates[position] for position in order]
    return candidates


def _fit(
    item: RecalledItem, choice: Choice, block: _Block, rendering: _Rendering, limit: int
) -> tuple[str | None, int]:
    """Choose `item` (or its compact version) when the block stays within `limit` with it:
    the outcome, (None, what it added) or why it was left out (and what it would have cost)."""
    # The whole item first; when it does not fit, its compact version (if it has one). When
    # the whole item alone would take a large share of the budget, the compact one first.
    reason: tuple[str | None, int] = ("over_budget", 0)
    options = (item, item.compact)
    if item.compact is not None and rendering.own_cost(item) > COMPACT_FIRST_SHARE * limit:
        options = (item.compact, item)
    joins = block.adjacent(item, rendering)
    for option in options:
        if option is None:
            continue
        if joins:
            # Joined, it adds at least its text less the headers the stretch saves (its own,
            # and one more for each entry beyond the first it bridges; give or take a token
            # where the turn numbers change): skip the render when that is over the limit.
            saved = len(joins) * rendering.header_cost(option) + 2
            if choice.used + rendering.own_cost(option) - saved > limit:
                reason = ("over_budget", rendering.own_cost(option))
                continue
            entry, kept = block.stretched(option, joins, rendering)
            cost = rendering.block_of(kept)
        else:
            # What the option's own text costs: about what it adds to the block, cheap.
            alone = rendering.own_cost(option)
            if choice.used + alone > limit:
                reason = ("over_budget", alone)
                continue
            cost = rendering.block_cost(block.chosen_tokens, option)
        if cost > limit:
            reason = ("over_budget", cost - choice.used)
            continue
        # Checked only for an option that fits: most candidates of a build do not.
        words = word_set(item.text)
        if repeats(words, block.words, block.union):
            return ("near_duplicate", rendering.own_cost(item))
        if not joins:
            entry = rendering.entry(option)
            kept = [*block.entries, entry]
        block.take(entry, kept, joins, words)
        choice.chosen.append(option)
        reason = (None, cost - choice.used)
        choice.used = cost
        break
    return reason


def shown_in_tail(
    history: History, shown: Sequence[TurnRecord], blocks: Sequence[str]
) -> Callable[[RecalledItem], bool]:
    """Whether a recalled item lies within the turns `history` read and every value its text
    holds is in the shown turns or `blocks` (what an agent's step would recall for nothing)."""
    read = {t.seq for t in history.turns}
    known: list[str] = []  # the prompt's text, joined at the first item within `read`

    def covered(item: RecalledItem) -> bool:
        span = _turn_range(item)
        if span is None or not read.issuperset(range(span[0], span[1] + 1)):
            return False
        if not known:
            known.append(
                "\n".join(
                    [
                        *blocks,
                        *(t.content for t in shown),
                        *(
                            json.dumps(t.tool_calls, ensure_ascii=False)
                            for t in shown
                            if t.tool_calls
                        ),
                    ]
                )
            )
        return all(v.value in known[0] for v in result_values(item.text))

    return covered
