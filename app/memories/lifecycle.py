"""An item's lifecycle after it is written: a change (text, status, validity) as a new revision
under compare-and-set, the agent's `verify`, the list of versions and the redaction of one, and
the unconfirmed items an explicit recall shows. Writes happen in the request's transaction."""

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.errors import Conflict, InvalidInput, NotFound
from app.domain.callers import Caller
from app.domain.text import lexical_document
from app.jobs.queue import TaskName, enqueue
from app.memories.policy import expiry, refused_move, shares_terms
from app.memories.schemas import MemoryOut, MemoryPatch, MemoryVersionList, MemoryVersionOut
from app.memories.service import (
    check_validity,
    checked_text,
    judged_contradicted,
    locked_session,
    refresh_notes_of,
    supersede_replaced,
)
from app.store import memories as memories_store
from app.store.memories import Change, stated_at
from app.store.models import MEMORY_HELD, Memory, Session
from app.store.sessions import require_session

UNCONFIRMED_SHOWN = 3  # unconfirmed items an explicit recall adds at most


async def update_memory(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    memory_id: uuid.UUID,
    patch: MemoryPatch,
) -> MemoryOut:
    """`PATCH …/memories/{id}`: the change as the API key's."""
    session = await require_session(db, caller, session_id)
    change = Change(patch.actor, caller.key_id, patch.reason or _summary(patch))
    memory = await change_item(db, context, session, memory_id, patch, change)
    return MemoryOut.of(memory, session, stated_at(memory, datetime.now(UTC)))


async def verify(
    db: AsyncSession, context: AppContext, session: Session, memory_id: uuid.UUID, key_id: Any
) -> tuple[str, dict[str, Any]]:
    """The memory tool's `verify`: the agent confirms an unconfirmed item."""
    patch = MemoryPatch(status="verified")
    change = Change("agent", key_id, "confirmed by the agent")
    memory = await change_item(db, context, session, memory_id, patch, change)
    data = {
        "memory_id": str(memory.id),
        "status": memory.status,
        "revision": memory.revision,
        "text": memory.text,
    }
    return f"Verified (id {memory.id}): {memory.text!r} is now stated as a fact.", data


def _summary(patch: MemoryPatch) -> str:
    changed = sorted(patch.model_fields_set - {"expected_revision", "reason", "actor"})
    return "changed " + ", ".join(changed) if changed else "changed"


async def change_item(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    memory_id: uuid.UUID,
    patch: MemoryPatch,
    change: Change,
) -> Memory:
    """Apply `patch` to the item as one new revision: 409 when `expected_revision` is not the
    item's, or the item was replaced by a newer value; 422 for a move its status forbids."""
    before = await memories_store.find_memory(db, session, memory_id)
    judged = (
        await judged_contradicted(db, context, session, before.scope, patch.text or before.text)
        if before is not None and before.status in MEMORY_HELD
        else frozenset()
    )
    session = await locked_session(db, session)
    memory = await memories_store.find_memory(db, session, memory_id, lock=True)
    if memory is None or memory.status not in MEMORY_HELD:
        raise NotFound(f"memory {memory_id} not found", field="memory_id")
    if patch.expected_revision is not None and patch.expected_revision != memory.revision:
        raise Conflict(
            f"memory {memory_id} is at revision {memory.revision}, not "
            f"{patch.expected_revision}: read it again and retry",
            field="expected_revision",
        )
    if memory.status == "superseded":
        raise Conflict(
            f"memory {memory_id} was replaced by a newer value of its key", field="memory_id"
        )
    values = _new_values(context, memory, patch)
    if not values:
        raise InvalidInput("nothing to change", field=None)
    text = values.get("text")
    changed = await memories_store.change_memory(
        db,
        memory,
        values,
        change,
        expected_revision=memory.revision,
        lexical_source=lexical_document(text) if text is not None else None,
    )
    assert changed  # the row is locked: nobody moved it on
    # A change (a verification above all) states the item now: it outranks older values.
    await supersede_replaced(db, session, memory, change, said_at=datetime.now(UTC), judged=judged)
    await refresh_notes_of(db, session, user_scope=memory.scope == "user")
    if text is not None and context.settings.embedding.kind != "none":
        await enqueue(
            db,
            TaskName.EMBED_MEMORIES,
            {"memory_ids": [str(memory.id)], "tenant_id": str(memory.tenant_id)},
        )
    return memory


