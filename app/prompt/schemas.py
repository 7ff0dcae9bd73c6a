"""Wire shapes of build-prompt (spec §9)."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.sessions.schemas import Usage as SessionUsage
from app.sessions.schemas import Watermark


class SystemMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system"] = "system"
    content: str


class RecallOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: recall only once history has been offloaded"
    )
    top_k: int | None = Field(None, ge=0, le=50, description="recalled items at most")
    candidates: int | None = Field(None, ge=1, le=500, description="R: wide-recall candidates")
    budget_tokens: int | None = Field(None, ge=0, description="B: tokens for recalled history")


class BuildPromptRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "system": "You are a travel agent.",
                    "query": "What was that order number again?",
                    "append": True,
                    "format": "openai",
                }
            ]
        },
    )
    system: str | list[SystemMessage] = Field("", description="C0: system prompt text or messages")
    tools: list[dict[str, Any]] | None = Field(None, description="tool schemas (counted into C0)")
    query: str | None = Field(None, description="x_t, the current input; sent verbatim last")
    append: bool = Field(False, description="store `query` as a user turn first")
    context_limit: int | None = Field(None, gt=0, description="override C for this build")
    reserve_tokens: int | None = Field(None, ge=0, description="override r for this build")
    recall: RecallOptions = RecallOptions()
    format: Literal["openai", "anthropic"] = "openai"
    persist_manifest: bool = Field(False, description="store the manifest (see builds endpoint)")


class PromptUsage(BaseModel):
    c0: int
    c1: int
    c2: int
    recall: int
    query: int
    total: int
    limit: int


class RecalledItemOut(BaseModel):
    chunk_id: str = Field(description="chunk id, or memory id for a remembered item")
    source: Literal["chunk", "memory"]
    turn_range: list[int] | None
    score: float
    tokens: int


class RecallReport(BaseModel):
    query_raw: str | None
    query_rewritten: str | None
    skipped_reason: str | None = Field(
        description="why recall did not run: mode_never, no_history, no_query, recall_unavailable"
    )
    items: list[RecalledItemOut]


class ManifestItem(BaseModel):
    id: str
    layer: Literal["c0", "c1", "c2", "c3", "query"]
    source: str
    tokens: int
    score: float | None
    included: bool
    reason: str | None


class BuildPromptResponse(BaseModel):
    build_id: str
    messages: list[dict[str, Any]]
    system: str | None = Field(None, description="anthropic format: the system string")
    usage: PromptUsage
    watermark: Watermark
    session_usage: SessionUsage = Field(description="the session's stored usage after this build")
    recall: RecallReport
    fallbacks: list[str]
    notes_version: int
    manifest: list[ManifestItem]
    timings_ms: dict[str, float]
