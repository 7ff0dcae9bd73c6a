"""HTTP endpoints of sessions and turns: validate, call one service function, shape the response."""

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response, status

from app.auth.deps import CallerDep
from app.auth.schemas import Scope
from app.auth.service import require_scope
from app.core.deps import CacheDep, DbDep, SettingsDep
from app.core.errors import (
    COMMON_ERRORS,
    Conflict,
    PayloadTooLarge,
    RequestTimeout,
    Rule,
    error_responses,
    with_rules,
)
from app.core.input import BIGINT_MAX, BODY_RULES
from app.core.pagination import BIGINT_KEY, cursor_pattern
from app.memory.schemas import SessionErased
from app.sessions import service
from app.sessions.schemas import (
    SESSION_ID_PATTERN,
    AppendTurnsRequest,
    AppendTurnsResponse,
    Role,
    SessionConfigUpdate,
    SessionOut,
    TurnPage,
)

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=COMMON_ERRORS)

SessionIdPath = Annotated[
    str,
    Path(
        pattern=SESSION_ID_PATTERN,
        description="client-chosen id: letters, digits and . _ : - (1-128 chars)",
        examples=["agent-42:run-7"],
    ),
]


@router.post(
    "/{session_id}/turns",
    operation_id="append_turns",
    summary="Append turns",
    **with_rules(
        "Append one or more OpenAI-style messages. The session is created on first use. "
        "Returns each turn's `seq` and token count, the session's usage and watermark. "
        "With `Idempotency-Key`, a replay returns the first response and writes nothing.",
        Rule(
            422,
            "invalid_input",
            "only tool turns carry a tool_call_id, only assistant turns "
            "carry tool_calls, and a turn without tool_calls needs content",
        ),
        Rule(422, "missing_tool_call_id", "a tool turn names the tool_call_id it answers"),
        Rule(
            422,
            "unknown_tool_call",
            "a tool result answers a call that an assistant turn of "
            "this request or of the session issued",
        ),
        Rule(422, "duplicate_tool_result", "one result per tool call"),
        *BODY_RULES,
        Rule(
            413,
            "payload_too_large",
            "content + tool calls + metadata of a turn within "
            "limits.max_turn_bytes, metadata within limits.max_metadata_bytes, at most "
            "limits.max_turns_per_request turns, a body within limits.max_body_bytes",
        ),
    ),
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(PayloadTooLarge, Conflict, RequestTimeout),
)
async def append_turns(
    session_id: SessionIdPath,
    body: AppendTurnsRequest,
    caller: CallerDep,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> AppendTurnsResponse:
    require_scope(caller, Scope.WRITE)
    outcome = await service.append_turns(
        db, caller, settings, cache, session_id, body, idempotency_key
    )
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return outcome.response


@router.get(
    "/{session_id}/turns",
    operation_id="list_turns",
    summary="List turns",
    description="Turns in `seq` order, paginated by an opaque cursor; forgotten turns are omitted.",
)
async def list_turns(
    session_id: SessionIdPath,
    caller: CallerDep,
    db: DbDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[
        str | None,
        Query(pattern=cursor_pattern(BIGINT_KEY), description="next_cursor of the last page"),
    ] = None,
    since_seq: Annotated[int | None, Query(ge=0, le=BIGINT_MAX)] = None,
    role: Role | None = None,
) -> TurnPage:
    require_scope(caller, Scope.READ)
    return await service.list_turns(
        db,
        caller,
        session_id,
        limit=min(limit, settings.limits.max_page_size),
        cursor=cursor,
        since_seq=since_seq,
        role=role,
    )


@router.get(
    "/{session_id}",
    operation_id="get_session",
    summary="Get a session",
    description="Configuration, token usage per layer, watermark, counts and last offload time.",
)
async def get_session(
    session_id: SessionIdPath,
    caller: CallerDep,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> SessionOut:
    require_scope(caller, Scope.READ)
    return await service.session_view(db, caller, settings, cache, session_id)


@router.put(
    "/{session_id}",
    operation_id="configure_session",
    summary="Configure a session",
    **with_rules(
        "Set per-session budget, floors and recall defaults; creates the session if new.",
        Rule(
            422,
            "invalid_input",
            "0 < target_ratio < trigger_ratio <= emergency_ratio <= 1 "
            "and reserve_tokens < context_limit, with unset fields taken from the session",
        ),
        *BODY_RULES,
        Rule(413, "payload_too_large", "metadata within limits.max_metadata_bytes as JSON"),
    ),
    responses=error_responses(PayloadTooLarge, RequestTimeout),
)
async def configure_session(
    session_id: SessionIdPath,
    body: SessionConfigUpdate,
    caller: CallerDep,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> SessionOut:
    require_scope(caller, Scope.WRITE)
    return await service.update_session(db, caller, settings, cache, session_id, body)


@router.delete(
    "/{session_id}",
    operation_id="delete_session",
    summary="Delete a session",
    description=(
        "Tombstones the session at once (from then on it is a 404 and its id can be reused) and "
        "enqueues the job that erases its turns, chunks, embeddings, notes, memories and cached "
        "copies. 202 with the erase receipt id; follow it at `GET /v1/erase-receipts/{id}`."
    ),
    status_code=status.HTTP_202_ACCEPTED,
)
async def delete_session(
    session_id: SessionIdPath, caller: CallerDep, db: DbDep, cache: CacheDep, response: Response
) -> SessionErased:
    require_scope(caller, Scope.WRITE)
    receipt_id = await service.delete_session(db, caller, cache, session_id)
    response.headers["Location"] = f"/v1/erase-receipts/{receipt_id}"
    return SessionErased(session_id=session_id, erase_receipt_id=receipt_id)
