"""Watermark policy: when to offload and which C1 turns to move (pure, no I/O).

Usage is measured against the available window `C - r`. A trigger fires at the trigger ratio θ; the
offload then moves the oldest C1 turns, in one batch, until usage is back at the target ratio, never
touching the protected tail (the C1 floors) and never splitting a tool call from its tool results.

Hysteresis is two small functions the caller threads a per-session `armed` flag through::

    fired = should_trigger(ratio, armed, cfg)    # enqueue one offload job when True
    armed = next_armed(ratio, armed, fired, cfg)  # persist with the session

A session starts armed. Firing disarms it; it is re-armed by the first observation below θ (normally
the one right after the offload lands at the target). So an offload that could not get below θ
because of the floors does not re-fire on every append (no trickle offloading), except at the
emergency ratio, which overrides hysteresis so the window never overflows. Time-based cooldown and
job deduplication are the caller's concern.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from app.sessions.domain import TurnRecord

DEFAULT_CONTEXT_LIMIT = 128_000
DEFAULT_RESERVE_TOKENS = 8_192
DEFAULT_TRIGGER_RATIO = 0.80
DEFAULT_EMERGENCY_RATIO = 0.95
DEFAULT_TARGET_RATIO = 0.65
DEFAULT_MIN_RECENT_TURNS = 12
DEFAULT_MIN_RECENT_TOKENS = 6_000

Level = Literal["normal", "offload", "emergency"]


@dataclass(frozen=True, slots=True)
class WatermarkConfig:
    """Per-session budget; ratios are fractions of `available` (context_limit - reserve_tokens)."""

    context_limit: int = DEFAULT_CONTEXT_LIMIT
    reserve_tokens: int = DEFAULT_RESERVE_TOKENS
    trigger_ratio: float = DEFAULT_TRIGGER_RATIO
    emergency_ratio: float = DEFAULT_EMERGENCY_RATIO
    target_ratio: float = DEFAULT_TARGET_RATIO
    min_recent_turns: int = DEFAULT_MIN_RECENT_TURNS
    min_recent_tokens: int = DEFAULT_MIN_RECENT_TOKENS

    def __post_init__(self) -> None:
        if self.reserve_tokens < 0:
            raise ValueError("reserve_tokens must be >= 0")
        if self.available <= 0:
            raise ValueError("context_limit must exceed reserve_tokens (available must be > 0)")
        if not 0 < self.target_ratio < self.trigger_ratio:
            raise ValueError("target_ratio must satisfy 0 < target_ratio < trigger_ratio")
        if not self.trigger_ratio <= self.emergency_ratio:
            raise ValueError("trigger_ratio must be <= emergency_ratio")
        if not self.emergency_ratio <= 1:
            raise ValueError("emergency_ratio must be <= 1")
        if self.min_recent_turns < 0:
            raise ValueError("min_recent_turns must be >= 0")
        if self.min_recent_tokens < 0:
            raise ValueError("min_recent_tokens must be >= 0")

    @property
    def available(self) -> int:
        """Tokens the prompt may use: `C - r`."""
        return self.context_limit - self.reserve_tokens


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """The oldest C1 turns to move in one batch, and the predicted state after moving them."""

    turns: tuple[TurnRecord, ...]
    tokens_freed: int
    tokens_after: int  # fixed + remaining C1
    ratio_after: float
    floor_limited: bool  # the goal was not reached because the protected tail stopped the cut


def usage_ratio(total_tokens: int, cfg: WatermarkConfig) -> float:
    """`u / (C - r)` where `u = c0 + c1 + c2` (framing included)."""
    return total_tokens / cfg.available


def watermark_level(ratio: float, cfg: WatermarkConfig) -> Level:
    if ratio >= cfg.emergency_ratio:
        return "emergency"
    if ratio >= cfg.trigger_ratio:
        return "offload"
    return "normal"


def should_trigger(ratio: float, armed: bool, cfg: WatermarkConfig) -> bool:
    """Fire when at/above θ and armed; at/above the emergency ratio, fire even when disarmed."""
    if ratio >= cfg.emergency_ratio:
        return True
    return armed and ratio >= cfg.trigger_ratio


def next_armed(ratio: float, armed: bool, fired: bool, cfg: WatermarkConfig) -> bool:
    """The `armed` flag to store after an observation: firing disarms, dropping below θ re-arms."""
    if fired:
        return False
    if ratio < cfg.trigger_ratio:
        return True
    return armed


def effective_floors(cfg: WatermarkConfig) -> tuple[int, int]:
    """`(min_recent_turns, min_recent_tokens)` with the token floor capped at `available // 2`.

    The turn floor keeps its count, but `select_offload` stops the turn-protected tail from growing
    past `available // 2` tokens (the newest turn is always kept), so small models still offload.
    """
    return cfg.min_recent_turns, min(cfg.min_recent_tokens, cfg.available // 2)


def atomic_units(turns: Sequence[TurnRecord]) -> list[range]:
    """Split `turns` into consecutive index ranges that must move (or chunk) together.

    A unit is one turn, or an assistant turn with `tool_calls` through the last tool turn answering
    one of its call ids (turns in between ride along). Overlapping groups are merged. Tool results
    whose call is not in `turns` are single-turn units.
    """
    ends = list(range(len(turns)))  # ends[i]: last index that must stay with turn i
    for i, turn in enumerate(turns):
        ids = {c.get("id") for c in turn.tool_calls or [] if c.get("id")}
        if not ids:
            continue
        for j in range(i + 1, len(turns)):
            if turns[j].role == "tool" and turns[j].tool_call_id in ids:
                ends[i] = j
    units: list[range] = []
    start, reach = 0, -1
    for i in range(len(turns)):
        reach = max(reach, ends[i])
        if i == reach:
            units.append(range(start, i + 1))
            start = i + 1
    return units


def protected_start(turns: Sequence[TurnRecord], cfg: WatermarkConfig) -> int:
    """Index of the first turn of the protected tail (the longer of the turn and token tails).

    The start is moved earlier when it would split a tool group, so the group stays in C1.
    """
    n = len(turns)
    if n == 0:
        return 0
    floor_turns, floor_tokens = effective_floors(cfg)
    cap = cfg.available // 2
    by_turns = max(0, n - floor_turns)
    tail = sum(t.token_count for t in turns[by_turns:])
    while by_turns < n - 1 and tail > cap:
        tail -= turns[by_turns].token_count
        by_turns += 1
    by_tokens, tail = n, 0
    while by_tokens > 0 and tail < floor_tokens:
        by_tokens -= 1
        tail += turns[by_tokens].token_count
    start = min(by_turns, by_tokens)
    for unit in atomic_units(turns):
        if unit.start < start <= unit.stop - 1:
            return unit.start
    return start


def select_offload(
    turns: Sequence[TurnRecord],
    fixed_tokens: int,
    cfg: WatermarkConfig,
    until_tokens: int | None = None,
) -> OffloadPlan:
    """Choose the oldest C1 turns to move so that `fixed + remaining C1 <= goal`.

    `turns` is C1 in seq order; `fixed_tokens` is c0 + c2 + reply priming; the goal is
    `until_tokens` when given, else `floor(target_ratio * available)`. Whole atomic units (see
    `atomic_units`) are taken from the front until the goal is met or the next unit reaches into the
    protected tail (`protected_start`); `floor_limited` says the goal was not met for that reason.
    """
    if any(b.seq <= a.seq for a, b in pairwise(turns)):
        raise ValueError("turns must be in strictly increasing seq order")
    goal = until_tokens if until_tokens is not None else int(cfg.target_ratio * cfg.available)
    remaining = fixed_tokens + sum(t.token_count for t in turns)
    limit = protected_start(turns, cfg)
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
        ratio_after=usage_ratio(remaining, cfg),
        floor_limited=remaining > goal,
    )
