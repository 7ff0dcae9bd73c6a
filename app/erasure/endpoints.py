"""HTTP endpoints of erasure: delete a session, read an erase receipt."""

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Path, Response, status

from app.auth.deps import ReadCaller, WriteCaller
from app.core.errors import InvalidInput, InvalidReceiptId, NotFound
from app.erasure import erase, lineage, service, untrust
from app.erasure.schemas import (
    EraseReceiptOut,
    SessionErased,
    SourceUntrusted,
    UntrustIn,
    UserErased,
)
from app.http.deps import CacheDep, DbDep, SettingsDep
from app.http.errors import COMMON_ERRORS, Rule, error_responses, with_rules
from app.http.input import BODY_RULES, PARAMETER_RULE, StorableText
from app.http.params import SessionIdPath
from app.store import receipts as receipts_store

router = APIRouter(tags=["erasure"], responses=error_responses(*COMMON_ERRORS))


@router.delete(
    "/v1/sessions/{session_id}",
    operation_id="delete_session",
    summary="Delete a session",
    description=(
        "Tombstones the session at once (from then on it is a 404 and its id can be reused) and "
        "erases its turns, chunks, embeddings, notes, memories and cached copies: in the request "
        "when the session is small (the receipt is then already complete), else in a background "
        "job. 202 with the erase receipt id; follow it at `GET /v1/erase-receipts/{id}`."
    ),
    status_code=status.HTTP_202_ACCEPTED,
)
async def delete_session(
    session_id: SessionIdPath,
    caller: WriteCaller,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
    response: Response,
) -> SessionErased:
    erase_now = partial(erase.erase_now, db, settings, cache)
    erased = await service.delete_session(db, caller, settings, cache, session_id, erase_now)
    response.headers["Location"] = f"/v1/erase-receipts/{erased.erase_receipt_id}"
    return erased


@router.delete(
    "/v1/users/{user_id}",
    operation_id="delete_user",
    summary="Delete a user's sessions and remembered items",
    **with_rules(
        "Everything of one `user_id` in the key's tenant: up to 100 of the user's sessions "
        "deleted as `DELETE /v1/sessions/{session_id}` deletes one (erased in the request for "
        "its first 2 seconds, the rest in the background), and every item remembered "
        "for the user that a session still holds (a session since given another user, or one "
        "of theirs left for the next call) forgotten. 202 with an erase receipt per session "
        "and holder; `remaining_sessions` above 0: call again. 404 when the user has neither. "
        "Each session is tombstoned in a transaction of its own: a call that fails midway has "
        "erased the sessions before the failure (their receipts complete) and leaves the rest "
        "to the next call.",
        PARAMETER_RULE,
    ),
    status_code=status.HTTP_202_ACCEPTED,
)
async def delete_user(
    user_id: Annotated[str, Path(min_length=1, max_length=128), StorableText],
    caller: WriteCaller,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> UserErased:
    erase_now = partial(erase.erase_now, db, settings, cache)
    return await service.delete_user(db, caller, settings, cache, user_id, erase_now)


@router.post(
    "/v1/sessions/{session_id}/sources/untrust",
    operation_id="untrust_source",
    summary="Mark a source untrusted",
    **with_rules(
        "Marks the results of one `tool` in the session, or a `turn_range`, as untrusted after "
        "the fact, and quarantines everything derived from them, in the request: the turns "
        "keep their text (in the window and the offloaded tail a tool loop shows, after a "
        "label saying what they are and that they are untrusted, `trusted: false` in the "
        "manifest; in their chunks, now labelled untrusted: recall shows them as untrusted "
        "data under the same label) but no notes line is derived from "
        "them again; a sighting of a user's item in them no longer counts as evidence (a "
        "promotion it earned is undone); the "
        "remembered items written from them (their `turn_seqs` or `source_tool`) become "
        "`quarantined` (out of prompts; an explicit recall shows them unconfirmed; `PATCH` "
        "with `status: verified` takes one back); their notes lines leave this session's notes "
        "and those of the user's other sessions; stored manifests built since the source "
        "arrived are deleted. The answer lists each derived thing (kind, id, count). Nothing is "
        "erased: to erase, forget the turns (the memory tool's `forget`).",
        Rule(InvalidInput, "exactly one of tool and turn_range; turn_range first <= last"),
        Rule(NotFound, "the session holds no live turn of that tool or range"),
        *BODY_RULES,
    ),
)
async def untrust_source(
    session_id: SessionIdPath,
    body: UntrustIn,
    caller: WriteCaller,
    db: DbDep,
    settings: SettingsDep,
    cache: CacheDep,
) -> SourceUntrusted:
    return await untrust.untrust_source(db, caller, settings, cache, session_id, body)


@router.get(
    "/v1/erase-receipts/{receipt_id}",
    responses=error_responses(*COMMON_ERRORS, InvalidReceiptId),
    operation_id="get_erase_receipt",
    summary="Read an erase receipt",
    description=(
        "What a forget or session delete erased: target, status (pending until the erase job "
        "completes), each store cleaned with its time, and the job attempts."
    ),
)
async def get_erase_receipt(
    receipt_id: Annotated[str, Path(max_length=64)],
    caller: ReadCaller,
    db: DbDep,
) -> EraseReceiptOut:
    pk = service.parse_id(receipt_id, "receipt_id", "erase receipt")
    receipt = await receipts_store.get_receipt(db, pk, caller.tenant_id)
    if receipt is None:
        raise NotFound(f"erase receipt {receipt_id!r} not found", field="receipt_id")
    return lineage.receipt_out(receipt)
