"""HTTP endpoints of the remembered items: the list, one item, writing one with its provenance,
changing it (compare-and-set), its versions and their redaction, now or as of a date."""

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, status
from pydantic import AwareDatetime

from app.auth.deps import ReadCaller, WriteCaller
from app.core.errors import Conflict
from app.http.deps import ContextDep, DbDep, ReadDbDep
from app.http.errors import COMMON_ERRORS, error_responses
from app.http.pagination import BIGINT_KEY, UUID_KEY, Page, page_params
from app.http.params import SessionIdPath
from app.memories import lifecycle, service
from app.memories.schemas import (
    MemoryIn,
    MemoryList,
    MemoryOut,
    MemoryPatch,
    MemoryVersionList,
    MemoryVersionOut,
    MemoryWritten,
)

# The same tag as the memory tool's routes: one group in the API reference.
router = APIRouter(tags=["memory tool"], responses=error_responses(*COMMON_ERRORS))

MemoryIdPath = Annotated[uuid.UUID, Path(description="the item's `memory_id`")]
AsOf = Annotated[
    AwareDatetime | None,
    Query(
        description="answer as of this moment (with its time zone): the items stated as "
        "facts then, each as it then was"
    ),
]


@router.get(
    "/v1/sessions/{session_id}/memories",
    operation_id="list_memories",
    summary="List remembered items",
    description=(
        "Items visible in the session (its own and its user's), oldest first: candidates, "
        "quarantined, verified and active ones, each saying whether it is `in_force` (stated as "
        "a fact in prompts now: verified or active, within its validity and TTL; an expired item "
        "stays listed as history). With `include_superseded=true` the replaced values of keyed "
        "items too (`supersedes` links each to the previous one). With `as_of`, the items that "
        "were in force at that moment, as they then were."
    ),
)
async def list_memories(
    session_id: SessionIdPath,
    caller: ReadCaller,
    db: ReadDbDep,
    page: Annotated[Page, Depends(page_params(BIGINT_KEY, UUID_KEY))],
    as_of: AsOf = None,
    include_superseded: bool = False,
) -> MemoryList:
    return await service.list_memories(
        db, caller, session_id, page, include_superseded=include_superseded, as_of=as_of
    )


@router.post(
    "/v1/sessions/{session_id}/memories",
    operation_id="create_memory",
    summary="Remember an item, with its provenance",
    description=(
        "Writes an item as the memory tool's `remember` does (deduplicated, rate-limited, a "
        "keyed value replaces the previous one), with where its text came from: from a trusted "
        "source (`remember`, `api`, `user_turn`) it is `active` at once; from any other "
        "(a tool result, an assistant turn, a notes rule, an inference, retrieved text) it is "
        "an untrusted `candidate`, never in prompts until verified "
        "(`PATCH` with `status: verified`), and shown only by an explicit recall, marked "
        "unconfirmed. `valid_from` / `valid_until` and `ttl_seconds` say when it holds."
    ),
    status_code=status.HTTP_201_CREATED,
)
async def create_memory(
    session_id: SessionIdPath,
    body: MemoryIn,
    caller: WriteCaller,
    db: DbDep,
    context: ContextDep,
) -> MemoryWritten:
    return await service.create_memory(db, context, caller, session_id, body)


@router.get(
    "/v1/sessions/{session_id}/memories/{memory_id}",
    operation_id="get_memory",
    summary="Read one remembered item",
    description="The item whatever its status (an erased one keeps its record, not its text); "
    "with `as_of`, as it was at that moment (404 if it did not exist yet).",
)
async def get_memory(
    session_id: SessionIdPath,
    memory_id: MemoryIdPath,
    caller: ReadCaller,
    db: ReadDbDep,
    as_of: AsOf = None,
) -> MemoryOut:
    return await service.get_memory(db, caller, session_id, memory_id, as_of)


@router.patch(
    "/v1/sessions/{session_id}/memories/{memory_id}",
    operation_id="update_memory",
    summary="Change a remembered item",
    description=(
        "Changes its text, its status (`verified`: a candidate or quarantined item becomes a "
        "fact; `quarantined`: a live item leaves prompts until verified) or when it holds, as "
        "one new revision recorded with who, when and why. With `expected_revision` the change "
        "applies only if the item is still at that revision: else 409 naming "
        "`expected_revision`, nothing changed."
    ),
    responses=error_responses(Conflict),
)
async def update_memory(
    session_id: SessionIdPath,
    memory_id: MemoryIdPath,
    body: MemoryPatch,
    caller: WriteCaller,
    db: DbDep,
    context: ContextDep,
) -> MemoryOut:
    return await lifecycle.update_memory(db, context, caller, session_id, memory_id, body)


@router.get(
    "/v1/sessions/{session_id}/memories/{memory_id}/versions",
    operation_id="list_memory_versions",
    summary="List a remembered item's versions",
    description="Every state the item has been in, oldest first: its status, text (null once "
    "redacted or erased), the text's sha256, trust, validity, who changed it (user, agent, "
    "api_key, rule, system), when and why. Versions are never rewritten but by a redaction "
    "or an erase.",
)
async def list_memory_versions(
    session_id: SessionIdPath, memory_id: MemoryIdPath, caller: ReadCaller, db: ReadDbDep
) -> MemoryVersionList:
    return await lifecycle.list_versions(db, caller, session_id, memory_id)


@router.post(
    "/v1/sessions/{session_id}/memories/{memory_id}/versions/{revision}/redact",
    operation_id="redact_memory_version",
    summary="Redact a past version of a remembered item",
    description="Drops that version's text and keeps its record (status, hash, who, when, why). "
    "409 for the item's current revision while the item holds that text: change the text or "
    "forget the item.",
    responses=error_responses(Conflict),
)
async def redact_memory_version(
    session_id: SessionIdPath,
    memory_id: MemoryIdPath,
    revision: Annotated[int, Path(ge=1, le=2**31 - 1)],
    caller: WriteCaller,
    db: DbDep,
) -> MemoryVersionOut:
    return await lifecycle.redact_version(db, caller, session_id, memory_id, revision)
