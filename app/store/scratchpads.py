"""SQL for the scratchpad (C2): read, compare-and-set write, stale-write counting."""

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import Scratchpad, Session


async def get_scratchpad(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> Scratchpad | None:
    query = (
        select(Scratchpad)
        .where(Scratchpad.tenant_id == tenant_id, Scratchpad.session_id == session_pk)
        .execution_options(populate_existing=True)
    )
    return (await db.execute(query)).scalar_one_or_none()


async def sessions_quoting_remembered(
    db: AsyncSession, tenant_id: uuid.UUID, texts: Sequence[str]
) -> list[uuid.UUID]:
    """The tenant's sessions whose notes quote any of `texts` as a remembered item."""
    if not texts:
        return []
    query = (
        select(Scratchpad.session_id)
        .where(
            Scratchpad.tenant_id == tenant_id,
            or_(*(Scratchpad.notes["remembered"].contains([{"text": t}]) for t in texts)),
        )
        .order_by(Scratchpad.session_id)
    )
    return list((await db.execute(query)).scalars().all())


async def ensure_scratchpad(db: AsyncSession, session: Session) -> None:
    await db.execute(
        insert(Scratchpad)
        .values(session_id=session.id, tenant_id=session.tenant_id)
        .on_conflict_do_nothing(index_elements=["session_id", "tenant_id"])
    )


async def compare_and_set(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    base_version: int,
    values: dict[str, Any],
) -> bool:
    """Write version base+1 only if the row is still at `base_version`."""
    result = await db.execute(
        update(Scratchpad)
        .where(
            Scratchpad.tenant_id == tenant_id,
            Scratchpad.session_id == session_pk,
            Scratchpad.version == base_version,
        )
        .values(version=base_version + 1, **values)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def count_stale_write(db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID) -> None:
    await db.execute(
        update(Scratchpad)
        .where(Scratchpad.tenant_id == tenant_id, Scratchpad.session_id == session_pk)
        .values(stale_writes=Scratchpad.stale_writes + 1)
    )


async def flag_rebuild_pending(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, base_version: int
) -> None:
    await db.execute(
        update(Scratchpad)
        .where(
            Scratchpad.tenant_id == tenant_id,
            Scratchpad.session_id == session_pk,
            Scratchpad.version == base_version,
        )
        .values(rebuild_pending=True)
    )
