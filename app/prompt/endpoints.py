"""HTTP endpoints of the read path: build-prompt and stored build manifests."""

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path

from app.auth.deps import ReadCaller
from app.auth.schemas import Scope
from app.auth.service import require_scope
from app.core.deps import ContextDep, DbDep
from app.core.errors import (
    COMMON_ERRORS,
    BudgetExceeded,
    InvalidBuildId,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    Rule,
    error_responses,
    with_rules,
)
from app.core.input import BODY_RULES
from app.prompt import repository
from app.prompt.schemas import BuildPromptRequest, BuildPromptResponse
from app.prompt.service import build_prompt as build_prompt_service
from app.sessions.endpoints import SessionIdPath
from app.sessions.service import require_session

router = APIRouter(
    prefix="/v1/sessions", tags=["prompt"], responses=error_responses(*COMMON_ERRORS)
)


@router.post(
    "/{session_id}/build-prompt",
    operation_id="build_prompt",
    summary="Build a prompt that fits the window",
    **with_rules(
        "Returns messages ready to send: system prompt (C0) → notes (C2) → recalled history (C3, "
        "quoted as data with provenance) → recent turns verbatim (C1) → the query. The total never "
        "exceeds `context_limit - reserve_tokens`; a query that cannot fit alone is a 422 "
        "`budget_exceeded` with the figures. The manifest lists every candidate fragment, "
        "included or not, and why.",
        Rule(
            BudgetExceeded,
            "the system prompt, tools and query fit within context_limit - reserve_tokens",
        ),
        Rule(InvalidInput, "append needs a query; reserve_tokens < context_limit"),
        *BODY_RULES,
        Rule(PayloadTooLarge, "with append, the query is a turn within limits.max_turn_bytes"),
    ),
    responses=error_responses(*COMMON_ERRORS, BudgetExceeded, PayloadTooLarge, RequestTimeout),
)
async def build_prompt(
    session_id: SessionIdPath,
    body: BuildPromptRequest,
    caller: ReadCaller,
    db: DbDep,
    context: ContextDep,
) -> BuildPromptResponse:
    if body.append:
        require_scope(caller, Scope.WRITE)
    return await build_prompt_service(db, context, caller, session_id, body)


@router.get(
    "/{session_id}/builds/{build_id}",
    responses=error_responses(*COMMON_ERRORS, InvalidBuildId),
    operation_id="get_build",
    summary="Read a stored build manifest",
    description="Builds made with `persist_manifest: true` (or the persist setting), kept up to "
    "the retention limit per session.",
)
async def get_build(
    session_id: SessionIdPath,
    build_id: Annotated[uuid.UUID, Path()],
    caller: ReadCaller,
    db: DbDep,
) -> dict[str, Any]:
    session = await require_session(db, caller, session_id)
    build = await repository.get_build(db, session.id, build_id)
    if build is None:
        raise NotFound(f"build {build_id} not found", field="build_id")
    return {"build_id": str(build.id), "created_at": build.created_at.isoformat(), **build.record}
