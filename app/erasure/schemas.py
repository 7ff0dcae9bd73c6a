"""Wire shapes of erasure: the answers to a session delete and a user delete, the erase receipt,
what a forget must name, and a source marked untrusted."""

from datetime import datetime
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from app.http.input import BIGINT_MAX, RequestBody


class ForgetTarget(Protocol):
    """What `forget` reads of a request: one of a chunk, a turn range or a remembered item (the
    memory tool's call satisfies it)."""

    @property
    def chunk_id(self) -> str | None: ...
    @property
    def turn_range(self) -> list[int] | None: ...
    @property
    def memory_id(self) -> str | None: ...


class DerivedItem(BaseModel):
    """One thing derived from a revoked source and removed with it."""

    kind: str = Field(
        description="chunk, memory, notes_line, embedding, prompt_build, cached_copy, "
        "other_session_notes (another session's notes rewritten), turn"
    )
    id: str | None = Field(None, description="its id, when it has one of its own")
    count: int = Field(description="how many (-1: all of them, as a deleted session's)")


class EraseReceiptOut(BaseModel):
    receipt_id: str
    session_id: str
    target: dict[str, Any]
    status: Literal["pending", "completed", "failed"]
    stores: dict[str, Any]
    derived: list[DerivedItem] = Field(
        description="each thing derived from the target and removed: at once by the request "
        "(chunks, remembered items written from the turns, notes lines), then by the erase "
        "(embeddings, stored manifests, cached copies)"
    )
    seconds_to_gone: float | None = Field(
        description="seconds from the request until the last copy was gone (null: pending)"
    )
    attempts: int
    requested_at: datetime
    completed_at: datetime | None


EraseStatus = Literal["pending", "completed"]
ERASE_STATUS = "`completed`: erased in the request; `pending`: its job erases it"


class SessionErased(BaseModel):
    session_id: str
    erase_receipt_id: str
    status: EraseStatus = Field(description=ERASE_STATUS)


class ErasedSession(BaseModel):
    session_id: str
    erase_receipt_id: str
    status: EraseStatus = Field(description=ERASE_STATUS)


class ErasedMemory(BaseModel):
    memory_id: str
    session_id: str = Field(description="the session that held it (its erase receipt's)")
    erase_receipt_id: str


class UserErased(BaseModel):
    user_id: str
    sessions: list[ErasedSession] = Field(description="deleted, as `DELETE /v1/sessions/{id}`")
    memories: list[ErasedMemory] = Field(
        description="items remembered for the user in sessions not deleted by this call, forgotten"
    )
    remaining_sessions: int = Field(
        description="the user's sessions this call left (it deletes at most 100): call again"
    )
    status: EraseStatus = Field(
        description="`completed` when every session was erased in the request and no item "
        "was forgotten elsewhere (a forget is its job's); else `pending`"
    )


class UntrustIn(RequestBody):
    """A source to mark untrusted: the results of one tool, or a turn range (exactly one)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"tool": "fetch_page"}, {"turn_range": [12, 15]}]},
    )
    tool: str | None = Field(
        None, min_length=1, max_length=128, description="every result of this tool in the session"
    )
    turn_range: list[Annotated[int, Field(ge=1, le=BIGINT_MAX)]] | None = Field(
        None, min_length=2, max_length=2, description="[first, last] turn seq, inclusive"
    )


class SourceUntrusted(BaseModel):
    session_id: str
    tool: str | None
    turn_seqs: list[int] = Field(description="the turns of the source, now quarantined")
    derived: list[DerivedItem] = Field(
        description="each thing derived from the source and taken out of the prompt: chunks "
        "labelled untrusted, remembered items quarantined, notes lines removed, stored manifests "
        "deleted, other sessions' notes rewritten"
    )
    seconds_to_gone: float = Field(
        description="seconds until nothing derived was served as trusted (all in the request)"
    )
    status: Literal["quarantined"] = "quarantined"
