"""Fitting the transcript and the value table into what the budget leaves: the window and the
offloaded tail as whole tool groups (old results cleared to stubs first), the start of an agent's
transcript moved by stretches, and the value table of what the shown turns do not hold (pure)."""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.core.tokens import message_tokens
from app.domain.records import TurnRecord
from app.prompt.blocks import anthropic_counting_view, anthropic_messages
from app.prompt.clearing import History, TableEntry, fit_table


def message_cost(m: Mapping[str, Any]) -> int:
    """An OpenAI message's cost, its framing included."""
    return message_tokens(
        m["role"], m.get("content"), m.get("name"), m.get("tool_calls"), m.get("tool_call_id")
    )


def group_cost(group: list[TurnRecord], anthropic: bool) -> int:
    """What a tool group costs in the prompt's format (its stored counts where they hold)."""
    if not anthropic:
        return group[0].token_count if len(group) == 1 else sum(t.token_count for t in group)
    plain = len(group) == 1 and group[0].role in ("user", "assistant") and not group[0].name
    if plain and not group[0].tool_calls:
        return group[0].token_count
    return sum(message_cost(m) for m in anthropic_counting_view(None, anthropic_messages(group)))


def fit_whole(
    groups: Sequence[list[TurnRecord]],
    history: History,
    limit: int,
    anthropic: bool,
    *,
    most: int,
) -> tuple[list[list[TurnRecord]], int] | None:
    """All of `groups` within `limit` and their cost: verbatim, or with the oldest results
    cleared (at most `most` of the clearing order), at the first clearing point
    (`History.clearing_points`) where they fit; None when they do not fit so."""
    for count in [0, *(c for c in history.clearing_points() if c <= most)]:
        cleared = [history.cleared(g, count) for g in groups] if count else list(groups)
        cost = sum(group_cost(g, anthropic) for g in cleared)
        if cost <= limit:
            return cleared, cost
    return None


def fit_transcript(
    groups: Sequence[list[TurnRecord]],
    history: History,
    limit: int,
    anthropic: bool,
    *,
    clear_all: bool = False,
    most: int | None = None,
) -> tuple[list[list[TurnRecord]], int]:
    """The newest of `groups` (oldest first) that fit `limit`, and their cost: all of them when
    they fit verbatim or with old results cleared (`fit_whole`); else the old results cleared and
    the oldest groups left out; the `keep` newest results are cleared too only when not even the
    newest group fits otherwise (and never beyond `most` of the clearing order). With
    `clear_all`, every result that may be cleared is, from the start (turns older than a tail
    holding stubs)."""
    if not groups:
        return [], 0
    every = len(history.order)
    whole = None if clear_all else fit_whole(groups, history, limit, anthropic, most=history.unkept)
    if whole is not None:
        return whole
    counts = [every] if clear_all else [history.unkept, every]
    for count in [c for c in counts if most is None or c <= most]:
        cleared = [history.cleared(g, count) for g in groups]
        costs = [group_cost(g, anthropic) for g in cleared]
        start, used = len(cleared), 0
        while start and used + costs[start - 1] <= limit:
            start -= 1
            used += costs[start]
        if start < len(cleared):
            return cleared[start:], used
    return [], 0


# The transcript's start moves by stretches of about half the turns the budget holds (a power
# of two, so that it changes seldom as the mean turn size drifts); below `MIN_STRETCH_TURNS` the
# window is too small to leave a stretch unused and the start moves turn by turn. Tuned on the
# tau-bench tune split (docs/BENCHMARKS.md, "Prefix reuse").
STRETCHES_PER_BUDGET = 2
MIN_STRETCH_TURNS = 4


def stretch_turns(turns: Sequence[TurnRecord], limit: int) -> int:
    """The stretch length in turns for `turns` shown within `limit` tokens (1: no stretches)."""
    mean = sum(t.token_count for t in turns) / max(len(turns), 1)
    held = limit / max(mean, 1) / STRETCHES_PER_BUDGET
    stretch = 2 ** round(math.log2(max(held, 1)))
    return stretch if stretch >= MIN_STRETCH_TURNS else 1


def anchored_transcript(
    groups: Sequence[list[TurnRecord]],
    history: History,
    limit: int,
    table_room: int,
    anthropic: bool,
    cost_of: Callable[[str], int],
) -> tuple[list[list[TurnRecord]], int, str, int] | None:
    """The transcript from the oldest stretch start at which it fits (every result but the
    `keep` newest as a stub) beside the value table of what it does not show: (groups, their
    cost, table, its cost); None when not even the newest group fits.

    Stretches are counted in turn seqs, so their boundaries stay where they are as the session
    grows: the start moves only when what follows it no longer fits, and between two moves
    each build's prompt is the previous one with the new turns added (a provider's prompt
    cache keeps hitting). The table depends only on the start (the values before it and those
    the shown stubs do not keep), so it changes only when the start moves. None too when
    the budget is too small for stretches (`stretch_turns`)."""
    stretch = stretch_turns(history.turns, limit)
    if stretch == 1:
        return None
    cleared = [history.cleared(g, history.unkept) for g in groups]
    costs = [group_cost(g, anthropic) for g in cleared]
    after = [0] * (len(cleared) + 1)
    for i in range(len(cleared) - 1, -1, -1):
        after[i] = after[i + 1] + costs[i]
    for i, group in enumerate(groups):
        if i and group[0].seq // stretch == groups[i - 1][0].seq // stretch:
            continue
        if after[i] > limit:
            continue
        shown = [t for g in cleared[i:] for t in g]
        table, table_cost = _stable_table(history, shown, table_room, cost_of)
        if after[i] + table_cost <= limit:
            return cleared[i:], after[i], table, table_cost
    return None


def _stable_table(
    history: History, shown: Sequence[TurnRecord], limit: int, cost_of: Callable[[str], int]
) -> tuple[str, int]:
    """The value table beside a transcript starting at `shown[0]`, within `limit`."""
    if limit <= 0:
        return "", 0
    return _fitted_table(history.stable_table_entries(shown), limit, cost_of)


def _fitted_table(
    rows: Sequence[TableEntry], limit: int, cost_of: Callable[[str], int]
) -> tuple[str, int]:
    """`fit_table` of `rows` within `limit` by its exact cost `cost_of`."""
    budget = limit
    while budget > 0:
        text, _ = fit_table(rows, budget)
        if not text:
            return "", 0
        cost = cost_of(text)
        if cost <= limit:
            return text, cost
        budget -= max(cost - limit, 1)
    return "", 0


def message_tokens_of(text: str) -> int:
    """A system message's cost (the value table's, estimated before its place is known)."""
    return message_tokens("system", text)


def value_table(
    history: History,
    shown: Sequence[Sequence[TurnRecord]],
    limit: int,
    cost_of: Callable[[str], int],
    notes: str,
) -> tuple[str, int]:
    """The value table of what neither the shown turns nor the `notes` hold, within `limit`
    (its exact cost by `cost_of`)."""
    if limit <= 0 or not history.has_values:
        return "", 0
    turns = [t for group in shown for t in group]
    return _fitted_table(history.table_entries(turns, notes), limit, cost_of)