def _new_values(context: AppContext, memory: Memory, patch: MemoryPatch) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if patch.text is not None:
        text = checked_text(context.settings, patch.text)
        if text != memory.text:  # a new text needs a new vector
            values.update(text=text, embedding=None, embedding_model=None, embed_attempts=0)
    if patch.status is not None and patch.status != memory.status:
        refused = refused_move(memory.status, patch.status)
        if refused is not None:
            raise InvalidInput(refused, field="status")
        values["status"] = patch.status
        if patch.status == "verified":
            values["trusted"] = True  # verified: its source no longer decides its trust
    given = patch.model_fields_set
    for field in ("valid_from", "valid_until"):
        if field in given:
            values[field] = getattr(patch, field)
    check_validity(
        values.get("valid_from", memory.valid_from), values.get("valid_until", memory.valid_until)
    )
    if "ttl_seconds" in given:
        values["expires_at"] = expiry(datetime.now(UTC), patch.ttl_seconds)
    return values


async def list_versions(
    db: AsyncSession, caller: Caller, session_id: str, memory_id: uuid.UUID
) -> MemoryVersionList:
    session = await require_session(db, caller, session_id)
    memory = await _visible(db, session, memory_id)
    versions = await memories_store.memory_versions(db, memory)
    return MemoryVersionList(
        memory_id=str(memory.id), versions=[MemoryVersionOut.of(v) for v in versions]
    )


async def redact_version(
    db: AsyncSession, caller: Caller, session_id: str, memory_id: uuid.UUID, revision: int
) -> MemoryVersionOut:
    """Drop the text of a past version (the record stays). The current version holds the
    item's text: change the text or forget the item instead."""
    session = await locked_session(db, await require_session(db, caller, session_id))
    memory = await memories_store.find_memory(db, session, memory_id, lock=True)
    if memory is None:
        raise NotFound(f"memory {memory_id} not found", field="memory_id")
    if revision == memory.revision and memory.status not in ("tombstoned", "erased"):
        raise Conflict(
            f"revision {revision} is the item's current one: change its text "
            "(PATCH) or forget it to take its text away",
            field="revision",
        )
    redacted = await memories_store.redact_version(db, memory, revision)
    if redacted is None:
        raise NotFound(f"memory {memory_id} has no revision {revision}", field="revision")
    return MemoryVersionOut.of(redacted)


async def _visible(db: AsyncSession, session: Session, memory_id: uuid.UUID) -> Memory:
    memory = await memories_store.find_memory(db, session, memory_id)
    if memory is None:
        raise NotFound(f"memory {memory_id} not found", field="memory_id")
    return memory


async def unconfirmed_recall(
    db: AsyncSession, session: Session, query: str
) -> tuple[str, list[dict[str, Any]]]:
    """The candidates and quarantined items an explicit recall adds, marked unconfirmed: the
    text to append to its answer ('' when none matches) and their matches."""
    found = [
        m
        for m in await memories_store.unconfirmed_memories(db, session)
        if shares_terms(query, m.text)
    ][-UNCONFIRMED_SHOWN:]
    if not found:
        return "", []
    matches = [
        {
            "memory_id": str(m.id),
            "ts": m.created_at.isoformat(),
            "text": m.text,
            "status": m.status,
            "source": m.source,
            "trusted": m.trusted,
            "unconfirmed": True,
        }
        for m in found
    ]
    lines = [
        f"{len(found)} unconfirmed item(s), not verified: do not state them as facts; ask the "
        "user, or verify one (type verify, memory_id) once it is confirmed:"
    ]
    lines.extend(
        f"[unconfirmed {m.status} | from {m.source}"
        f"{' ' + m.source_tool if m.source_tool else ''} | {m.id}]\n{m.text}"
        for m in found
    )
    return "\n\n".join(lines), matches


async def recall_as_of(
    db: AsyncSession, session: Session, query: str, at: datetime
) -> tuple[str, dict[str, Any]]:
    """The memory tool's recall `as_of` a moment: the remembered items stated as facts then
    that match the query, each as it then was (what was believed at that moment)."""
    found = [
        (memory, then)
        for memory, then in await memories_store.memories_as_of(db, session, at)
        if stated_at(then, at) and then.text and shares_terms(query, then.text)
    ]
    data: dict[str, Any] = {
        "as_of": at.isoformat(),
        "matches": [
            {
                "memory_id": str(memory.id),
                "ts": then.created_at.isoformat(),
                "text": then.text,
                "status": then.status,
                "revision": then.revision,
                "trusted": then.trusted,
            }
            for memory, then in found
        ],
    }
    if not found:
        return (
            f"No match: nothing remembered about {query!r} was stated as a fact at "
            f"{at.isoformat()}. Do not guess what was believed then.",
            data,
        )
    lines = [f"{len(found)} remembered item(s) stated as facts at {at.isoformat()}:"]
    lines.extend(
        f"[stated {then.created_at:%Y-%m-%d %H:%M} UTC | revision {then.revision} | "
        f"{memory.id}]\n{then.text}"
        for memory, then in found
    )
    return "\n\n".join(lines), data
