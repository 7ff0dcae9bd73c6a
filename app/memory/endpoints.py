"""HTTP endpoints of the memory tool, remembered items and erase receipts."""

from typing import Any, Literal

from fastapi import APIRouter

from app.auth.deps import ReadCaller, ToolCaller
from app.core.deps import ContextDep, DbDep
from app.core.errors import (
    COMMON_ERRORS,
    Conflict,
    ConflictingFields,
    RateLimited,
    TooLong,
    UnexpectedField,
    error_responses,
)
from app.core.pagination import PageDep
from app.memory import service
from app.memory.schemas import MemoryAnswer, MemoryList, MemoryRequest
from app.sessions.endpoints import SessionIdPath

router = APIRouter(tags=["memory tool"], responses=error_responses(*COMMON_ERRORS))


@router.post(
    "/v1/sessions/{session_id}/memory",
    operation_id="memory_tool",
    summary="Call the memory tool",
    description=(
        'One tool for agents, `{"type": ...}` with type help | recall | remember | status | '
        "offload | forget. Returns `{type, text, data}`: `text` is what the agent puts in its "
        "tool-result message. recall answers an explicit `No match` with empty `data.matches` "
        "when nothing relevant is stored. offload and forget need the scopes `memory:offload` / "
        "`memory:forget` (or the tenant setting); remember is rate-limited per session."
    ),
    responses=error_responses(
        *COMMON_ERRORS, TooLong, UnexpectedField, ConflictingFields, Conflict, RateLimited
    ),
)
async def memory_tool(
    session_id: SessionIdPath,
    body: MemoryRequest,
    caller: ToolCaller,
    db: DbDep,
    context: ContextDep,
) -> MemoryAnswer:
    return await service.call(db, context, caller, session_id, body)


@router.get(
    "/v1/memory/tool",
    operation_id="memory_tool_definition",
    summary="The memory tool's function definition",
    description=(
        "The `memory` tool ready to register with a function-calling model: description (Use / "
        "Do not use, answer format, what `No match` means), the `type` enum limited to the types "
        "this key may call, and the parameters."
    ),
)
async def memory_tool_definition(
    caller: ToolCaller,
    db: DbDep,
    context: ContextDep,
    format: Literal["openai", "anthropic"] = "openai",
) -> dict[str, Any]:
    return await service.tool(db, context, caller, format)


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
    db: DbDep,
    page: PageDep,
    include_superseded: bool = False,
) -> MemoryList:
    return await service.list_memories(
        db, caller, session_id, page, include_superseded=include_superseded
    )
