"""Sessions and turns: append (watermark check, offload enqueue), list, configure, and the
repair of a session's counters from its rows."""

import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.errors import (
    InvalidInput,
)
from app.domain.budget import (
    BudgetConfig,
    config_error_field,
)
from app.domain.callers import Caller
from app.http.pagination import Page, created_after, created_cursor, encode_cursor, page_of
from app.sessions.schemas import (
    SessionConfigUpdate,
    SessionCounts,
    SessionOut,
    SessionPage,
    SessionSummary,
    TurnOut,
    TurnPage,
    Usage,
    Watermark,
)
from app.sessions.validation import check_metadata_size
from app.store import memories as memories_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session
from app.store.sessions import (
    require_session,
    session_budget,
    session_cache_key,
    write_session,
)

CONFIG_FIELDS = frozenset(BudgetConfig.model_fields)
logger = logging.getLogger("contextd.sessions")


async def list_turns(
    db: AsyncSession,
    caller: Caller,
    session_id: str,
    page: Page,
    *,
    since_seq: int | None,
    role: str | None,
) -> TurnPage:
    session = await require_session(db, caller, session_id)
    keys = page.after()
    after = keys[0] if keys is not None else (since_seq or 0)
    turns = await turns_store.list_turns(
        db, session.tenant_id, session.id, after_seq=after, limit=page.fetch, role=role
    )
    shown, next_cursor = page_of(turns, page, lambda t: encode_cursor(t.seq))
    return TurnPage(turns=[TurnOut.of(t) for t in shown], next_cursor=next_cursor)


async def list_sessions(
    db: AsyncSession, caller: Caller, settings: Settings, page: Page, user_id: str | None
) -> SessionPage:
    sessions = await sessions_store.sessions_page(
        db, caller.tenant_id, user_id=user_id, after=created_after(page), limit=page.fetch
    )
    shown, next_cursor = page_of(sessions, page, lambda s: created_cursor(s.created_at, s.id))
    return SessionPage(
        sessions=[SessionSummary.of(s, session_budget(settings, s)) for s in shown],
        next_cursor=next_cursor,
    )


async def session_view(
    db: AsyncSession, caller: Caller, settings: Settings, cache: Cache, session_id: str
) -> SessionOut:
    key = session_cache_key(cache, caller.tenant_id, session_id)
    cached = await cache.get_json(key)
    if cached is not None:
        view = SessionOut.model_validate(cached)
    else:
        session = await require_session(db, caller, session_id)
        view = _build_view(settings, session, memories=0)
        await cache.set_versioned(key, view.model_dump(mode="json"), session.version)
    # Remembered items of the user's other sessions change without touching this row: count live.
    memories = await memories_store.count_memories(
        db, caller.tenant_id, view.session_id, view.user_id
    )
    return view.model_copy(update={"counts": view.counts.model_copy(update={"memories": memories})})


def _build_view(settings: Settings, session: Session, memories: int) -> SessionOut:
    budget = session_budget(settings, session)
    return SessionOut(
        **budget.config.model_dump(),
        session_id=session.external_id,
        user_id=session.user_id,
        metadata=session.metadata_,
        usage=Usage.of(budget),
        watermark=Watermark.of(budget),
        counts=SessionCounts(
            turns=session.turn_count, chunks=session.chunk_count, memories=memories
        ),
        last_offload_at=session.last_offload_at,
        created_at=session.created_at,
    )


async def update_session(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    session_id: str,
    update: SessionConfigUpdate,
) -> SessionOut:
    session = await sessions_store.lock_or_create_session(db, caller.tenant_id, session_id)
    changes = update.model_dump(exclude_none=True)
    config = {**session.config, **{k: v for k, v in changes.items() if k in CONFIG_FIELDS}}
    try:
        settings.session_defaults.overlay(config)
    except ValidationError as exc:
        field, message = config_error_field(exc)
        if field is not None and field not in config:
            message += f" ({field} is the deployment default: set it in the same request)"
        raise InvalidInput(message, field=field) from exc
    session.config = config
    values: dict[str, Any] = {"config": config}
    if "user_id" in changes:
        values["user_id"] = session.user_id = changes["user_id"]
    if "metadata" in changes:
        check_metadata_size(changes["metadata"], "metadata", settings)
        values["metadata_"] = session.metadata_ = changes["metadata"]
    await write_session(db, cache, session, **values)
    await db.refresh(session)
    memories = await memories_store.count_memories(
        db, caller.tenant_id, session_id, session.user_id
    )
    return _build_view(settings, session, memories)
