"""Wire shapes of the remembered items, and what a request to remember one must carry."""

from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from app.store.models import Memory, Session


class RememberRequest(Protocol):
    """What `remember` reads of a request: the memory tool's call satisfies it."""

    @property
    def text(self) -> str | None: ...
    @property
    def tags(self) -> list[str] | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def scope(self) -> Literal["session", "user"] | None: ...


class MemoryOut(BaseModel):
    memory_id: str
    text: str
    tags: list[str]
    key: str | None
    scope: Literal["session", "user"]
    source: str
    trusted: bool
    status: str
    version: int
    supersedes: str | None
    session_id: str | None  # the session that wrote it (None once that session is deleted)
    embedded: bool = Field(description="false until the worker has embedded the item")
    created_at: datetime

    @classmethod
    def of(cls, memory: Memory, session: Session) -> "MemoryOut":
        """`memory` as listed for `session`: its session id only if `session` wrote it."""
        return cls(
            memory_id=str(memory.id),
            text=memory.text,
            tags=list(memory.tags),
            key=memory.key,
            scope=memory.scope,
            source=memory.source,
            trusted=memory.trusted,
            status=memory.status,
            version=memory.version,
            supersedes=str(memory.supersedes) if memory.supersedes else None,
            session_id=session.external_id if memory.session_id == session.id else None,
            embedded=memory.embedding_model is not None,
            created_at=memory.created_at,
        )


class MemoryList(BaseModel):
    memories: list[MemoryOut]
    next_cursor: str | None
