"""The session budget, in one place: configuration, usage, watermark level, trigger and re-arm,
the emergency band and the offload goal. Pure: no I/O, nothing imported from the rest of `app`.

Usage `u = c0 + c1 + c2 + reply priming` (every message's framing is already in its layer's
count) is measured against the window a prompt may fill, `available = C - r`:

    budget = Budget(config, c0=..., c1=..., c2=...)
    budget.ratio()                      # u / (C - r)
    budget.level()                      # normal | offload (≥ θ) | emergency (≥ emergency ratio)
    fired, armed = budget.observe(armed)  # after every change of usage: enqueue when fired
    budget.offload_goal()               # usage an offload brings the session down to

Hysteresis: a session starts armed; firing disarms it; the first observation below θ re-arms it
(normally the one right after the offload lands at the target). So an offload that could not get
below θ because of the window floors does not re-fire on every append (no trickle offloading),
except at the emergency ratio, which overrides hysteresis so the window never overflows.
"""

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# The assistant reply is primed with these tokens in every prompt (OpenAI chat accounting).
REPLY_PRIMING_TOKENS = 3

# Upper bounds of the settings: far above any model's window, far below every column's range.
MAX_WINDOW_TOKENS = 10_000_000
MAX_RECENT_TURNS = 100_000
MAX_RECALL_TOP_K = 50
MAX_RECALL_CANDIDATES = 500
MAX_TOOL_RESULTS_KEPT = 1_000
MAX_EXCLUDED_TOOLS = 64

Level = Literal["normal", "offload", "emergency"]


class BudgetOrderError(ValueError):
    """Values that are each in range but do not fit together; `field` is the one to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class BudgetConfig(BaseModel):
    """A session's budget and recall settings. The deployment's defaults
    (`CONTEXTD_SESSION_DEFAULTS__*`) are one of these; a session's effective configuration is
    the defaults overlaid with the values set on it (`PUT /v1/sessions/{id}`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context_limit: int = Field(
        128_000, ge=1, le=MAX_WINDOW_TOKENS, description="model context window C, tokens"
    )
    reserve_tokens: int = Field(
        8_192,
        ge=0,
        le=MAX_WINDOW_TOKENS,
        description="reserve r: output + tool jitter + margin",
    )
    trigger_ratio: float = Field(0.80, gt=0, le=1, description="θ: offload when u/(C-r) reaches it")
    emergency_ratio: float = Field(0.95, gt=0, le=1, description="build-prompt offloads inline")
    target_ratio: float = Field(0.65, gt=0, lt=1, description="ratio an offload brings usage to")
    min_recent_turns: int = Field(12, ge=0, le=MAX_RECENT_TURNS, description="C1 floor in turns")
    min_recent_tokens: int = Field(
        6_000, ge=0, le=MAX_WINDOW_TOKENS, description="C1 floor in tokens"
    )
    c0_tokens: int = Field(
        0,
        ge=0,
        le=MAX_WINDOW_TOKENS,
        description="system prompt size until build-prompt reports it",
    )
    recall_top_k: int = Field(5, ge=0, le=MAX_RECALL_TOP_K, description="recalled chunks per build")
    recall_budget_tokens: int = Field(
        1_000, ge=0, le=MAX_WINDOW_TOKENS, description="B: tokens for recalled history"
    )
    recall_candidates: int = Field(
        30, ge=1, le=MAX_RECALL_CANDIDATES, description="R: wide-recall candidates per arm"
    )
    # Tool-result clearing (named after Anthropic's `clear_tool_uses` controls); the defaults
    # were chosen on tau-bench's tune split (docs/BENCHMARKS.md, "Agents that call tools").
    tool_results_keep: int = Field(
        3,
        ge=0,
        le=MAX_TOOL_RESULTS_KEPT,
        description="newest tool results kept whole while older ones can be cleared",
    )
    tool_results_exclude_tools: tuple[Annotated[str, Field(max_length=128)], ...] = Field(
        (), max_length=MAX_EXCLUDED_TOOLS, description="tools whose results are never cleared"
    )
    tool_results_clear_at_least: int = Field(
        0, ge=0, le=MAX_WINDOW_TOKENS, description="tokens cleared at a time, at least"
    )
    tool_results_clear_tool_inputs: bool = Field(
        False, description="also empty a cleared result's call arguments (its stub keeps them)"
    )
    value_table_tokens: int = Field(
        750,
        ge=0,
        le=MAX_WINDOW_TOKENS,
        description="the value table's tokens at most, when history does not fit",
    )

    @model_validator(mode="after")
    def _check_order(self) -> "BudgetConfig":
        if self.reserve_tokens >= self.context_limit:
            raise BudgetOrderError(
                "reserve_tokens",
                f"reserve_tokens ({self.reserve_tokens}) must be smaller than context_limit "
                f"({self.context_limit}); set both together when the window is small",
            )
        if not self.target_ratio < self.trigger_ratio <= self.emergency_ratio:
            field = "target_ratio" if self.target_ratio >= self.trigger_ratio else "trigger_ratio"
            raise BudgetOrderError(
                field,
                "ratios must satisfy target_ratio < trigger_ratio <= emergency_ratio; got "
                f"{self.target_ratio} / {self.trigger_ratio} / {self.emergency_ratio}",
            )
        return self

    def overlay(self, values: dict[str, Any]) -> "BudgetConfig":
        """These settings with `values` (a session's own, or an update) on top, validated."""
        known = {k: v for k, v in values.items() if k in type(self).model_fields}
        if not known:  # nothing on top (most sessions): these settings, already validated
            return self
        return type(self).model_validate({**self.model_dump(), **known})


def config_error_field(error: ValidationError) -> tuple[str | None, str]:
    """The field to blame and a message for a failed `BudgetConfig` validation."""
    first = error.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, BudgetOrderError):
        return cause.field, str(cause)
    loc = first.get("loc") or ()
    field = str(loc[0]) if loc else None
    return field, f"{field}: {first.get('msg')}" if field else str(first.get("msg"))


