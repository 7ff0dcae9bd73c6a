"""The memory tool: one entry point, `call`, dispatching on the request type.

help, recall and status only read; remember, offload and forget write in the request's
transaction (the outer layer commits once), and enqueue their follow-up jobs in it.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.errors import InvalidInput, NotFound, TooLong
from app.core.ratelimit import WINDOW_SECONDS, rate_limited
from app.domain.callers import Caller
from app.domain.text import lexical_document
from app.http.pagination import Page, created_after, created_cursor, page_of
from app.jobs.queue import TaskName, enqueue, session_lock
from app.memories.policy import near_duplicate
from app.memories.schemas import MemoryList, MemoryOut, RememberRequest
from app.store import memories as memories_store
from app.store import sessions as sessions_store
from app.store.models import Memory, Session
from app.store.sessions import require_session

USER_SESSIONS_REFRESHED = 50  # notes of at most this many of a user's sessions refreshed per write


async def remember(
    db: AsyncSession, context: AppContext, session: Session, request: RememberRequest
) -> tuple[str, dict[str, Any]]:
    settings = context.settings
    text = " ".join((request.text or "").split())
    if not text:
        raise InvalidInput("text is empty", field="text")
    if len(text) > settings.memory.remember_max_chars:
        raise TooLong(
            f"text is {len(text)} characters; remember keeps at most "
            f"{settings.memory.remember_max_chars} (store one short point, not a transcript)",
            field="text",
        )
    scope = request.scope or "session"
    if scope == "user" and not session.user_id:
        raise InvalidInput(
            "scope 'user' needs the session's user_id (set it with PUT /v1/sessions/{id})",
            field="scope",
        )
    tags = sorted({t.strip()[:64] for t in request.tags or [] if t.strip()})
    await _check_rate(db, context, session)
    # The session row before its items (the lock order of `app.store`): an erase
    # of the session tombstones its items under that lock.
    session_id = session.external_id
    locked = await sessions_store.lock_session_by_pk(db, session.id)
    if locked is None or sessions_store.erasing(locked):
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    session = locked

    owner = (
        f"memory:{session.tenant_id}:user:{session.user_id}"
        if scope == "user"
        else (f"memory:session:{session.id}")
    )
    await memories_store.lock_owner(db, owner)
    existing = await memories_store.owner_memories(db, session, scope, request.key)
    same = near_duplicate(
        text, [(str(m.id), m.text) for m in existing], settings.memory.dedup_jaccard
    )
    if same is not None:
        found = next(m for m in existing if str(m.id) == same)
        data = {**_memory_data(found), "outcome": "duplicate"}
        return (
            f"Already remembered (id {found.id}): {found.text!r}. Nothing new was stored.",
            data,
        )
    previous: Memory | None = existing[-1] if request.key is not None and existing else None
    if previous is not None:
        await memories_store.set_memory_status(db, [m.id for m in existing], "superseded")
    memory = await memories_store.insert_memory(
        db,
        {
            "tenant_id": session.tenant_id,
            "session_id": session.id,
            "user_id": session.user_id,
            "scope": scope,
            "key": request.key,
            "text": text,
            "tags": tags,
            "source": "memory",
            # The service cannot tell whether the model copied this from a tool result; the
            # source "memory" marks it model-written wherever it appears.
            "trusted": True,
            "status": "active",
            "version": previous.version + 1 if previous else 1,
            "supersedes": previous.id if previous else None,
        },
        lexical_document(text),
    )
    await refresh_notes_of(db, session, user_scope=scope == "user")
    if settings.embedding.kind != "none":
        await enqueue(db, TaskName.EMBED_MEMORIES, {"memory_ids": [str(memory.id)]})
    data = {**_memory_data(memory), "outcome": "superseded" if previous else "stored"}
    if previous is not None:
        return (
            f"Remembered (id {memory.id}, key {request.key!r}, version {memory.version}); "
            f"it replaces the previous value {previous.text!r}.",
            data,
        )
    return f"Remembered (id {memory.id}, scope {scope}): {text!r}.", data


async def _check_rate(db: AsyncSession, context: AppContext, session: Session) -> None:
    limit = context.settings.memory.remember_per_minute
    count = await context.rate_limiter.hit_session(
        "remember", session.tenant_id, session.external_id
    )
    if context.cache.bypassed:  # Redis down: what every process wrote shows in Postgres
        since = datetime.now(UTC) - timedelta(seconds=WINDOW_SECONDS)
        count = max(count, await memories_store.memories_written_since(db, session.id, since) + 1)
    if count > limit:
        raise rate_limited("remember, per session,", limit, "type")


def _memory_data(memory: Memory) -> dict[str, Any]:
    return {
        "memory_id": str(memory.id),
        "text": memory.text,
        "key": memory.key,
        "scope": memory.scope,
        "tags": list(memory.tags),
        "version": memory.version,
        "supersedes": str(memory.supersedes) if memory.supersedes else None,
        "status": memory.status,
    }


async def refresh_notes_of(db: AsyncSession, session: Session, *, user_scope: bool) -> None:
    """Enqueue a notes refresh (the `remembered` section) for the session, and for the user's
    other sessions when a user-scope item changed."""
    targets = [session.id]
    if user_scope and session.user_id:
        others = await sessions_store.user_session_ids(
            db, session.tenant_id, session.user_id, USER_SESSIONS_REFRESHED
        )
        targets.extend(pk for pk in others if pk != session.id)
    for pk in targets:
        await enqueue(
            db,
            TaskName.REFRESH_NOTES,
            {"session_pk": str(pk)},
            lock=session_lock(pk),
            queueing_lock=f"notes:{pk}",
        )


async def list_memories(
    db: AsyncSession, caller: Caller, session_id: str, page: Page, *, include_superseded: bool
) -> MemoryList:
    session = await require_session(db, caller, session_id)
    rows = await memories_store.list_memories(
        db,
        session,
        include_superseded=include_superseded,
        after=created_after(page),
        limit=page.fetch,
    )
    shown, next_cursor = page_of(rows, page, lambda m: created_cursor(m.created_at, m.id))
    return MemoryList(memories=[MemoryOut.of(m, session) for m in shown], next_cursor=next_cursor)
