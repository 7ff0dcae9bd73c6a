"""Wire shapes of erasure: the answers to a session delete and a user delete, the erase receipt,
and what a forget must name."""

from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field


class ForgetTarget(Protocol):
    """What `forget` reads of a request: one of a chunk, a turn range or a remembered item (the
    memory tool's call satisfies it)."""

    @property
    def chunk_id(self) -> str | None: ...
    @property
    def turn_range(self) -> list[int] | None: ...
    @property
    def memory_id(self) -> str | None: ...


class EraseReceiptOut(BaseModel):
    receipt_id: str
    session_id: str
    target: dict[str, Any]
    status: Literal["pending", "completed", "failed"]
    stores: dict[str, Any]
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
