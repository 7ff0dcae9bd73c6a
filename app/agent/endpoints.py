"""HTTP endpoints of the memory tool: a call, and its function definition."""

from typing import Any, Literal

from fastapi import APIRouter

from app.agent import service
from app.agent.schemas import MemoryAnswer, MemoryRequest
from app.auth.deps import ToolCaller
from app.core.errors import (
    Conflict,
    ConflictingFields,
    InvalidInput,
    MissingField,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    TooLong,
    UnexpectedField,
)
from app.http.deps import ContextDep, DbDep
from app.http.errors import COMMON_ERRORS, Rule, error_responses, with_rules
from app.http.input import BODY_RULES
from app.http.params import SessionIdPath

router = APIRouter(tags=["memory tool"], responses=error_responses(*COMMON_ERRORS))


@router.post(
    "/v1/sessions/{session_id}/memory",
    operation_id="memory_tool",
    summary="Call the memory tool",
    **with_rules(
        'One tool for agents, `{"type": ...}` with type help | recall | remember | status | '
        "verify | offload | forget. Returns `{type, text, data}`: `text` is what the agent puts "
        "in its tool-result message. recall answers an explicit `No match` with empty "
        "`data.matches` when nothing relevant is stored, and lists unconfirmed remembered items "
        "(candidates, quarantined) that match under `data.unconfirmed`; verify makes one a "
        "fact. offload and forget need the scopes `memory:offload` / "
        "`memory:forget` (or the tenant setting); remember is rate-limited per session.",
        Rule(
            MissingField,
            "each type's required parameters: recall query, remember "
            "text, verify memory_id, forget one of chunk_id | turn_range | memory_id",
        ),
        Rule(
            UnexpectedField,
            "a type takes only its own parameters (help, status: "
            "none; recall: query, top_k, as_of; remember: text, tags, key, scope; verify: "
            "memory_id; offload: until_tokens)",
        ),
        Rule(ConflictingFields, "forget takes exactly one of its targets"),
        Rule(TooLong, "remember text within memory.remember_max_chars"),
        Rule(
            InvalidInput,
            "turn_range is [first, last] with first <= last; scope "
            "'user' needs the session's user_id; remember text is not only whitespace; "
            "forget and verify ids are ids of this session; verify takes a candidate or "
            "quarantined item",
        ),
        *BODY_RULES,
    ),
    responses=error_responses(
        *COMMON_ERRORS,
        TooLong,
        UnexpectedField,
        ConflictingFields,
        Conflict,
        RateLimited,
        PayloadTooLarge,
        RequestTimeout,
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
