"""SQL for remembered items (the `memories` table): every query of it lives here, but those of
the embedding backlog (`app.store.embedding_backlog`)."""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.embeddings.base import vector_literal
from app.store.models import Memory, Session


async def lock_owner(db: AsyncSession, owner: str) -> None:
    """Serialise writers of one memory owner (a session, or a tenant's user) until commit."""
    await db.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:o, 0))"), {"o": owner})


# --- remembered items ----------------------------------------------------------------------------


def _visible(session: Session) -> Any:
    own = Memory.session_id == session.id
    if session.user_id:
        return own | ((Memory.scope == "user") & (Memory.user_id == session.user_id))
    return own


async def visible_memories(db: AsyncSession, session: Session) -> list[Memory]:
    """Active remembered items of the session, and of its user when the session has one."""
    return await list_memories(db, session, include_superseded=False)


async def list_memories(
    db: AsyncSession,
    session: Session,
    *,
    include_superseded: bool,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int | None = None,
) -> list[Memory]:
    """Visible items, oldest first (`created_at`, then id); a page of them with `after`/`limit`."""
    statuses = ["active", "superseded"] if include_superseded else ["active"]
    query = (
        select(Memory)
        .where(
            Memory.tenant_id == session.tenant_id, _visible(session), Memory.status.in_(statuses)
        )
        .order_by(Memory.created_at, Memory.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(Memory.created_at, Memory.id) > after)
    return list((await db.execute(query)).scalars())


async def owner_memories(
    db: AsyncSession, session: Session, scope: str, key: str | None
) -> list[Memory]:
    """Active items of one owner (the session, or the session's user) — with `key`, of that key."""
    owner = (
        (Memory.scope == "user") & (Memory.user_id == session.user_id)
        if scope == "user"
        else (Memory.scope == "session") & (Memory.session_id == session.id)
    )
    query = select(Memory).where(
        Memory.tenant_id == session.tenant_id, owner, Memory.status == "active"
    )
    if key is not None:
        query = query.where(Memory.key == key)
    return list((await db.execute(query.order_by(Memory.created_at))).scalars())


async def visible_memory(db: AsyncSession, session: Session, memory_id: uuid.UUID) -> Memory | None:
    query = select(Memory).where(
        Memory.id == memory_id,
        Memory.tenant_id == session.tenant_id,
        _visible(session),
        Memory.status.in_(["active", "superseded"]),
    )
    return (await db.execute(query)).scalar_one_or_none()


async def visible_memory_ids(db: AsyncSession, session: Session) -> list[uuid.UUID]:
    query = select(Memory.id).where(
        Memory.tenant_id == session.tenant_id,
        _visible(session),
        Memory.status.in_(["active", "superseded"]),
    )
    return list((await db.execute(query)).scalars().all())


async def insert_memory(db: AsyncSession, values: dict[str, Any], lexical_source: str) -> Memory:
    memory = Memory(**values, lexical=func.to_tsvector("simple", lexical_source))
    db.add(memory)
    await db.flush()
    await db.refresh(memory)
    return memory


async def active_visible_memories(
    db: AsyncSession, session: Session, *, user_scope_only: bool = False
) -> list[Memory]:
    """Active items the session sees (its own and its user's), oldest first; with
    `user_scope_only`, only its user's user-scope items."""
    visible = (
        (Memory.scope == "user") & (Memory.user_id == session.user_id)
        if user_scope_only
        else _visible(session)
    )
    query = (
        select(Memory)
        .where(Memory.tenant_id == session.tenant_id, Memory.status == "active", visible)
        .order_by(Memory.created_at)
    )
    return list((await db.execute(query)).scalars().all())


async def nearest_memories(
    db: AsyncSession,
    memory_ids: Sequence[uuid.UUID],
    model: str,
    dim: int,
    vector: Sequence[float],
    limit: int,
) -> dict[str, float]:
    """Cosine similarity of the closest of `memory_ids` embedded with `model`, best first (an
    exact scan: a session sees tens to hundreds of items)."""
    if not memory_ids:
        return {}
    rows = await db.execute(
        text(
            f"""
            SELECT id, embedding::vector({int(dim)}) <=> CAST(:vector AS vector({int(dim)}))
                AS distance
            FROM memories
            WHERE id = ANY(:ids) AND status = 'active' AND embedding_model = :model
            ORDER BY distance LIMIT :limit
            """
        ),
        {"ids": list(memory_ids), "model": model, "vector": vector_literal(vector), "limit": limit},
    )
    return {str(mid): 1.0 - float(dist) for mid, dist in rows}


async def set_memory_status(db: AsyncSession, memory_ids: Sequence[uuid.UUID], status: str) -> None:
    if memory_ids:
        await db.execute(update(Memory).where(Memory.id.in_(memory_ids)).values(status=status))


async def memories_written_since(db: AsyncSession, session_pk: uuid.UUID, since: datetime) -> int:
    """Rate-limit fallback when Redis is down: items this session wrote in the window."""
    query = select(func.count()).where(
        Memory.session_id == session_pk, Memory.created_at >= since, Memory.source == "memory"
    )
    return int((await db.execute(query)).scalar_one())


# --- erase ---------------------------------------------------------------------------------------


async def tombstoned_texts(db: AsyncSession, memory_ids: Sequence[uuid.UUID]) -> list[str]:
    """The texts of those of `memory_ids` waiting for their erase."""
    if not memory_ids:
        return []
    rows = await db.execute(
        select(Memory.text).where(Memory.id.in_(memory_ids), Memory.status == "tombstoned")
    )
    return [t for t in rows.scalars() if t]


async def erase_memories(
    db: AsyncSession, memory_ids: Sequence[uuid.UUID]
) -> tuple[int, list[str]]:
    if not memory_ids:
        return 0, []
    texts = await tombstoned_texts(db, memory_ids)
    result = await db.execute(
        update(Memory)
        .where(Memory.id.in_(memory_ids), Memory.status == "tombstoned")
        .values(
            text="",
            tags=[],
            key=None,
            lexical=func.to_tsvector("simple", ""),
            embedding=None,
            embedding_model=None,
            status="erased",
        )
    )
    return int(result.rowcount or 0), texts  # type: ignore[attr-defined]


async def session_memory_texts(db: AsyncSession, session_pk: uuid.UUID) -> tuple[int, list[str]]:
    """(items, their texts) the session holds, whatever their status."""
    query = select(Memory.text).where(Memory.session_id == session_pk)
    texts = list((await db.execute(query)).scalars())
    return len(texts), [t for t in texts if t]


async def user_memories_by_session(
    db: AsyncSession, tenant_id: uuid.UUID, user_id: str
) -> dict[uuid.UUID, list[uuid.UUID]]:
    """Items written for the user (either scope) and not yet tombstoned, by holding session."""
    rows = await db.execute(
        select(Memory.session_id, Memory.id)
        .where(
            Memory.tenant_id == tenant_id,
            Memory.user_id == user_id,
            Memory.session_id.is_not(None),
            Memory.status.in_(["active", "superseded"]),
        )
        .order_by(Memory.session_id, Memory.id)
    )
    held: dict[uuid.UUID, list[uuid.UUID]] = {}
    for session_pk, memory_pk in rows.all():
        if session_pk is not None:  # the query's condition, for the type checker
            held.setdefault(session_pk, []).append(memory_pk)
    return held


async def tombstone_user_memories(
    db: AsyncSession, holder_pk: uuid.UUID, tenant_id: uuid.UUID, user_id: str
) -> list[uuid.UUID]:
    """Tombstone the items written for the user that the session holds; returns their ids."""
    result = await db.execute(
        update(Memory)
        .where(
            Memory.session_id == holder_pk,
            Memory.tenant_id == tenant_id,
            Memory.user_id == user_id,
            Memory.status.in_(["active", "superseded"]),
        )
        .values(status="tombstoned")
        .returning(Memory.id)
    )
    return sorted(result.scalars().all())


async def session_item_users(db: AsyncSession, session_pk: uuid.UUID) -> set[str]:
    """The users of the user-scope items the session wrote and still holds (not tombstoned)."""
    rows = await db.execute(
        select(Memory.user_id)
        .where(
            Memory.session_id == session_pk,
            Memory.scope == "user",
            Memory.user_id.is_not(None),
            Memory.status.in_(["active", "superseded"]),
        )
        .distinct()
    )
    return {user for user in rows.scalars() if user}


async def tombstone_session_memories(db: AsyncSession, session_pk: uuid.UUID) -> set[str]:
    """Includes user-scope items the session wrote: they leave the user's other sessions too.
    Returns the users whose items these were."""
    result = await db.execute(
        update(Memory)
        .where(Memory.session_id == session_pk, Memory.status.in_(["active", "superseded"]))
        .values(status="tombstoned")
        .returning(Memory.scope, Memory.user_id)
    )
    return {user_id for scope, user_id in result.all() if scope == "user" and user_id}


async def count_memories(
    db: AsyncSession, tenant_id: uuid.UUID, session_id: str, user_id: str | None
) -> int:
    """Active remembered items visible in a session (by its external id, so a cached session
    view can be completed without loading the row): its own, and its user's."""
    own = Memory.session_id.in_(
        select(Session.id).where(Session.tenant_id == tenant_id, Session.external_id == session_id)
    )
    visible = own | ((Memory.scope == "user") & (Memory.user_id == user_id)) if user_id else own
    query = select(func.count()).where(
        Memory.tenant_id == tenant_id, Memory.status == "active", visible
    )
    return int((await db.execute(query)).scalar_one())
