"""Which window turns an offload moves (pure, no I/O).

The offload moves the oldest C1 turns, in one batch, until usage is back at the goal the session's
budget sets (`app.domain.budget.Budget.offload_goal`), never touching the protected tail (the C1
floors, `Budget.recent_floor`) and never splitting a tool call from its tool results. When to
offload is the budget's concern, not this module's.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from app.domain.budget import RecentFloor
from app.domain.records import TurnRecord
from app.domain.tool_groups import atomic_units


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """The oldest C1 turns to move in one batch, and the predicted usage after moving them."""

    turns: tuple[TurnRecord, ...]
    tokens_freed: int
    tokens_after: int  # fixed + remaining C1
    floor_limited: bool  # the goal was not reached because the protected tail stopped the cut


def protected_start(turns: Sequence[TurnRecord], floor: RecentFloor) -> int:
    """Index of the first turn of the protected tail (the longer of the turn and token tails).

    The start is moved earlier when it would split a tool group, so the group stays in C1.
    """
    n = len(turns)
    if n == 0:
        return 0
    by_turns = max(0, n - floor.turns)
    tail = sum(t.token_count for t in turns[by_turns:])
    # The turn floor never protects more than `tail_cap` tokens (the newest turn is always kept).
    while by_turns < n - 1 and tail > floor.tail_cap:
        tail -= turns[by_turns].token_count
        by_turns += 1
    # Nor does the token floor hold a turn larger than the cap on its own (a layered tool result
    # of 2,000 tokens in a 2,200-token window): it is left to the offload, or the window never
    # drains. The newest turn is always kept.
    by_tokens, tail = n, 0
    while by_tokens > 0 and tail < floor.tokens:
        older = turns[by_tokens - 1].token_count
        if by_tokens < n and older > floor.tail_cap:
            break
        by_tokens -= 1
        tail += older
    start = min(by_turns, by_tokens)
    for unit in atomic_units(turns):
        if unit.start < start <= unit.stop - 1:
            return unit.start
    return start


def select_offload(
    turns: Sequence[TurnRecord], *, fixed_tokens: int, goal: int, floor: RecentFloor
) -> OffloadPlan:
    """Choose the oldest C1 turns to move so that `fixed + remaining C1 <= goal`.

    `turns` is C1 in seq order; `fixed_tokens` is the usage outside the window (c0 + c2 + reply
    priming). Whole atomic units (see `atomic_units`) are taken from the front until the goal is
    met or the next unit reaches into the protected tail (`protected_start`); `floor_limited`
    says the goal was not met for that reason.
    """
    if any(b.seq <= a.seq for a, b in pairwise(turns)):
        raise ValueError("turns must be in strictly increasing seq order")
    remaining = fixed_tokens + sum(t.token_count for t in turns)
    limit = protected_start(turns, floor)
    cut = 0
    for unit in atomic_units(turns):
        if remaining <= goal or unit.stop > limit:
            break
        remaining -= sum(turns[i].token_count for i in unit)
        cut = unit.stop
    moved = tuple(turns[:cut])
    return OffloadPlan(
        turns=moved,
        tokens_freed=sum(t.token_count for t in moved),
        tokens_after=remaining,
        floor_limited=remaining > goal,
    )
