"""HTTP endpoints of the memory tool, remembered items and erase receipts."""

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path

from app.auth.deps import CallerDep
from app.auth.schemas import Scope
from app.auth.service import require_scope
from app.core.deps import ContextDep, DbDep
from app.core.errors import COMMON_ERRORS, Forbidden, NotFound, RateLimited, error_responses
from app.memory import repository, service
from app.memory.schemas import EraseReceiptOut, MemoryAnswer, MemoryList, MemoryRequest
from app.sessions.endpoints import SessionIdPath

router = APIRouter(tags=["memory tool"], responses=COMMON_ERRORS)


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
    responses=error_responses(Forbidden, RateLimited),
)
async def memory_tool(
    session_id: SessionIdPath,
    body: MemoryRequest,
    caller: CallerDep,
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
    caller: CallerDep,
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
    caller: CallerDep,
    db: DbDep,
    include_superseded: bool = False,
) -> MemoryList:
    require_scope(caller, Scope.READ)
    return await service.list_memories(
        db, caller, session_id, include_superseded=include_superseded
    )


@router.get(
    "/v1/erase-receipts/{receipt_id}",
    operation_id="get_erase_receipt",
    summary="Read an erase receipt",
    description=(
        "What a forget or session delete erased: target, status (pending until the erase job "
        "completes), each store cleaned with its time, and the job attempts."
    ),
)
async def get_erase_receipt(
    receipt_id: Annotated[str, Path(max_length=64)],
    caller: CallerDep,
    db: DbDep,
) -> EraseReceiptOut:
    require_scope(caller, Scope.READ)
    try:
        pk = uuid.UUID(receipt_id)
    except ValueError:
        raise NotFound(f"erase receipt {receipt_id!r} not found", field="receipt_id") from None
    receipt = await repository.get_receipt(db, pk, caller.tenant_id)
    if receipt is None:
        raise NotFound(f"erase receipt {receipt_id!r} not found", field="receipt_id")
    return service.receipt_out(receipt)
