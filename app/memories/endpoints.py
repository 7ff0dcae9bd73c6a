"""HTTP endpoint of the remembered items: the list of a session's."""

from typing import Annotated

from fastapi import APIRouter, Depends

from app.auth.deps import ReadCaller
from app.http.deps import ReadDbDep
from app.http.errors import COMMON_ERRORS, error_responses
from app.http.pagination import BIGINT_KEY, UUID_KEY, Page, page_params
from app.http.params import SessionIdPath
from app.memories import service
from app.memories.schemas import MemoryList

# The same tag as the memory tool's routes: one group in the API reference.
router = APIRouter(tags=["memory tool"], responses=error_responses(*COMMON_ERRORS))


@router.get(
    "/v1/sessions/{session_id}/memories",
    operation_id="list_memories",
    summary="List remembered items",
    description=(
        "Items visible in the session (its own and its user's), oldest first. With "
        "`include_superseded=true` the replaced versions of keyed items too (`supersedes` links "
        "each version to the previous one)."
    ),
)
async def list_memories(
    session_id: SessionIdPath,
    caller: ReadCaller,
    db: ReadDbDep,
    page: Annotated[Page, Depends(page_params(BIGINT_KEY, UUID_KEY))],
    include_superseded: bool = False,
) -> MemoryList:
    return await service.list_memories(
        db, caller, session_id, page, include_superseded=include_superseded
    )
