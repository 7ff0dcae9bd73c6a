"""Wire shapes of the episodic store (chunks)."""

from datetime import datetime
from typing import Self

from pydantic import BaseModel, Field

from app.store.models import Chunk


class ChunkOut(BaseModel):
    chunk_id: str
    turn_first: int
    turn_last: int
    part: int = Field(description="piece number when one long turn was split (1-based)")
    parts: int
    token_count: int
    summary_hint: str = Field(description="a label (entities or first clause), not a summary")
    embedded: bool = Field(description="false until the worker has embedded the chunk")
    status: str
    trust: str = Field(
        description="'untrusted' when any covered turn is tool output or from a source marked "
        "untrusted"
    )
    roles: list[str]
    ts_first: datetime
    ts_last: datetime
    overlap_chars: int | None = Field(
        description="characters (code points) at the start of a piece's text, after its header "
        "line, copied from the end of the previous piece; null on pieces stored before this "
        "was recorded"
    )

    @classmethod
    def of(cls, chunk: Chunk) -> Self:
        return cls.model_validate(_chunk_fields(chunk))


class ChunkDetail(ChunkOut):
    raw_text: str

    @classmethod
    def of(cls, chunk: Chunk) -> Self:
        """The chunk's metadata and its raw text."""
        return cls.model_validate({**_chunk_fields(chunk), "raw_text": chunk.raw_text})


def _chunk_fields(chunk: Chunk) -> dict[str, object]:
    return {
        "chunk_id": str(chunk.id),
        "turn_first": chunk.turn_first,
        "turn_last": chunk.turn_last,
        "part": chunk.part,
        "parts": chunk.parts,
        "token_count": chunk.token_count,
        "summary_hint": chunk.summary_hint,
        "embedded": chunk.embedding is not None,
        "status": chunk.status,
        "trust": "trusted" if chunk.trusted else "untrusted",
        "roles": list(chunk.roles),
        "ts_first": chunk.ts_first,
        "ts_last": chunk.ts_last,
        "overlap_chars": 0 if chunk.overlap_tokens == 0 else chunk.overlap_chars,
    }


class TurnText(BaseModel):
    seq: int
    text: str = Field(
        description="the turn's content exactly as appended (then its tool-calls line, if it "
        "called tools), joined from its pieces"
    )
    pieces: int


class ChunkPage(BaseModel):
    chunks: list[ChunkOut]
    next_cursor: str | None
