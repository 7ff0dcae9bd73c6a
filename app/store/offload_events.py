"""SQL for offload events: one row per offload, what it moved and why (the inspector's log)."""

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import OffloadEvent


async def add_offload_event(db: AsyncSession, **values: Any) -> None:
    db.add(OffloadEvent(**values))
    await db.flush()


async def offload_events(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, limit: int
) -> list[OffloadEvent]:
    """The session's newest offload events, oldest first."""
    newest = (
        select(OffloadEvent)
        .where(OffloadEvent.tenant_id == tenant_id, OffloadEvent.session_id == session_pk)
        .order_by(OffloadEvent.created_at.desc(), OffloadEvent.id.desc())
        .limit(limit)
        .subquery()
    )
    query = (
        select(OffloadEvent)
        .join(
            newest,
            (OffloadEvent.id == newest.c.id) & (OffloadEvent.tenant_id == newest.c.tenant_id),
        )
        .order_by(OffloadEvent.created_at, OffloadEvent.id)
    )
    return list((await db.execute(query)).scalars().all())
