"""HTTP endpoints of sessions and turns: validate, call one service function, shape the response."""

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response, status

from app.auth.deps import ReadCaller, WriteCaller
from app.core.errors import (
    Conflict,
    DuplicateToolCallId,
    DuplicateToolResult,
    InvalidInput,
    MissingToolCallId,
    PayloadTooLarge,
    RequestTimeout,
    UnknownToolCall,
)
from app.http.deps import CacheDep, ContextDep, DbDep, ReadDbDep, SettingsDep
from app.http.errors import COMMON_ERRORS, Rule, error_responses, with_rules
from app.http.input import BODY_RULES, PARAMETER_RULE, StorableText
from app.http.pagination import BIGINT_KEY, CURSOR_VALUE_MAX, UUID_KEY, Page, page_params
from app.http.params import SessionIdPath
from app.sessions import service
from app.sessions.append import append_turns_and_offload
from app.sessions.schemas import (
    AppendTurnsRequest,
    AppendTurnsResponse,
    Role,
    SessionConfigUpdate,
    SessionOut,
    SessionPage,
    TurnPage,
)

router = APIRouter(
    prefix="/v1/sessions", tags=["sessions"], responses=error_responses(*COMMON_ERRORS)
)


@router.post(
    "/{session_id}/turns",
    operation_id="append_turns",
    summary="Append turns",
    **with_rules(
        "Append one or more OpenAI-style messages. The session is created on first use. "
        "Returns each turn's `seq` and token count, the session's usage and watermark. "
        "Turns that take the window to the emergency ratio are followed by an offload before "
        "the answer (the usage and watermark are still those the turns reached). "
        "A tool result above limits.layer_tool_result_tokens is layered: its whole text is "
        "stored as chunks at once, and its turn holds its head, tail and values (the token "
        "count is the layered view's). "
        "With `Idempotency-Key`, a replay returns the first response and writes nothing.",
        Rule(
            InvalidInput,
            "only tool turns carry a tool_call_id, only assistant turns "
            "carry tool_calls, and a turn without tool_calls needs content",
        ),
        Rule(MissingToolCallId, "a tool turn names the tool_call_id it answers"),
        Rule(
            UnknownToolCall,
            "a tool result answers a call that an assistant turn of "
            "this request or of the session issued",
        ),
        Rule(
            DuplicateToolResult,
            "one result per tool call: a result answers the latest call with its id that has "
            "no result yet (a later call may reuse an answered id)",
        ),
        Rule(DuplicateToolCallId, "the calls of one assistant turn have distinct ids"),
        *BODY_RULES,
        Rule(
            PayloadTooLarge,
            "content + tool calls + metadata of a turn within "
            "limits.max_turn_bytes (of a tool result: limits.max_tool_result_bytes), metadata "
            "within limits.max_metadata_bytes, at most "
            "limits.max_turns_per_request turns",
        ),
    ),
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(
        *COMMON_ERRORS,
        MissingToolCallId,
        UnknownToolCall,
        DuplicateToolResult,
        DuplicateToolCallId,
        PayloadTooLarge,
        Conflict,
        RequestTimeout,
    ),
)
async def append_turns(
    session_id: SessionIdPath,
    body: AppendTurnsRequest,
    caller: WriteCaller,
    db: DbDep,
    context: ContextDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> AppendTurnsResponse:
    outcome = await append_turns_and_offload(
        db,
        caller,
        context.settings,
        context.cache,
        context.metrics,
        session_id,
        body,
        idempotency_key,
    )
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return outcome.response


@router.get(
    "",
    operation_id="list_sessions",
    summary="List sessions",
    **with_rules(
        "The key's tenant's sessions, newest first, paginated by an opaque cursor (a session "
        "changed meanwhile keeps its place); with `user_id`, that user's only. Sessions being "
        "erased are not listed.",
        PARAMETER_RULE,
    ),
)
async def list_sessions(
    caller: ReadCaller,
    db: ReadDbDep,
    settings: SettingsDep,
    page: Annotated[Page, Depends(page_params(BIGINT_KEY, UUID_KEY))],
    user_id: Annotated[str | None, Query(min_length=1, max_length=128), StorableText] = None,
) -> SessionPage:
    return await service.list_sessions(db, caller, settings, page, user_id)


@router.get(
    "/{session_id}/turns",
    operation_id="list_turns",
    summary="List turns",
    description="Turns in `seq` order, paginated by an opaque cursor; forgotten turns are omitted.",
)
async def list_turns(
    session_id: SessionIdPath,
    caller: ReadCaller,
    db: ReadDbDep,
    page: Annotated[Page, Depends(page_params(BIGINT_KEY))],
    since_seq: Annotated[int | None, Query(ge=0, le=CURSOR_VALUE_MAX)] = None,
    role: Role | None = None,
) -> TurnPage:
    return await service.list_turns(db, caller, session_id, page, since_seq=since_seq, role=role)


@router.get(
    "/{session_id}",
    operation_id="get_session",
    summary="Get a session",
    description="Configuration, token usage per layer, watermark, counts and last offload time.",
)
async def get_session(
    session_id: SessionIdPath,
    caller: ReadCaller,
    db: ReadDbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> SessionOut:
    return await service.session_view(db, caller, settings, cache, session_id)


@router.put(
    "/{session_id}",
    operation_id="configure_session",
    summary="Configure a session",
    **with_rules(
        "Set per-session budget, floors and recall defaults; creates the session if new.",
        Rule(
            InvalidInput,
            "0 < target_ratio < trigger_ratio <= emergency_ratio <= 1 "
            "and reserve_tokens < context_limit, with unset fields taken from the session",
        ),
        *BODY_RULES,
        Rule(PayloadTooLarge, "metadata within limits.max_metadata_bytes as JSON"),
    ),
    responses=error_responses(*COMMON_ERRORS, PayloadTooLarge, RequestTimeout),
)
async def configure_session(
    session_id: SessionIdPath,
    body: SessionConfigUpdate,
    caller: WriteCaller,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> SessionOut:
    return await service.update_session(db, caller, settings, cache, session_id, body)
