"""HTTP endpoints of the scratchpad (C2)."""

from datetime import UTC, datetime

from fastapi import APIRouter, status
from pydantic import BaseModel, Field

from app.auth.deps import ReadCaller, WriteCaller
from app.http.deps import DbDep, ReadDbDep
from app.http.errors import COMMON_ERRORS, error_responses
from app.http.params import SessionIdPath
from app.jobs.queue import TaskName, enqueue, session_args, session_lock
from app.notes.schemas import DroppedNote, Notes
from app.notes.service import empty_notes, in_force_at, stored_notes
from app.store.scratchpads import get_scratchpad
from app.store.sessions import require_session

router = APIRouter(prefix="/v1/sessions", tags=["notes"], responses=error_responses(*COMMON_ERRORS))


class ScratchpadOut(BaseModel):
    version: int = Field(description="0 until the first notes are written")
    covers_until_seq: int = Field(description="offloaded turns up to this seq are reflected")
    notes: Notes
    token_count: int = Field(description="tokens of the notes block the returned lines make")
    generator: str
    stale: bool = Field(description="turns were offloaded since these notes were written")
    rebuild_pending: bool = Field(description="the last generation failed; a rebuild is due")
    dropped_items: int = Field(description="items left out to respect the notes token cap")
    dropped: list[DroppedNote] = Field(
        description="those items, in the order the cap gave them up (see docs/CONCEPTS.md, Notes, "
        "for the priority): section, source turn, source, tokens"
    )


class RebuildAccepted(BaseModel):
    enqueued: bool


@router.get(
    "/{session_id}/scratchpad",
    operation_id="get_scratchpad",
    summary="Read the notes",
    description="Structured notes (goal, done, open, constraints, decisions, facts, remembered), "
    "each item with the turn it came from. A remembered line whose validity ended (its "
    "`valid_until` or TTL) is left out at once, as the prompt leaves it out, and `token_count` "
    "counts the lines returned.",
)
async def read_scratchpad(
    session_id: SessionIdPath, caller: ReadCaller, db: ReadDbDep
) -> ScratchpadOut:
    session = await require_session(db, caller, session_id)
    pad = await get_scratchpad(db, session.tenant_id, session.id)
    # As the prompt shows them: a line whose validity ended is gone before the sweep, and
    # `token_count` counts the lines shown.
    shown = in_force_at(stored_notes(pad) if pad else empty_notes(), datetime.now(UTC))
    return ScratchpadOut(
        version=shown.version,
        covers_until_seq=shown.covers_until_seq,
        notes=shown.notes,
        token_count=shown.token_count,
        generator=pad.generator if pad else "rules",
        stale=session.offloaded_until_seq > shown.covers_until_seq,
        rebuild_pending=pad.rebuild_pending if pad else False,
        dropped_items=pad.dropped_items if pad else 0,
        dropped=shown.dropped,
    )


@router.post(
    "/{session_id}/scratchpad/rebuild",
    operation_id="rebuild_scratchpad",
    summary="Rebuild the notes from raw turns",
    description="Enqueue a regeneration from every offloaded raw turn (no summary of a summary).",
    status_code=status.HTTP_202_ACCEPTED,
)
async def rebuild_scratchpad(
    session_id: SessionIdPath, caller: WriteCaller, db: DbDep
) -> RebuildAccepted:
    session = await require_session(db, caller, session_id)
    enqueued = await enqueue(
        db,
        TaskName.REFRESH_NOTES,
        {**session_args(session.key), "rebuild": True},
        lock=session_lock(session.id),
    )
    return RebuildAccepted(enqueued=enqueued)
