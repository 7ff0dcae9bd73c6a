"""Wire shapes of the sessions and turns API (spec §9)."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.input import RequestBody

SESSION_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

Role = Literal["user", "assistant", "tool", "system"]
WatermarkLevel = Literal["normal", "offload", "emergency"]


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=128)
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class TurnIn(BaseModel):
    """An OpenAI-style message. Unknown extra fields of SDK message objects are ignored."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"role": "user", "content": "Book the 9:40 to Lyon."}]},
    )
    role: Role
    content: str | None = Field(None, description="text; may be null on a tool-calling turn")
    name: str | None = Field(None, max_length=128)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(None, max_length=128)
    metadata: dict[str, Any] | None = None


class AppendTurnsRequest(RequestBody):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "turns": [
                        {"role": "user", "content": "Book the 9:40 to Lyon, at most 120 EUR."},
                        {"role": "assistant", "content": "Booked: ticket LY-40917, 96 EUR."},
                    ]
                }
            ]
        },
    )
    turns: list[TurnIn] = Field(min_length=1)


class Usage(BaseModel):
    c0: int = Field(description="system prompt and tool schemas")
    c1: int = Field(description="turns in the window, framing included")
    c2: int = Field(description="notes")
    total: int = Field(description="c0 + c1 + c2 + reply priming")
    limit: int = Field(description="C - r: tokens a prompt may use")


class Watermark(BaseModel):
    ratio: float
    level: WatermarkLevel


class AppendedTurn(BaseModel):
    seq: int
    role: Role
    token_count: int
    created_at: datetime


class AppendTurnsResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "turns": [
                        {
                            "seq": 1,
                            "role": "user",
                            "token_count": 20,
                            "created_at": "2026-11-29T12:00:00Z",
                        },
                    ],
                    "usage": {"c0": 0, "c1": 20, "c2": 0, "total": 23, "limit": 119808},
                    "watermark": {"ratio": 0.0002, "level": "normal"},
                    "offload_enqueued": False,
                }
            ]
        }
    )
    turns: list[AppendedTurn]
    usage: Usage
    watermark: Watermark
    offload_enqueued: bool = Field(description="this append crossed θ and enqueued an offload")


class TurnOut(BaseModel):
    seq: int
    role: Role
    content: str
    name: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    metadata: dict[str, Any]
    token_count: int
    created_at: datetime
    chunk_id: str | None = Field(description="null while the turn is in the window (C1)")


class TurnPage(BaseModel):
    turns: list[TurnOut]
    next_cursor: str | None


class SessionConfig(BaseModel):
    context_limit: int
    reserve_tokens: int
    trigger_ratio: float
    emergency_ratio: float
    target_ratio: float
    min_recent_turns: int
    min_recent_tokens: int
    recall_top_k: int
    recall_budget_tokens: int
    recall_candidates: int


class SessionConfigUpdate(RequestBody):
    """Every field optional; `null` leaves a value unchanged."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"context_limit": 16000, "reserve_tokens": 2000, "user_id": "u-42"}]
        },
    )
    context_limit: int | None = Field(None, gt=0)
    reserve_tokens: int | None = Field(None, ge=0)
    trigger_ratio: float | None = Field(None, gt=0, le=1)
    emergency_ratio: float | None = Field(None, gt=0, le=1)
    target_ratio: float | None = Field(None, gt=0, le=1)
    min_recent_turns: int | None = Field(None, ge=0)
    min_recent_tokens: int | None = Field(None, ge=0)
    recall_top_k: int | None = Field(None, ge=0, le=50)
    recall_budget_tokens: int | None = Field(None, ge=0)
    recall_candidates: int | None = Field(None, ge=1, le=500)
    c0_tokens: int | None = Field(None, ge=0)
    user_id: str | None = Field(None, min_length=1, max_length=128)
    metadata: dict[str, Any] | None = None


class SessionCounts(BaseModel):
    turns: int
    chunks: int
    memories: int


class SessionOut(SessionConfig):
    session_id: str
    user_id: str | None
    metadata: dict[str, Any]
    usage: Usage
    watermark: Watermark
    counts: SessionCounts
    last_offload_at: datetime | None
    created_at: datetime
