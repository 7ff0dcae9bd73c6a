"""HTTP endpoints of the episodic store: list chunks, read one with its raw text."""

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.auth.deps import CallerDep
from app.auth.schemas import Scope
from app.auth.service import require_scope
from app.core.deps import DbDep
from app.core.errors import COMMON_ERRORS, NotFound
from app.core.pagination import BIGINT_KEY, INT_KEY, cursor_pattern, decode_cursor, encode_cursor
from app.db.models import Chunk
from app.offload import repository
from app.offload.schemas import ChunkDetail, ChunkOut, ChunkPage
from app.sessions.endpoints import SessionIdPath
from app.sessions.service import require_session

router = APIRouter(prefix="/v1/sessions", tags=["episodic store"], responses=COMMON_ERRORS)


def chunk_out(chunk: Chunk) -> dict[str, object]:
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
    }


@router.get(
    "/{session_id}/chunks",
    operation_id="list_chunks",
    summary="List offloaded chunks",
    description="Chunks of offloaded turns in turn order (raw text via the single-chunk call).",
)
async def list_chunks(
    session_id: SessionIdPath,
    caller: CallerDep,
    db: DbDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[
        str | None,
        Query(
            pattern=cursor_pattern(BIGINT_KEY, INT_KEY), description="next_cursor of the last page"
        ),
    ] = None,
) -> ChunkPage:
    require_scope(caller, Scope.READ)
    session = await require_session(db, caller, session_id)
    after = decode_cursor(cursor, BIGINT_KEY, INT_KEY) if cursor else (0, 0)
    chunks = await repository.list_chunks(db, session.id, (after[0], after[1]), limit + 1)
    page = chunks[:limit]
    return ChunkPage(
        chunks=[ChunkOut.model_validate(chunk_out(c)) for c in page],
        next_cursor=encode_cursor(page[-1].turn_first, page[-1].part)
        if len(chunks) > limit
        else None,
    )


@router.get(
    "/{session_id}/chunks/{chunk_id}",
    operation_id="get_chunk",
    summary="Read one chunk",
    description="The chunk's metadata and its raw text, exactly as the turns were appended.",
)
async def get_chunk(
    session_id: SessionIdPath,
    chunk_id: Annotated[uuid.UUID, Path()],
    caller: CallerDep,
    db: DbDep,
) -> ChunkDetail:
    require_scope(caller, Scope.READ)
    session = await require_session(db, caller, session_id)
    chunk = await repository.get_chunk(db, session.id, chunk_id)
    if chunk is None:
        raise NotFound(f"chunk {chunk_id} not found", field="chunk_id")
    return ChunkDetail.model_validate({**chunk_out(chunk), "raw_text": chunk.raw_text})
