"""SQL for sessions, turns and idempotency records."""

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import column, delete, func, select, update
from sqlalchemy import true as sa_true
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import IdempotencyRecord, Memory, Session, Turn
from app.sessions.schemas import SESSION_ID_PATTERN


async def get_session(
    db: AsyncSession, tenant_id: uuid.UUID, external_id: str, *, for_update: bool = False
) -> Session | None:
    query = select(Session).where(
        Session.tenant_id == tenant_id, Session.external_id == external_id
    )
    if for_update:
        query = query.with_for_update()
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


async def lock_session_by_pk(db: AsyncSession, session_pk: uuid.UUID) -> Session | None:
    query = select(Session).where(Session.id == session_pk).with_for_update()
    return (await db.execute(query)).scalar_one_or_none()


async def insert_turns(db: AsyncSession, rows: Sequence[dict[str, Any]]) -> list[Turn]:
    result = await db.execute(insert(Turn).returning(Turn), list(rows))
    return list(result.scalars().all())


async def known_tool_call_ids(
    db: AsyncSession, session_pk: uuid.UUID, ids: Sequence[str]
) -> set[str]:
    """Which of `ids` were issued by a stored assistant turn of the session."""
    if not ids:
        return set()
    calls = (
        func.jsonb_array_elements(Turn.tool_calls)
        .table_valued(column("value", JSONB))
        .render_derived(name="call")
    )
    query = (
        select(calls.c.value["id"].astext)
        .select_from(Turn)
        .join(calls, sa_true())
        .where(
            Turn.session_id == session_pk,
            Turn.tool_calls.is_not(None),
            calls.c.value["id"].astext.in_(list(ids)),
        )
    )
    return set((await db.execute(query)).scalars().all())


async def list_turns(
    db: AsyncSession,
    session_pk: uuid.UUID,
    *,
    after_seq: int,
    limit: int,
    role: str | None,
) -> list[Turn]:
    query = (
        select(Turn)
        .where(Turn.session_id == session_pk, Turn.seq > after_seq, Turn.forgotten_at.is_(None))
        .order_by(Turn.seq)
        .limit(limit)
    )
    if role is not None:
        query = query.where(Turn.role == role)
    return list((await db.execute(query)).scalars().all())


async def window_turns(db: AsyncSession, session_pk: uuid.UUID) -> list[Turn]:
    """C1: turns not yet offloaded nor forgotten, in order."""
    query = (
        select(Turn)
        .where(Turn.session_id == session_pk, Turn.chunk_id.is_(None), Turn.forgotten_at.is_(None))
        .order_by(Turn.seq)
    )
    return list((await db.execute(query)).scalars().all())


async def update_session(db: AsyncSession, session_pk: uuid.UUID, **values: Any) -> int:
    """Update the row and bump its version; returns the new version (for cache invalidation)."""
    result = await db.execute(
        update(Session)
        .where(Session.id == session_pk)
        .values(version=Session.version + 1, **values)
        .returning(Session.version)
    )
    return int(result.scalar_one())


async def delete_session(db: AsyncSession, session_pk: uuid.UUID) -> None:
    await db.execute(delete(Session).where(Session.id == session_pk))


async def count_memories(
    db: AsyncSession, tenant_id: uuid.UUID, session_id: str, user_id: str | None
) -> int:
    """Active remembered items visible in a session: its own, and its user's (scope user)."""
    own = Memory.session_id.in_(
        select(Session.id).where(Session.tenant_id == tenant_id, Session.external_id == session_id)
    )
    visible = own | ((Memory.scope == "user") & (Memory.user_id == user_id)) if user_id else own
    query = select(func.count()).where(
        Memory.tenant_id == tenant_id, Memory.status == "active", visible
    )
    return int((await db.execute(query)).scalar_one())


async def claim_idempotency_key(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, key: str, request_hash: str
) -> IdempotencyRecord | None:
    """Claim `key` for this transaction. Returns the earlier record when the key was used.

    A concurrent claim of the same key waits on the unique index until the first transaction
    ends, then sees its committed record: a replay never writes twice.
    """
    claimed = await db.execute(
        insert(IdempotencyRecord)
        .values(tenant_id=tenant_id, session_id=session_pk, key=key, request_hash=request_hash)
        .on_conflict_do_nothing()
        .returning(IdempotencyRecord.key)
    )
    if claimed.first() is not None:
        return None
    query = select(IdempotencyRecord).where(
        IdempotencyRecord.tenant_id == tenant_id,
        IdempotencyRecord.session_id == session_pk,
        IdempotencyRecord.key == key,
    )
    return (await db.execute(query)).scalar_one()


async def store_idempotent_response(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    key: str,
    status_code: int,
    response: dict[str, Any],
) -> None:
    await db.execute(
        update(IdempotencyRecord)
        .where(
            IdempotencyRecord.tenant_id == tenant_id,
            IdempotencyRecord.session_id == session_pk,
            IdempotencyRecord.key == key,
        )
        .values(status_code=status_code, response=response)
    )


async def get_session_by_pk(db: AsyncSession, session_pk: uuid.UUID) -> Session | None:
    return await db.get(Session, session_pk, populate_existing=True)


async def list_sessions(
    db: AsyncSession, tenant_id: uuid.UUID, *, limit: int, offset: int
) -> list[Session]:
    """A tenant's sessions, most recently changed first (not those being erased, whose ids no
    client can name)."""
    query = (
        select(Session)
        .where(
            Session.tenant_id == tenant_id,
            Session.external_id.regexp_match(SESSION_ID_PATTERN),
        )
        .order_by(Session.updated_at.desc(), Session.id)
        .limit(limit)
        .offset(offset)
    )
    return list((await db.execute(query)).scalars().all())


async def turn_timeline(db: AsyncSession, session_pk: uuid.UUID) -> list[tuple[int, Any, int]]:
    """(seq, created_at, token_count) of every turn of a session, in order (no content)."""
    query = (
        select(Turn.seq, Turn.created_at, Turn.token_count)
        .where(Turn.session_id == session_pk)
        .order_by(Turn.seq)
    )
    return [(int(r[0]), r[1], int(r[2])) for r in (await db.execute(query)).all()]
