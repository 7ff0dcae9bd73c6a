"""Wire shapes of the sessions and turns API (spec §9)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from app.domain.budget import Budget, BudgetConfig, Level
from app.http.input import RequestBody
from app.store.models import Session, Turn

Role = Literal["user", "assistant", "tool", "system"]


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

    @classmethod
    def of(cls, budget: Budget) -> "Usage":
        return cls(
            c0=budget.c0, c1=budget.c1, c2=budget.c2, total=budget.usage(), limit=budget.available
        )


class Watermark(BaseModel):
    ratio: float
    level: Level

    @classmethod
    def of(cls, budget: Budget, extra: int = 0) -> "Watermark":
        return cls(ratio=round(budget.ratio(extra), 4), level=budget.level(extra))


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

    @classmethod
    def of(cls, turn: Turn) -> "TurnOut":
        return cls(
            seq=turn.seq,
            role=turn.role,
            content=turn.content,
            name=turn.name,
            tool_calls=turn.tool_calls,
            tool_call_id=turn.tool_call_id,
            metadata=turn.metadata_,
            token_count=turn.token_count,
            created_at=turn.created_at,
            chunk_id=str(turn.chunk_id) if turn.chunk_id else None,
        )


class TurnPage(BaseModel):
    turns: list[TurnOut]
    next_cursor: str | None


def _all_optional(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s fields as optional update fields with the same bounds and descriptions."""
    return {
        name: (_with_bounds(field) | None, Field(None, description=field.description))
        for name, field in model.model_fields.items()
    }


def _with_bounds(field: FieldInfo) -> Any:
    """A field's type with its bounds (`Annotated` needs at least one of them)."""
    return Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


_BudgetUpdate: type[BaseModel] = create_model(
    "_BudgetUpdate", __base__=RequestBody, **_all_optional(BudgetConfig)
)


class SessionConfigUpdate(_BudgetUpdate):
    """Every field optional; `null` leaves a value unchanged. The budget fields are those of
    `BudgetConfig`, with its ranges; the result must still satisfy
    `reserve_tokens < context_limit` and `target_ratio < trigger_ratio <= emergency_ratio`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"context_limit": 16000, "reserve_tokens": 2000, "user_id": "u-42"}]
        },
    )
    user_id: str | None = Field(None, min_length=1, max_length=128)
    metadata: dict[str, Any] | None = None


class SessionCounts(BaseModel):
    turns: int
    chunks: int
    memories: int


class SessionOut(BudgetConfig):
    session_id: str
    user_id: str | None
    metadata: dict[str, Any]
    usage: Usage
    watermark: Watermark
    counts: SessionCounts
    last_offload_at: datetime | None
    created_at: datetime


class SessionSummary(BaseModel):
    """A session in a list: what the session's row holds, without counting its remembered items."""

    session_id: str
    user_id: str | None
    metadata: dict[str, Any]
    watermark: Watermark
    turns: int = Field(description="as `counts.turns` of `GET /v1/sessions/{session_id}`")
    chunks: int = Field(description="as `counts.chunks` of `GET /v1/sessions/{session_id}`")
    last_offload_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, session: Session, budget: Budget) -> "SessionSummary":
        """`session` in a list, its watermark that of `budget` (the session's own)."""
        return cls(
            session_id=session.external_id,
            user_id=session.user_id,
            metadata=session.metadata_,
            watermark=Watermark.of(budget),
            turns=session.turn_count,
            chunks=session.chunk_count,
            last_offload_at=session.last_offload_at,
            created_at=session.created_at,
            updated_at=session.updated_at,
        )


class SessionPage(BaseModel):
    sessions: list[SessionSummary]
    next_cursor: str | None
