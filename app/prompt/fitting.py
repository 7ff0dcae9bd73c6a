"""Fitting the transcript and the value table into what the budget leaves: the window and the
offloaded tail as whole tool groups (old results cleared to stubs first), the start of an agent's
transcript moved by stretches, and the value table of what the shown turns do not hold (pure).

`assembly.assemble_prompt` runs the phases at the end of this module (`fit_window`,
`fit_verbatim_tail`, `table_reserve`, `fit_tail_and_table`) in that order, around the found
blocks; they share a `Room`: what is left of the budget and what is shown so far."""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.prompt.blocks import SYSTEM_SEPARATOR, anthropic_counting_view, anthropic_messages
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
    window_start: int,
    history: History,
    limit: int,
    table_room: int,
    anthropic: bool,
    cost_of: Callable[[str], int],
) -> tuple[list[list[TurnRecord]], int, str, int] | None:
    """The transcript from the oldest stretch start at which it fits (every result but the
    `keep` newest as a stub) beside the value table of what it does not show: (groups, their
    cost, table, its cost); None when not even the newest group fits. The window's first group
    (`groups[window_start]`) is a start too, tried before the boundaries inside the window: a
    window turn is in no chunk yet, so left out for a boundary, no recall could bring it back.

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
        boundary = not i or group[0].seq // stretch != groups[i - 1][0].seq // stretch
        if not boundary and i != window_start:
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


def system_string_cost(parts: Sequence[str]) -> int:
    """Exact cost of the Anthropic system string made of `parts` (0 when there is none)."""
    text = SYSTEM_SEPARATOR.join(p for p in parts if p)
    return message_tokens("system", text) if text else 0


def system_added(prefix: Sequence[str], text: str, anthropic: bool) -> int:
    """What a system block (the value table) adds after `prefix`: its own message, or in
    Anthropic format its part of the system string."""
    if anthropic:
        return system_string_cost([*prefix, text]) - system_string_cost(prefix)
    return message_tokens("system", text)


@dataclass(frozen=True, slots=True)
class Transcript:
    """The history a build may show as tool groups: those from `split` on hold the window (its
    first turn `first_window_seq`), those before it the offloaded tail's own."""

    history: History
    groups: list[list[TurnRecord]]
    split: int
    first_window_seq: int
    anthropic: bool


@dataclass(slots=True)
class Room:
    """What the phases of an assembly share as they fill the budget: what is `left` of it, the
    transcript shown so far (the offloaded `tail` and the window's `kept` groups, costing
    `c1_cost`), and the value `table` with its cost."""

    left: int
    c1_cost: int = 0
    tail: list[list[TurnRecord]] = field(default_factory=list)
    kept: list[list[TurnRecord]] = field(default_factory=list)
    table: str = ""
    table_cost: int = 0


