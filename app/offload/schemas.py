"""Wire shapes of the episodic store (chunks)."""

from datetime import datetime

from pydantic import BaseModel, Field


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
    trust: str = Field(description="'untrusted' when any covered turn is tool output")
    roles: list[str]
    ts_first: datetime
    ts_last: datetime
    overlap_chars: int | None = Field(
        description="characters (code points) at the start of a piece's text, after its header "
        "line, copied from the end of the previous piece; null on pieces stored before this "
        "was recorded"
    )


class ChunkDetail(ChunkOut):
    raw_text: str


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
