"""Wire shapes of the memory tool: the call (`{"type": ...}` and its parameters) and its answer."""

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.domain.budget import MAX_WINDOW_TOKENS
from app.http.input import BIGINT_MAX, RequestBody
from app.memories.schemas import Moment


class MemoryType(StrEnum):
    HELP = "help"
    RECALL = "recall"
    REMEMBER = "remember"
    STATUS = "status"
    VERIFY = "verify"
    OFFLOAD = "offload"
    FORGET = "forget"


class MemoryRequest(RequestBody):
    """One call of the memory tool: `type` plus the parameters of that type (others absent/null)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"type": "help"},
                {"type": "recall", "query": "budget limit for the Lyon trip", "top_k": 3},
                {"type": "remember", "text": "User prefers window seats", "key": "seat"},
                {"type": "forget", "turn_range": [4, 6]},
            ]
        },
    )

    type: MemoryType
    query: str | None = Field(None, min_length=1, max_length=2_000)
    top_k: int | None = Field(
        None, ge=1, le=1000, description="at most this many (capped by the deployment's limit)"
    )
    as_of: Moment | None = Field(
        None, description="recall: the remembered items stated as facts at this moment instead"
    )
    budget_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_WINDOW_TOKENS,
        description="recall: tokens the quoted items may take (default: the session's recall "
        "budget B, as in build-prompt)",
    )
    text: str | None = Field(None, min_length=1)
    tags: list[str] | None = Field(None, max_length=16)
    key: str | None = Field(None, min_length=1, max_length=128)
    scope: Literal["session", "user"] | None = None
    until_tokens: int | None = Field(None, ge=0, le=BIGINT_MAX)
    chunk_id: str | None = Field(None, min_length=1, max_length=64)
    turn_range: list[Annotated[int, Field(ge=1, le=BIGINT_MAX)]] | None = Field(
        None, min_length=2, max_length=2, description="[first, last] turn seq, inclusive"
    )
    memory_id: str | None = Field(None, min_length=1, max_length=64)


class MemoryAnswer(BaseModel):
    """`text` is what the agent puts in its tool-result message; `data` is the same, structured."""

    type: MemoryType
    text: str
    data: dict[str, Any]