def fit_window(
    transcript: Transcript,
    room: Room,
    *,
    table_tokens: int,
    c0_text: str,
    notes: str,
    whole_history: bool,
    no_query: bool,
) -> tuple[bool, bool, int]:
    """The window into `room` (in an agent's step past its budget, the anchored transcript and
    its table): whether the transcript is anchored, whether the whole window fits, and how many
    window groups before `room.kept` may fill what the table leaves."""
    history, groups, split = transcript.history, transcript.groups, transcript.split
    anthropic = transcript.anthropic
    # The value table's room comes before the window's: old results in the window are cleared
    # (their stubs keep their values) rather than the values of offloaded turns left out. It
    # gets up to half of what is left: what its version beside the whole window takes, or, when
    # the window does not fit even cleared, what the values of the turns it leaves out take.
    # Only old results are cleared for it: the `keep` newest stay while the window fits.
    table_room = min(table_tokens, room.left // 2) if history.has_values else 0
    prefix0 = [c0_text, notes]

    def cost0(text: str) -> int:
        return system_added(prefix0, text, anthropic)

    # An agent's step in a tool loop (no new input) whose offloaded turns do not all fit
    # verbatim: the transcript starts at a stretch boundary (`anchored_transcript`), so
    # consecutive builds share their head. A build with a query keeps recall's precedence over
    # the tail: the question may be about what only recall brings back.
    anchored = None
    if (
        no_query
        and history.has_values
        and split
        and not whole_history
        and fit_whole(groups, history, room.left, anthropic, most=0) is None
    ):
        anchored = anchored_transcript(
            groups, split, history, room.left, table_room, anthropic, cost0
        )
    if anchored is None:
        return (False, *_free_window(transcript, room, table_room, notes))
    shown_groups, room.c1_cost, room.table, room.table_cost = anchored
    room.tail = [g for g in shown_groups if g[-1].seq < transcript.first_window_seq]
    room.kept = shown_groups[len(room.tail) :]
    room.left -= room.c1_cost + room.table_cost
    return True, len(room.kept) == len(groups) - split, 0


def _free_window(
    transcript: Transcript, room: Room, table_room: int, notes: str
) -> tuple[bool, int]:
    """The window's newest groups into `room` beside the table's room: whether the whole window
    fits, and how many older groups may fill what the table leaves."""
    history, groups, split = transcript.history, transcript.groups, transcript.split
    anthropic, left = transcript.anthropic, room.left
    older = 0
    need = value_table(history, groups[split:], table_room, message_tokens_of, notes)[1]
    whole = fit_whole(groups[split:], history, left - need, anthropic, most=history.unkept)
    if whole is not None:
        room.kept, room.c1_cost = whole
    else:
        # The newest results stay whole before the table gets its room.
        room.kept, room.c1_cost = fit_transcript(
            groups[split:], history, left - table_room, anthropic, most=history.unkept
        )
        if not room.kept:
            # Not even the newest group fits beside the table's room: it alone first, then
            # the table, then the older groups with what the table leaves.
            room.kept, room.c1_cost = fit_transcript(groups[split:][-1:], history, left, anthropic)
            older = len(groups) - split - 1 if room.kept else 0
    room.left -= room.c1_cost
    return whole is not None, older


def fit_verbatim_tail(transcript: Transcript, room: Room) -> None:
    """The offloaded tail's groups, verbatim, when they all fit what is left."""
    history, split = transcript.history, transcript.split
    verbatim = fit_whole(
        transcript.groups[:split], history, room.left, transcript.anthropic, most=0
    )
    if verbatim is not None:
        room.tail, tail_cost = verbatim
        room.c1_cost += tail_cost
        room.left -= tail_cost


def table_reserve(
    transcript: Transcript, room: Room, *, table_tokens: int, notes: str, anchored: bool
) -> tuple[str, int]:
    """The value table at its fullest (or the anchored one) and the room kept for it from
    recall and the tail: what its full version would take of the values the window does not
    show (nothing in a session without tool values)."""
    if table_tokens and transcript.history.has_values and not anchored:
        return value_table(
            transcript.history,
            [*room.tail, *room.kept],
            min(table_tokens, room.left),
            message_tokens_of,
            notes,
        )
    return room.table, 0


def fit_tail_and_table(
    transcript: Transcript,
    room: Room,
    *,
    reserve: int,
    notes: str,
    prefix: Sequence[str],
    anchored: bool,
    window_whole: bool,
    older: int,
) -> None:
    """What is left goes to the transcript's offloaded tail and the value table: the tail's
    turns (their old results as stubs) newest first within what the table leaves it, then the
    table of the values no shown turn holds, then the tail again with what the table did not
    use (and older window groups with what is left after that)."""
    history, groups, split = transcript.history, transcript.groups, transcript.split
    anthropic = transcript.anthropic

    def table_cost_of(text: str) -> int:
        return system_added(prefix, text, anthropic)

    if window_whole and split and not room.tail and not anchored:
        room.tail, tail_cost = fit_transcript(
            groups[:split], history, room.left - reserve, anthropic
        )
        room.c1_cost += tail_cost
        room.left -= tail_cost
    if reserve and not anchored:
        room.table, room.table_cost = value_table(
            history, [*room.tail, *room.kept], room.left, table_cost_of, notes
        )
        room.left -= room.table_cost
    if window_whole and split > len(room.tail) and room.left > 0 and not anchored:
        more, more_cost = fit_transcript(
            groups[: split - len(room.tail)],
            history,
            room.left,
            anthropic,
            clear_all=bool(room.tail),
        )
        room.tail = [*more, *room.tail]
        room.c1_cost += more_cost
        room.left -= more_cost
    if older and room.left > 0:
        more, more_cost = fit_transcript(
            groups[split : split + older], history, room.left, anthropic, most=history.unkept
        )
        room.kept = [*more, *room.kept]
        room.c1_cost += more_cost
        room.left -= more_cost
