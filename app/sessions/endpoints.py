"""HTTP endpoints of sessions and turns: validate, call one service function, shape the response."""

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response, status

from app.auth.deps import ReadCaller, WriteCaller
from app.core.deps import CacheDep, DbDep, SettingsDep
from app.core.errors import (
    COMMON_ERRORS,
    Conflict,
    MissingToolCallId,
    PayloadTooLarge,
    UnknownToolCall,
    error_responses,
)
from app.core.pagination import CURSOR_VALUE_MAX, PageDep
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

router = APIRouter(
    prefix="/v1/sessions", tags=["sessions"], responses=error_responses(*COMMON_ERRORS)
)

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
    description=(
        "Append one or more OpenAI-style messages. The session is created on first use. "
        "Returns each turn's `seq` and token count, the session's usage and watermark. "
        "With `Idempotency-Key`, a replay returns the first response and writes nothing."
    ),
    status_code=status.HTTP_201_CREATED,
    responses=error_responses(
        *COMMON_ERRORS, MissingToolCallId, UnknownToolCall, PayloadTooLarge, Conflict
    ),
)
async def append_turns(
    session_id: SessionIdPath,
    body: AppendTurnsRequest,
    caller: WriteCaller,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> AppendTurnsResponse:
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
    caller: ReadCaller,
    db: DbDep,
    page: PageDep,
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
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> SessionOut:
    return await service.session_view(db, caller, settings, cache, session_id)


@router.put(
    "/{session_id}",
    operation_id="configure_session",
    summary="Configure a session",
    description="Set per-session budget, floors and recall defaults; creates the session if new.",
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