class RecentFloor(NamedTuple):
    """What offload never takes from the end of the window (C1)."""

    turns: int  # at least this many of the newest turns ...
    tokens: int  # ... and at least this many tokens of them
    tail_cap: int  # but the turn floor never protects more than this many tokens, nor the
    # token floor a turn above it (the newest turn: always)


class Observation(NamedTuple):
    fired: bool  # enqueue one offload now
    armed: bool  # the `offload_armed` flag to store with the session


@dataclass(frozen=True, slots=True)
class Budget:
    """A session's budget at one moment: its configuration and the tokens of its layers."""

    config: BudgetConfig
    c0: int  # system prompt and tool schemas
    c1: int  # the window's turns, framing included
    c2: int  # the notes block

    @property
    def available(self) -> int:
        """Tokens a prompt may use: `C - r`."""
        return self.config.context_limit - self.config.reserve_tokens

    def usage(self, extra: int = 0) -> int:
        """`c0 + c1 + c2 + reply priming`, plus `extra` tokens about to be added (a query)."""
        return self.c0 + self.c1 + self.c2 + REPLY_PRIMING_TOKENS + extra

    @property
    def fixed_tokens(self) -> int:
        """The part of usage an offload cannot reduce: everything but the window."""
        return self.usage() - self.c1

    def ratio(self, extra: int = 0) -> float:
        return self.usage(extra) / self.available

    def level(self, extra: int = 0) -> Level:
        ratio = self.ratio(extra)
        if ratio >= self.config.emergency_ratio:
            return "emergency"
        if ratio >= self.config.trigger_ratio:
            return "offload"
        return "normal"

    def observe(self, armed: bool) -> Observation:
        """Fire at/above θ when armed, and at/above the emergency ratio always; firing disarms,
        a ratio below θ re-arms."""
        ratio = self.ratio()
        fired = ratio >= self.config.emergency_ratio or (
            armed and ratio >= self.config.trigger_ratio
        )
        if fired:
            return Observation(True, False)
        return Observation(False, armed or ratio < self.config.trigger_ratio)

    def armed_after_offload(self) -> bool:
        """An offload just ran (or found nothing to move): armed again only if below θ."""
        return self.ratio() < self.config.trigger_ratio

    def offload_goal(self, extra: int = 0) -> int:
        """Usage an offload aims for: the target ratio of the window, less `extra` tokens that
        must fit beside it (the query of an emergency build)."""
        return int(self.config.target_ratio * self.available) - extra

    def recent_floor(self) -> RecentFloor:
        """The window floors, capped at half the window so small models still offload."""
        cap = self.available // 2
        return RecentFloor(
            self.config.min_recent_turns, min(self.config.min_recent_tokens, cap), cap
        )

    def with_window(self, context_limit: int | None, reserve_tokens: int | None) -> "Budget":
        """This budget under a per-request window override (validated like a session's)."""
        changes = {
            k: v
            for k, v in (("context_limit", context_limit), ("reserve_tokens", reserve_tokens))
            if v is not None
        }
        return replace(self, config=self.config.overlay(changes)) if changes else self

    def with_counters(
        self, *, c0: int | None = None, c1: int | None = None, c2: int | None = None
    ) -> "Budget":
        """The same configuration with other layer sizes."""
        return Budget(
            self.config,
            c0=self.c0 if c0 is None else c0,
            c1=self.c1 if c1 is None else c1,
            c2=self.c2 if c2 is None else c2,
        )

    def after_leaving(self, tokens: int) -> "Budget":
        """This budget once `tokens` of the window's turns left it (offloaded or forgotten)."""
        return self.with_counters(c1=self.c1 - tokens)
