"""A huge tool result, layered on arrival (`limits.layer_tool_result_tokens`).

Its whole text is chunked as the offload chunks a long turn (`app.offload.chunking`) and stored
in C3 in the append's own transaction; the window's turn holds its layered view
(`app.notes.layering`) and costs the view's tokens. The chunks are embedded later by the worker,
as any offloaded chunk; until then lexical and exact search find them.

The result is tokenised once (`content_ids`) and its cuts placed before the session is locked;
its pieces are drafted (their terms and rows) while the database stores the ones before them
(`store`).
"""

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.core.cpu import batches_off_loop
from app.domain.records import TurnRecord
from app.domain.tokens import encoding, message_tokens
from app.jobs.queue import TaskName, embedding_lock, enqueue
from app.notes.layering import LayeredSource, layered_view
from app.offload.chunking import ChunkDraft, TurnPieces, chunk_row, chunk_turns, chunking_config
from app.store import chunks as chunks_store
from app.store.models import Session

# Chunks per insert while the next are still being drafted (`batches_off_loop`).
WRITE_BATCH = 1000


@dataclass(frozen=True)
class LayeredResult:
    """A tool result's layered view and the chunks of its whole text, drafted when stored."""

    view: str
    token_count: int  # the view's, as a message
    drafts: Iterable[ChunkDraft]  # their turn still 0
    chunk_ids: list[uuid.UUID]  # one per draft, in order
    chars: int  # of the whole text


def content_ids(settings: Settings, content: str) -> list[int] | None:
    """The tokens of a tool result's `content` when it may be layered, else None. A token holds
    a byte at least, so a result of no more bytes than `limits.layer_tool_result_tokens` is
    not; the others are tokenised once, for their count and for their chunks' cuts (`layer`)."""
    if len(content.encode()) <= settings.limits.layer_tool_result_tokens:
        return None
    return encoding().encode(content, disallowed_special=())


def layer(settings: Settings, row: dict[str, Any], ids: list[int]) -> LayeredResult:
    """Layer the tool turn `row` (the turn columns of an append, its whole text as `content`,
    its `token_count` as sent; `ids`: its content's tokens, `content_ids`). CPU work: called off
    the event loop."""
    raw = TurnRecord(
        seq=0,  # the turn's seq is known once the session is locked (`store`)
        role=row["role"],
        content=row["content"],
        token_count=row["token_count"],
        created_at=datetime.now(UTC),
        name=row["name"],
        tool_call_id=row["tool_call_id"],
        metadata=row["metadata_"],
    )
    cfg = chunking_config(settings)
    # A tool turn's content is its chunk body (it calls no tool): `ids` are the body's tokens.
    drafts: TurnPieces | list[ChunkDraft] = (
        TurnPieces(raw, cfg, ids) if raw.token_count > cfg.max_tokens else chunk_turns([raw], cfg)
    )
    chunk_ids = [uuid.uuid4() for _ in range(len(drafts))]
    source = LayeredSource(
        text=raw.content,
        tokens=raw.token_count,
        chunk_id=str(chunk_ids[0]),
        chunks=len(chunk_ids),
    )
    view = layered_view(source, settings.limits.layered_view_tokens)
    tokens = message_tokens(raw.role, view, raw.name, None, raw.tool_call_id)
    return LayeredResult(view, tokens, drafts, chunk_ids, len(raw.content))


def _rows(layered: list[tuple[int, LayeredResult]]) -> Iterator[dict[str, object]]:
    for seq, result in layered:
        for draft, chunk_id in zip(result.drafts, result.chunk_ids, strict=True):
            yield {**chunk_row(draft, chunk_id), "turn_first": seq, "turn_last": seq}


async def store(
    db: AsyncSession, session: Session, layered: list[tuple[int, LayeredResult]]
) -> int:
    """Store the chunks of the layered results (by their turn's seq) and enqueue their
    embedding, in the caller's transaction. Returns how many chunks were written."""
    chunk_ids = [str(i) for _, result in layered for i in result.chunk_ids]
    if not chunk_ids:
        return 0
    chars = sum(result.chars for _, result in layered)
    async for batch in batches_off_loop(_rows(layered), WRITE_BATCH, chars=chars):
        await chunks_store.insert_chunks(db, session.tenant_id, session.id, batch)
    await enqueue(
        db,
        TaskName.EMBED_CHUNKS,
        {"chunk_ids": chunk_ids, "tenant_id": str(session.tenant_id)},
        lock=embedding_lock(session.id),
    )
    return len(chunk_ids)
