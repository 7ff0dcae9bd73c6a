"""HTTP endpoints of the remembered items: the list, one item, writing one with its provenance,
changing it (compare-and-set), its versions and their redaction, now or as of a date."""

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, status

from app.auth.deps import ReadCaller, WriteCaller
from app.core.errors import Conflict, InvalidInput, RateLimited, TooLong
from app.http.deps import ContextDep, DbDep, ReadDbDep
from app.http.errors import COMMON_ERRORS, Rule, error_responses, with_rules
from app.http.input import BODY_RULES
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
    Moment,
)

# The same tag as the memory tool's routes: one group in the API reference.
router = APIRouter(tags=["memory tool"], responses=error_responses(*COMMON_ERRORS))

MemoryIdPath = Annotated[uuid.UUID, Path(description="the item's `memory_id`")]
AsOf = Annotated[
    Moment | None,
    Query(
        description="answer as of this moment (with its time zone): the items stated as "
        "facts then, each as it then was"
    ),
]
AS_OF_RULE = Rule(InvalidInput, "as_of is a moment of the years 1 to 9999 in UTC")
TEXT_RULES = (
    Rule(TooLong, "text within memory.remember_max_chars"),
    Rule(
        InvalidInput,
        "text is not only whitespace; valid_until later than valid_from; scope 'user' needs "
        "the session's user_id",
    ),
)


@router.get(
    "/v1/sessions/{session_id}/memories",
    operation_id="list_memories",
    summary="List remembered items",
    **with_rules(
        "Items visible in the session (its own and its user's), oldest first: candidates, "
        "quarantined, verified and active ones, each saying whether it is `in_force` (stated as "
        "a fact in prompts now: verified or active, within its validity and TTL; an expired item "
        "stays listed as history). With `include_superseded=true` the replaced values of keyed "
        "items too (`supersedes` links each to the previous one). With `as_of`, the items that "
        "were in force at that moment, as they then were.",
        AS_OF_RULE,
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
    **with_rules(
        "Writes an item as the memory tool's `remember` does (deduplicated, rate-limited, a "
        "keyed value replaces the previous one), with where its text came from: from a trusted "
        "source (`remember`, `api`, `user_turn`) it is `active` at once; from any other "
        "(a tool result, an assistant turn, a notes rule, an inference, retrieved text) it is "
        "an untrusted `candidate`, never in prompts until verified "
        "(`PATCH` with `status: verified`), and shown only by an explicit recall, marked "
        "unconfirmed. `valid_from` / `valid_until` and `ttl_seconds` say when it holds; "
        'without `valid_until`, an end the text states ("until Friday", "下周一之前") is '
        "taken.",
        *TEXT_RULES,
        *BODY_RULES,
    ),
    responses=error_responses(TooLong, RateLimited),
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
    **with_rules(
        "The item whatever its status (an erased one keeps its record, not its text); "
        "with `as_of`, as it was at that moment (404 if it did not exist yet).",
        AS_OF_RULE,
    ),
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
    **with_rules(
        "Changes its text, its status (`verified`: a candidate or quarantined item becomes a "
        "fact; `quarantined`: a live item leaves prompts until verified) or when it holds, as "
        "one new revision recorded with who, when and why. With `expected_revision` the change "
        "applies only if the item is still at that revision: else 409 naming "
        "`expected_revision`, nothing changed.",
        *TEXT_RULES,
        Rule(
            InvalidInput,
            "at least one change; status verified from candidate or quarantined, quarantined "
            "from candidate, verified or active",
        ),
        *BODY_RULES,
    ),
    responses=error_responses(Conflict, TooLong),
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
