import math

import pytest
from pydantic import ValidationError

from app.core.config import load_settings
from app.domain.budget import (
    REPLY_PRIMING_TOKENS,
    Budget,
    BudgetConfig,
    RecentFloor,
    config_error_field,
)


def budget(usage: int, **config: float) -> Budget:
    """A budget whose usage is exactly `usage` (all of it in the window)."""
    return Budget(BudgetConfig(**config), c0=0, c1=usage - REPLY_PRIMING_TOKENS, c2=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"context_limit": 8000, "reserve_tokens": 8000}, "reserve_tokens"),
        ({"context_limit": 4000}, "reserve_tokens"),
        ({"reserve_tokens": -1}, "reserve_tokens"),
        ({"context_limit": 3_000_000_000}, "context_limit"),
        ({"target_ratio": 0.0}, "target_ratio"),
        ({"target_ratio": 0.85}, "target_ratio"),
        ({"trigger_ratio": 0.97}, "trigger_ratio"),
        ({"emergency_ratio": 1.2}, "emergency_ratio"),
        ({"min_recent_turns": -1}, "min_recent_turns"),
        ({"min_recent_tokens": -5}, "min_recent_tokens"),
        ({"recall_top_k": 51}, "recall_top_k"),
        ({"recall_candidates": 0}, "recall_candidates"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(values: dict[str, float], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        BudgetConfig.model_validate(values)
    blamed, message = config_error_field(caught.value)
    assert blamed == field
    assert field in message


def test_overlay_keeps_defaults_and_ignores_unknown_keys() -> None:
    merged = BudgetConfig().overlay({"context_limit": 16_000, "reserve_tokens": 2_000, "x": 1})
    assert (merged.context_limit, merged.reserve_tokens, merged.trigger_ratio) == (
        16_000,
        2_000,
        0.8,
    )
    with pytest.raises(ValidationError):
        BudgetConfig().overlay({"context_limit": 4_000})


def test_usage_ratio_and_levels() -> None:
    b = Budget(BudgetConfig(), c0=100, c1=2_000, c2=300)
    assert b.available == 128_000 - 8_192
    assert b.usage() == 100 + 2_000 + 300 + REPLY_PRIMING_TOKENS
    assert b.fixed_tokens == 100 + 300 + REPLY_PRIMING_TOKENS
    assert b.ratio() == pytest.approx(b.usage() / b.available)
    available = b.available
    assert budget(int(0.79 * available)).level() == "normal"
    assert budget(int(0.80 * available) + 1).level() == "offload"
    assert budget(int(0.95 * available) + 1).level() == "emergency"
    # `extra` tokens (a query about to be sent) count towards the level.
    assert budget(int(0.94 * available)).level(extra=int(0.02 * available)) == "emergency"


def test_floors_capped_at_half_of_the_window_for_small_models() -> None:
    assert budget(10).recent_floor() == RecentFloor(12, 6_000, (128_000 - 8_192) // 2)
    small = budget(10, context_limit=8_192, reserve_tokens=2_192)
    assert small.recent_floor() == RecentFloor(12, 3_000, 3_000)


def test_hysteresis_fires_once_per_crossing() -> None:
    available = budget(10).available
    armed, fired_at = True, []
    for i, ratio in enumerate([0.5, 0.79, 0.81, 0.85, 0.9, 0.82, 0.65, 0.7, 0.8, 0.83, 0.6]):
        fired, armed = budget(math.ceil(ratio * available)).observe(armed)
        if fired:
            fired_at.append(i)
    assert fired_at == [2, 8]


def test_emergency_overrides_hysteresis() -> None:
    available = budget(10).available
    assert budget(int(0.90 * available)).observe(False) == (False, False)
    assert budget(int(0.96 * available)).observe(False) == (True, False)


def test_rearm_after_offload_only_below_trigger() -> None:
    available = budget(10).available
    assert budget(int(0.65 * available)).armed_after_offload()
    assert not budget(int(0.85 * available)).armed_after_offload()


def test_offload_goal_is_the_target_less_what_must_fit_beside() -> None:
    b = budget(10, context_limit=20_000, reserve_tokens=0)
    assert b.offload_goal() == 13_000
    assert b.offload_goal(extra=500) == 12_500


def test_after_leaving_takes_tokens_out_of_the_window_only() -> None:
    config = BudgetConfig(context_limit=20_000, reserve_tokens=0)
    b = Budget(config, c0=500, c1=15_000, c2=800)
    after = b.after_leaving(6_000)
    assert (after.config, after.c0, after.c1, after.c2) == (config, 500, 9_000, 800)
    assert after.usage() == b.usage() - 6_000
    assert (b.armed_after_offload(), after.armed_after_offload()) == (False, True)
    assert b.after_leaving(0) == b


def test_window_override_is_validated_like_a_session() -> None:
    b = budget(10)
    assert b.with_window(None, None) is b
    assert b.with_window(16_000, 2_000).available == 14_000
    with pytest.raises(ValidationError) as caught:
        b.with_window(4_000, None)
    assert config_error_field(caught.value)[0] == "reserve_tokens"


def test_bad_defaults_fail_at_startup_with_the_variable_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONTEXTD_SESSION_DEFAULTS__TARGET_RATIO", "0.9")
    with pytest.raises(ValidationError, match="target_ratio < trigger_ratio"):
        load_settings()
