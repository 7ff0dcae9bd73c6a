"""HTTP endpoints of the episodic store: list chunks, read one with its raw text."""

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path

from app.auth.deps import ReadCaller
from app.core.errors import Conflict, InvalidChunkId, NotFound
from app.http.deps import ReadDbDep
from app.http.errors import COMMON_ERRORS, error_responses
from app.http.pagination import BIGINT_KEY, INT_KEY, Page, encode_cursor, page_of, page_params
from app.http.params import SessionIdPath
from app.offload.chunking import joined_pieces
from app.offload.schemas import ChunkDetail, ChunkOut, ChunkPage, TurnText
from app.store import chunks as chunks_store
from app.store.sessions import require_session

router = APIRouter(
    prefix="/v1/sessions", tags=["episodic store"], responses=error_responses(*COMMON_ERRORS)
)


@router.get(
    "/{session_id}/chunks",
    operation_id="list_chunks",
    summary="List offloaded chunks",
    description="Chunks of offloaded turns in turn order (raw text via the single-chunk call).",
)
async def list_chunks(
    session_id: SessionIdPath,
    caller: ReadCaller,
    db: ReadDbDep,
    page: Annotated[Page, Depends(page_params(BIGINT_KEY, INT_KEY))],
) -> ChunkPage:
    session = await require_session(db, caller, session_id)
    after = page.after() or (0, 0)
    chunks = await chunks_store.list_chunks(
        db, session.tenant_id, session.id, (after[0], after[1]), page.fetch
    )
    shown, next_cursor = page_of(chunks, page, lambda c: encode_cursor(c.turn_first, c.part))
    return ChunkPage(chunks=[ChunkOut.of(c) for c in shown], next_cursor=next_cursor)


@router.get(
    "/{session_id}/chunks/{chunk_id}",
    responses=error_responses(*COMMON_ERRORS, InvalidChunkId),
    operation_id="get_chunk",
    summary="Read one chunk",
    description="The chunk's metadata and its raw text, exactly as the turns were appended.",
)
async def get_chunk(
    session_id: SessionIdPath,
    chunk_id: Annotated[uuid.UUID, Path()],
    caller: ReadCaller,
    db: ReadDbDep,
) -> ChunkDetail:
    session = await require_session(db, caller, session_id)
    chunk = await chunks_store.get_chunk(db, session.tenant_id, session.id, chunk_id)
    if chunk is None:
        raise NotFound(f"chunk {chunk_id} not found", field="chunk_id")
    return ChunkDetail.of(chunk)


@router.get(
    "/{session_id}/turns/{seq}/text",
    responses=error_responses(*COMMON_ERRORS, Conflict),
    operation_id="get_turn_text",
    summary="Read a split turn whole",
    description="The whole text of a turn stored in pieces (a huge tool result layered on "
    "arrival, a long turn offloaded), joined from its chunks byte for byte as it was appended. "
    "404 when the turn was not split: its text is in `GET /v1/sessions/{session_id}/turns`.",
)
async def get_turn_text(
    session_id: SessionIdPath,
    seq: Annotated[int, Path(ge=1, le=2**63 - 1)],
    caller: ReadCaller,
    db: ReadDbDep,
) -> TurnText:
    session = await require_session(db, caller, session_id)
    pieces = await chunks_store.turn_pieces(db, session.tenant_id, session.id, seq)
    if not pieces:
        raise NotFound(f"turn {seq} is not stored in pieces", field="seq")
    overlaps = [0 if p.overlap_tokens == 0 else p.overlap_chars for p in pieces]
    if [p.part for p in pieces] != list(range(1, pieces[0].parts + 1)) or None in overlaps:
        raise Conflict(
            f"turn {seq} cannot be joined: pieces are missing, or were stored before their "
            "overlaps were recorded",
            field="seq",
        )
    text = joined_pieces([(p.raw_text, o or 0) for p, o in zip(pieces, overlaps, strict=True)])
    return TurnText(seq=seq, text=text, pieces=len(pieces))
