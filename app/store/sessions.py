"""SQL for sessions: lock and create, list, configure, delete, the sweep's watermark and
counter queries. The lock order every transaction follows is in `app.store`."""

import logging
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    String,
    cast,
    delete,
    exists,
    func,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import after_commit
from app.core.errors import NotFound
from app.domain.budget import REPLY_PRIMING_TOKENS, Budget, BudgetConfig
from app.domain.callers import Caller
from app.domain.ids import SESSION_ID_PATTERN
from app.store.jobs import JOBS
from app.store.models import Session, SessionKey, Turn

# The session-state helpers log as the sessions service they came from.
logger = logging.getLogger("contextd.sessions")

# A deleted session is renamed to this prefix and its primary key at once, then erased by a job:
# outside SESSION_ID_PATTERN, so no request can name it.
TOMBSTONE_PREFIX = "~erasing~"


def erasing(session: Session) -> bool:
    """Whether the session is tombstoned, its rows waiting for the erase job."""
    return session.external_id.startswith(TOMBSTONE_PREFIX)


def _not_erasing() -> ColumnElement[bool]:
    """Sessions not waiting for their erase job: their counters are left as they were when the
    session was tombstoned (its turns forgotten, its chunks tombstoned), so the sweep, which
    recounts and offloads, leaves them alone."""
    return ~Session.external_id.startswith(TOMBSTONE_PREFIX, autoescape=True)


async def get_session(
    db: AsyncSession, tenant_id: uuid.UUID, external_id: str, *, for_update: bool = False
) -> Session | None:
    query = select(Session).where(
        Session.tenant_id == tenant_id, Session.external_id == external_id
    )
    if for_update:
        # Refresh a copy this unit of work already loaded: values read before the lock may be
        # stale, and counters written from them would drift.
        query = query.with_for_update().execution_options(populate_existing=True)
    return (await db.execute(query)).scalar_one_or_none()


async def lock_or_create_session(
    db: AsyncSession, tenant_id: uuid.UUID, external_id: str
) -> Session:
    """The session row, locked for this transaction; created on first use.

    The row lock serialises writers of one session, which is what makes `seq` gap-free.
    """
    found = await get_session(db, tenant_id, external_id, for_update=True)
    if found is not None:
        return found
    await db.execute(
        insert(Session)
        .values(tenant_id=tenant_id, external_id=external_id)
        .on_conflict_do_nothing(index_elements=["tenant_id", "external_id"])
    )
    created = await get_session(db, tenant_id, external_id, for_update=True)
    assert created is not None
    return created


async def lock_sessions(
    db: AsyncSession, tenant_id: uuid.UUID, session_pks: Iterable[uuid.UUID]
) -> list[Session]:
    """Several session rows of one tenant locked in one statement, in primary-key order (the
    lock order); those deleted meanwhile are missing from the answer."""
    query = (
        select(Session)
        .where(Session.tenant_id == tenant_id, Session.id.in_(set(session_pks)))
        .order_by(Session.id)
        .with_for_update()
        .execution_options(populate_existing=True)  # see `get_session`
    )
    return list((await db.execute(query)).scalars().all())


