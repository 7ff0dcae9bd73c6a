from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.budget import Budget, BudgetConfig
from app.domain.records import TurnRecord
from app.domain.tool_groups import atomic_units
from app.offload.policy import OffloadPlan, protected_start, select_offload

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def turn(seq: int, tokens: int, role: str = "user", **kw: object) -> TurnRecord:
    return TurnRecord(seq, role, f"turn {seq}", tokens, T0 + timedelta(seconds=seq), **kw)  # type: ignore[arg-type]


def call(seq: int, tokens: int, *ids: str) -> TurnRecord:
    calls = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]
    return turn(seq, tokens, "assistant", tool_calls=calls)


def result(seq: int, tokens: int, call_id: str) -> TurnRecord:
    return turn(seq, tokens, "tool", tool_call_id=call_id)


def budget(**config: int) -> Budget:
    return Budget(BudgetConfig(**config), c0=0, c1=0, c2=0)  # type: ignore[arg-type]


def plan_for(
    turns: list[TurnRecord], fixed: int, b: Budget, until_tokens: int | None = None
) -> OffloadPlan:
    goal = b.offload_goal() if until_tokens is None else until_tokens
    return select_offload(turns, fixed_tokens=fixed, goal=goal, floor=b.recent_floor())


def test_offload_reaches_target_with_the_fewest_oldest_turns() -> None:
    cfg = budget()
    turns = [turn(i, 1000) for i in range(100)]
    plan = plan_for(turns, 2000, cfg)
    goal = int(0.65 * cfg.available)
    assert plan.turns == tuple(turns[: len(plan.turns)])
    assert plan.tokens_after <= goal < plan.tokens_after + 1000
    assert plan.tokens_freed == 1000 * len(plan.turns)
    assert not plan.floor_limited


def test_until_tokens_overrides_target() -> None:
    turns = [turn(i, 1000) for i in range(100)]
    plan = plan_for(turns, 0, budget(), until_tokens=50_000)
    assert plan.tokens_after == 50_000
    assert len(plan.turns) == 50


def test_nothing_moves_below_target() -> None:
    plan = plan_for([turn(i, 100) for i in range(20)], 0, budget())
    assert plan.turns == () and not plan.floor_limited


def test_token_floor_is_the_longer_tail_and_stops_the_cut() -> None:
    cfg = budget(context_limit=20_000, reserve_tokens=0, min_recent_turns=2)
    turns = [turn(i, 1000) for i in range(19)]  # 19000 tokens, ratio 0.95
    plan = plan_for(turns, 0, cfg)
    # target 13000 needs 6 turns; the 6000-token floor keeps the last 6 turns: allowed (13 left).
    assert len(plan.turns) == 6 and not plan.floor_limited
    plan = plan_for(turns, 9000, cfg)
    assert len(plan.turns) == 13 and plan.floor_limited
    assert sum(t.token_count for t in turns[13:]) == 6000


def test_turn_floor_capped_at_half_of_available() -> None:
    cfg = budget(context_limit=10_000, reserve_tokens=0, min_recent_tokens=0)
    turns = [turn(i, 900) for i in range(11)]  # 12-turn floor would protect all 9900 tokens
    plan = plan_for(turns, 3000, cfg)
    assert len(plan.turns) == 6  # the 11-turn tail (9900) is trimmed to 5 turns (4500 <= 5000)
    assert plan.floor_limited


def test_token_floor_capped_too_so_a_layered_result_leaves_a_small_window() -> None:
    # A 2,500-token model: a tool result layered on arrival keeps a ~2,000-token view, more than
    # half the window. The token floor stops short of it, so the offload can move it (its whole
    # text is in C3 already) instead of leaving the window over the emergency ratio for good.
    cfg = budget(context_limit=2500, reserve_tokens=300)
    turns = [turn(0, 16), call(1, 41, "doc"), result(2, 1986, "doc"), turn(3, 11)]
    turns += [call(4, 39, "cancel"), result(5, 28, "cancel"), turn(6, 23, "assistant")]
    assert cfg.recent_floor() == (12, 1100, 1100)
    assert protected_start(turns, cfg.recent_floor()) == 3
    plan = plan_for(turns, 500, cfg)
    assert [t.seq for t in plan.turns] == [0, 1, 2] and not plan.floor_limited
    assert plan.tokens_after == 500 + 11 + 39 + 28 + 23


