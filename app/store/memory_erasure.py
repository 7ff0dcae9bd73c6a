"""SQL of the erasure of remembered items: their texts read to hunt cached copies, tombstoned
items erased (text, vector and every version's text), and the items a deleted session or user
takes with it. Beside `app.store.memories`, which holds the rest of the table's SQL."""

import uuid
from collections.abc import Sequence

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.memories import Change, record_versions
from app.store.models import MEMORY_HELD, Memory, MemoryVersion


async def tombstoned_texts(
    db: AsyncSession, tenant_id: uuid.UUID, memory_ids: Sequence[uuid.UUID]
) -> list[str]:
    """The texts of those of `memory_ids` waiting for their erase."""
    if not memory_ids:
        return []
    rows = await db.execute(
        select(Memory.text).where(
            Memory.tenant_id == tenant_id,
            Memory.id.in_(memory_ids),
            Memory.status == "tombstoned",
        )
    )
    return [t for t in rows.scalars() if t]


async def erase_memories(
    db: AsyncSession, tenant_id: uuid.UUID, memory_ids: Sequence[uuid.UUID]
) -> tuple[int, list[str]]:
    if not memory_ids:
        return 0, []
    texts = await tombstoned_texts(db, tenant_id, memory_ids)
    result = await db.execute(
        update(Memory)
        .where(
            Memory.tenant_id == tenant_id,
            Memory.id.in_(memory_ids),
            Memory.status == "tombstoned",
        )
        .values(
            text="",
            tags=[],
            key=None,
            lexical=func.to_tsvector("simple", ""),
            embedding=None,
            embedding_model=None,
            status="erased",
            revision=Memory.revision + 1,
        )
        .returning(Memory.id)
    )
    erased = list(result.scalars())
    if erased:
        # Every earlier version loses its text and its hash (a short text's hash gives it back).
        await db.execute(
            update(MemoryVersion)
            .where(MemoryVersion.tenant_id == tenant_id, MemoryVersion.memory_id.in_(erased))
            .values(text=None, content_hash=None)
        )
        await record_versions(db, tenant_id, erased, Change("system", None, "erased"))
    return len(erased), texts


async def session_memory_texts(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> tuple[int, list[str]]:
    """(items, their texts) the session holds, whatever their status."""
    query = select(Memory.text).where(
        Memory.tenant_id == tenant_id, Memory.session_id == session_pk
    )
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
            Memory.status.in_(MEMORY_HELD),
        )
        .order_by(Memory.session_id, Memory.id)
    )
    held: dict[uuid.UUID, list[uuid.UUID]] = {}
    for session_pk, memory_pk in rows.all():
        if session_pk is not None:  # the query's condition, for the type checker
            held.setdefault(session_pk, []).append(memory_pk)
    return held


async def tombstone_user_memories(
    db: AsyncSession, holder_pk: uuid.UUID, tenant_id: uuid.UUID, user_id: str, change: Change
) -> list[uuid.UUID]:
    """Tombstone the items written for the user that the session holds; returns their ids."""
    result = await db.execute(
        update(Memory)
        .where(
            Memory.session_id == holder_pk,
            Memory.tenant_id == tenant_id,
            Memory.user_id == user_id,
            Memory.status.in_(MEMORY_HELD),
        )
        .values(status="tombstoned", revision=Memory.revision + 1)
        .returning(Memory.id)
    )
    tombstoned = sorted(result.scalars().all())
    await record_versions(db, tenant_id, tombstoned, change)
    return tombstoned


async def session_item_users(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, *, derived_only: bool = False
) -> set[str]:
    """The users of the user-scope items the session wrote and still holds (not tombstoned):
    whose other sessions' notes an erase of this one changes. `derived_only`: only items that
    name their source turns or tool, those a revocation of a source in this session reaches
    (`app.store.memory_lineage`)."""
    conditions = [
        Memory.tenant_id == tenant_id,
        Memory.session_id == session_pk,
        Memory.scope == "user",
        Memory.user_id.is_not(None),
        Memory.status.in_(MEMORY_HELD),
    ]
    if derived_only:
        conditions.append(
            (func.cardinality(Memory.turn_seqs) > 0) | Memory.source_tool.is_not(None)
        )
    rows = await db.execute(select(Memory.user_id).where(*conditions).distinct())
    return {user for user in rows.scalars() if user}


async def tombstone_session_memories(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, change: Change
) -> set[str]:
    """Includes user-scope items the session wrote: they leave the user's other sessions too.
    Returns the users whose items these were."""
    result = await db.execute(
        update(Memory)
        .where(
            Memory.tenant_id == tenant_id,
            Memory.session_id == session_pk,
            Memory.status.in_(MEMORY_HELD),
        )
        .values(status="tombstoned", revision=Memory.revision + 1)
        .returning(Memory.id, Memory.scope, Memory.user_id)
    )
    rows = result.all()
    await record_versions(db, tenant_id, [memory_id for memory_id, _, _ in rows], change)
    return {user_id for _, scope, user_id in rows if scope == "user" and user_id}