async def lock_session_by_pk(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> Session | None:
    query = (
        select(Session)
        .where(Session.tenant_id == tenant_id, Session.id == session_pk)
        .with_for_update()
        .execution_options(populate_existing=True)  # see `get_session`
    )
    return (await db.execute(query)).scalar_one_or_none()


async def user_session_ids(
    db: AsyncSession, tenant_id: uuid.UUID, user_id: str, limit: int
) -> list[uuid.UUID]:
    """A user's sessions, most recently changed first."""
    rows = await db.execute(
        select(Session.id)
        .where(Session.tenant_id == tenant_id, Session.user_id == user_id)
        .order_by(Session.updated_at.desc())
        .limit(limit)
    )
    return list(rows.scalars())


async def update_session(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, **values: Any
) -> int:
    """Update the row and bump its version; returns the new version (for cache invalidation)."""
    result = await db.execute(
        update(Session)
        .where(Session.tenant_id == tenant_id, Session.id == session_pk)
        .values(version=Session.version + 1, **values)
        .returning(Session.version)
    )
    return int(result.scalar_one())


async def delete_session(db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID) -> None:
    await db.execute(
        delete(Session).where(Session.tenant_id == tenant_id, Session.id == session_pk)
    )


async def get_session_by_pk(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> Session | None:
    query = (
        select(Session)
        .where(Session.tenant_id == tenant_id, Session.id == session_pk)
        .execution_options(populate_existing=True)
    )
    return (await db.execute(query)).scalar_one_or_none()


async def tenants_of_sessions(
    db: AsyncSession, session_pks: Collection[uuid.UUID]
) -> dict[uuid.UUID, uuid.UUID]:
    """The tenant of each of the sessions (those that still exist), read by their ids alone:
    only for a job queued by a version before jobs carried the tenant (a rolling upgrade), which
    learns it here once. On a database distributed by tenant this asks every node."""
    if not session_pks:
        return {}
    query = select(Session.id, Session.tenant_id).where(Session.id.in_(list(session_pks)))
    return {pk: tenant for pk, tenant in (await db.execute(query)).all()}


def _configured(name: str, default: float, as_type: type[BigInteger] | type[Float[float]]) -> Any:
    """A budget field of the session's own configuration, else the deployment default."""
    return func.coalesce(Session.config[name].astext.cast(as_type()), default)


def usage_ratio_sql(defaults: BudgetConfig) -> ColumnElement[float]:
    """`app.domain.budget.Budget.ratio` of each session row, in SQL (a test pins the two
    together): (c0 + c1 + c2 + reply priming) / (C - r)."""
    c0 = func.coalesce(Session.c0_tokens, _configured("c0_tokens", defaults.c0_tokens, BigInteger))
    usage = c0 + Session.c1_tokens + Session.c2_tokens + REPLY_PRIMING_TOKENS
    available = _configured("context_limit", defaults.context_limit, BigInteger) - _configured(
        "reserve_tokens", defaults.reserve_tokens, BigInteger
    )
    return usage.cast(Float()) / func.greatest(available, 1)


def _over_trigger(defaults: BudgetConfig) -> ColumnElement[bool]:
    trigger: ColumnElement[float] = _configured("trigger_ratio", defaults.trigger_ratio, Float)
    return usage_ratio_sql(defaults) >= trigger


async def sessions_over_watermark(
    db: AsyncSession, defaults: BudgetConfig, written_since: datetime, limit: int = 500
) -> list[SessionKey]:
    """Sessions written to since `written_since`, at or over their trigger ratio, changed since
    their last offload, with no offload job pending: the safety net for a job that failed for
    good. The offload re-checks before moving anything. A session idle for longer is left to its
    next append or build, which check the watermark themselves: so the read goes through
    `ix_sessions_updated` and idle sessions cost nothing."""
    pending_offload = exists().where(
        JOBS.c.queueing_lock == func.concat("offload:", cast(Session.id, String)),
        cast(JOBS.c.status, String).in_(["todo", "doing"]),
    )
    query = (
        select(Session.tenant_id, Session.id)
        .where(
            Session.updated_at >= written_since,
            _not_erasing(),
            Session.c1_turns > 0,
            Session.last_offload_at.is_(None) | (Session.updated_at > Session.last_offload_at),
            _over_trigger(defaults),
            ~pending_offload,
        )
        .limit(limit)
    )
    return [SessionKey(*row) for row in (await db.execute(query)).all()]


def _listed(tenant_id: uuid.UUID, user_id: str | None = None) -> ColumnElement[bool]:
    """A tenant's sessions (a user's, with `user_id`), but for those being erased, whose ids no
    client can name."""
    listed = (Session.tenant_id == tenant_id) & Session.external_id.regexp_match(SESSION_ID_PATTERN)
    return listed if user_id is None else listed & (Session.user_id == user_id)


async def list_sessions(
    db: AsyncSession, tenant_id: uuid.UUID, *, limit: int, offset: int
) -> list[Session]:
    """A tenant's sessions, most recently changed first (the inspector's pages)."""
    query = (
        select(Session)
        .where(_listed(tenant_id))
        .order_by(Session.updated_at.desc(), Session.id)
        .limit(limit)
        .offset(offset)
    )
    return list((await db.execute(query)).scalars().all())


async def sessions_page(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    user_id: str | None,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Session]:
    """A tenant's sessions (a user's, with `user_id`), newest first, from the one after the
    (created_at, id) `after`: a keyset that no later change of a session moves."""
    query = select(Session).where(_listed(tenant_id, user_id))
    if after is not None:
        query = query.where(tuple_(Session.created_at, Session.id) < tuple_(*after))
    query = query.order_by(Session.created_at.desc(), Session.id.desc()).limit(limit)
    return list((await db.execute(query)).scalars().all())


async def count_sessions(db: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> int:
    """A user's sessions a client can name."""
    query = select(func.count()).where(_listed(tenant_id, user_id))
    return int((await db.execute(query)).scalar_one())


# --- counters ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """The counters a session row keeps so that no request re-reads its history."""

    c1_tokens: int
    c1_turns: int
    turn_count: int
    chunk_count: int


# `app.store.chunks.active_chunk_count`: chunks are counted where they are queried (of the
# session and tenant columns of an outer query).
ChunkCount = Callable[[Any, Any], Any]


def _counted(chunk_count: ChunkCount) -> tuple[Any, Any, Any, Any]:
    """Correlated subqueries recounting each counter of the outer `Session` row from the rows."""
    of_session = (Turn.session_id == Session.id) & (Turn.tenant_id == Session.tenant_id)
    window = of_session & Turn.chunk_id.is_(None) & Turn.forgotten_at.is_(None)
    return (
        select(func.coalesce(func.sum(Turn.token_count), 0)).where(window).scalar_subquery(),
        select(func.count()).where(window).scalar_subquery(),
        select(func.count()).where(of_session).scalar_subquery(),
        chunk_count(Session.id, Session.tenant_id),
    )


async def sessions_with_drift(
    db: AsyncSession,
    defaults: BudgetConfig,
    chunk_count: ChunkCount,
    *,
    changed_since: datetime,
    written_since: datetime,
    limit: int = 500,
) -> list[SessionKey]:
    """Sessions changed since `changed_since`, or written to since `written_since` and over
    their trigger, whose stored counters differ from a recount of their rows (read without
    locks: the caller re-checks under one). Bounded by `written_since` like
    `sessions_over_watermark`."""
    c1_tokens, c1_turns, turn_count, chunks = _counted(chunk_count)
    query = (
        select(Session.tenant_id, Session.id)
        .where(
            Session.updated_at >= written_since,
            _not_erasing(),
            (Session.updated_at >= changed_since) | _over_trigger(defaults),
            or_(
                Session.c1_tokens != c1_tokens,
                Session.c1_turns != c1_turns,
                Session.turn_count != turn_count,
                Session.chunk_count != chunks,
            ),
        )
        .order_by(Session.updated_at.desc())
        .limit(limit)
    )
    return [SessionKey(*row) for row in (await db.execute(query)).all()]


async def recount(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, chunk_count: ChunkCount
) -> Counters:
    """The counters of one session, recounted from its turn and chunk rows."""
    query = select(*_counted(chunk_count)).where(
        Session.tenant_id == tenant_id, Session.id == session_pk
    )
    row = (await db.execute(query)).one()
    return Counters(*(int(v) for v in row))


def effective_config(settings: Settings, session: Session) -> BudgetConfig:
    """The deployment's defaults overlaid with the values set on the session."""
    try:
        return settings.session_defaults.overlay(session.config)
    except ValidationError:
        # Valid when stored, but the deployment's defaults changed since: serve the defaults
        # rather than fail every request of the session; a PUT repairs it.
        logger.warning(
            "session configuration no longer valid; using the defaults",
            extra={"session": session.external_id},
        )
        return settings.session_defaults


def session_budget(settings: Settings, session: Session) -> Budget:
    """The session's budget from its stored counters. Until build-prompt has reported the
    system prompt's size, c0 is the configured assumption."""
    config = effective_config(settings, session)
    c0 = config.c0_tokens if session.c0_tokens is None else session.c0_tokens
    return Budget(config, c0=c0, c1=session.c1_tokens, c2=session.c2_tokens)


def session_cache_key(cache: Cache, tenant_id: uuid.UUID, session_id: str) -> str:
    return cache.key("session", tenant_id, session_id)


async def write_session(db: AsyncSession, cache: Cache, session: Session, **values: Any) -> int:
    """Update the session row (bumping its version) and, once committed, retire cached copies.

    Every change of a session goes through here, so the cached view is never older than the
    committed row (see `Cache.set_versioned`)."""
    version = await update_session(db, session.tenant_id, session.id, **values)
    key = session_cache_key(cache, session.tenant_id, session.external_id)

    async def _invalidate() -> None:
        await cache.invalidate_versioned(key, version)

    after_commit(db, _invalidate)
    return version


async def require_session(db: AsyncSession, caller: Caller, session_id: str) -> Session:
    session = await get_session(db, caller.tenant_id, session_id)
    if session is None:
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    return session