def test_tool_group_straddling_the_floor_stays_in_c1() -> None:
    cfg = budget(context_limit=10_000, reserve_tokens=0, min_recent_turns=3, min_recent_tokens=0)
    turns = [turn(i, 1000) for i in range(4)]
    turns += [call(4, 1000, "a", "b"), result(5, 500, "a"), result(6, 500, "b")]
    turns += [turn(7, 500), turn(8, 500)]
    assert protected_start(turns, cfg.recent_floor()) == 4
    plan = plan_for(turns, 5000, cfg)
    assert [t.seq for t in plan.turns] == [0, 1, 2, 3] and plan.floor_limited


def test_tool_group_moves_whole_when_the_cut_needs_it() -> None:
    cfg = budget(context_limit=10_000, reserve_tokens=0, min_recent_turns=2, min_recent_tokens=0)
    turns = [call(0, 3000, "x"), turn(1, 100), result(2, 3000, "x")]
    turns += [turn(i, 500) for i in range(3, 7)]
    assert [list(u) for u in atomic_units(turns)][:2] == [[0, 1, 2], [3]]
    plan = plan_for(turns, 0, cfg, until_tokens=6000)
    assert [t.seq for t in plan.turns] == [0, 1, 2]


def test_rejects_unordered_turns() -> None:
    with pytest.raises(ValueError, match="seq"):
        plan_for([turn(2, 10), turn(1, 10)], 0, budget())


@st.composite
def c1_turns(draw: st.DrawFn) -> list[TurnRecord]:
    turns: list[TurnRecord] = []
    for _ in range(draw(st.integers(0, 40))):
        seq = len(turns)
        if draw(st.booleans()) and draw(st.integers(0, 3)) == 0:
            ids = [f"c{seq}_{k}" for k in range(draw(st.integers(1, 3)))]
            turns.append(call(seq, draw(st.integers(5, 3000)), *ids))
            for cid in ids:
                turns.append(result(len(turns), draw(st.integers(5, 3000)), cid))
        else:
            turns.append(turn(seq, draw(st.integers(5, 3000))))
    return turns


@settings(max_examples=200, deadline=None)
@given(
    turns=c1_turns(),
    fixed=st.integers(0, 5000),
    limit=st.integers(8000, 60000),
    floor_turns=st.integers(1, 15),
    floor_tokens=st.integers(0, 10000),
)
def test_offload_properties(
    turns: list[TurnRecord], fixed: int, limit: int, floor_turns: int, floor_tokens: int
) -> None:
    cfg = budget(
        context_limit=limit,
        reserve_tokens=2000,
        min_recent_turns=floor_turns,
        min_recent_tokens=floor_tokens,
    )
    plan = plan_for(turns, fixed, cfg)
    cut = len(plan.turns)
    kept = turns[cut:]
    goal = int(cfg.config.target_ratio * cfg.available)
    assert plan.turns == tuple(turns[:cut])
    assert plan.tokens_after == fixed + sum(t.token_count for t in kept)
    assert plan.floor_limited == (plan.tokens_after > goal)
    # Floors: the token floor (capped) and the turn floor (capped in tokens) are never entered.
    turn_floor, token_floor, cap = cfg.recent_floor()
    kept_tokens = sum(t.token_count for t in kept)
    if kept_tokens < min(token_floor, sum(t.token_count for t in turns)):
        assert turns[cut - 1].token_count > cap  # the next turn alone is larger than the cap
    last = turns[-turn_floor:]
    assert len(kept) >= len(last) or sum(t.token_count for t in last) > cfg.available // 2
    if turns:
        assert kept
    # Tool groups: moved together or kept together.
    moved_ids = {t.seq for t in plan.turns}
    for unit in atomic_units(turns):
        assert len({turns[i].seq in moved_ids for i in unit}) == 1
    # Minimal: dropping the last moved unit would miss the goal.
    if plan.turns:
        last_unit = next(u for u in atomic_units(turns) if u.stop == cut)
        assert plan.tokens_after + sum(turns[i].token_count for i in last_unit) > goal
