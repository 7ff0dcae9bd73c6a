"""HTTP endpoints of the read path: build-prompt and stored build manifests."""

import asyncio
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from app.auth.deps import ReadCaller, identify_caller
from app.auth.service import check_rate, require_scope
from app.core.errors import (
    BudgetExceeded,
    InvalidBuildId,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
)
from app.core.observability import logged_by_route
from app.domain.callers import Scope
from app.domain.ids import is_session_id
from app.http.deps import ContextDep, DbDep, ReadDbDep, get_context, request_db
from app.http.direct import DirectRoute
from app.http.errors import COMMON_ERRORS, Rule, error_responses, with_rules
from app.http.input import BODY_RULES
from app.http.params import SessionIdPath
from app.prompt.schemas import BuildPromptRequest, BuildPromptResponse
from app.prompt.service import build_prompt as build_prompt_service
from app.prompt.snapshot import Prefetched, read_snapshot
from app.store import builds as builds_store
from app.store.sessions import require_session

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


def _is_json(content_type: str | None) -> bool:
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


async def build_prompt_direct(request: Request, raw: bytes) -> Response | None:
    """`build_prompt` as FastAPI would run it, its dependencies resolved here (database session,
    caller with its rate limit, scope) and the response encoded once (`app.http.direct`). A
    body or session id that does not validate goes to the full stack (None), which names the
    field exactly as before."""
    session_id: str = request.path_params["session_id"]
    if not _is_json(request.headers.get("content-type")) or not is_session_id(session_id):
        return None
    try:
        body = BuildPromptRequest.model_validate_json(raw)
    except ValidationError:
        return None
    context = await get_context(request)
    async with request_db(context) as db:
        caller = await identify_caller(request, db, context)
        # The request is counted against the caller's rate limit while the session is read: the
        # Redis and PostgreSQL round trips overlap. Over the limit it is still refused (429)
        # before anything is built or written; the read is dropped.
        counted = asyncio.ensure_future(
            check_rate(context.rate_limiter, caller, context.settings.limits)
        )
        try:
            prefetched = (
                Prefetched(await read_snapshot(context, caller, session_id))
                if not body.append and caller.has(Scope.READ)
                else None
            )
        finally:
            await counted
        require_scope(caller, Scope.READ)
        if prefetched is None:
            response = await build_prompt(session_id, body, caller, db, context)
        else:
            response = await build_prompt_service(db, context, caller, session_id, body, prefetched)
    logged_by_route(request.scope)  # the build line stands for the access line
    return Response(response.model_dump_json(), media_type="application/json")


DIRECT_ROUTES = [
    DirectRoute(route, build_prompt_direct)
    for route in router.routes
    if isinstance(route, APIRoute) and route.endpoint is build_prompt
]


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
    db: ReadDbDep,
) -> dict[str, Any]:
    session = await require_session(db, caller, session_id)
    build = await builds_store.get_build(db, session.tenant_id, session.id, build_id)
    if build is None:
        raise NotFound(f"build {build_id} not found", field="build_id")
    return {"build_id": str(build.id), "created_at": build.created_at.isoformat(), **build.record}
