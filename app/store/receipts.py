"""SQL for erase receipts: what a forget or a session delete erased, store by store."""

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import EraseReceipt


async def add_receipt(
    db: AsyncSession, tenant_id: uuid.UUID, session_external_id: str, target: dict[str, Any]
) -> EraseReceipt:
    receipt = EraseReceipt(
        tenant_id=tenant_id, session_external_id=session_external_id, target=target
    )
    db.add(receipt)
    await db.flush()
    await db.refresh(receipt)
    return receipt


async def get_receipt(
    db: AsyncSession, receipt_id: uuid.UUID, tenant_id: uuid.UUID
) -> EraseReceipt | None:
    """A receipt of the caller's tenant."""
    query = select(EraseReceipt).where(
        EraseReceipt.id == receipt_id, EraseReceipt.tenant_id == tenant_id
    )
    return (await db.execute(query)).scalar_one_or_none()


async def session_receipts(
    db: AsyncSession, tenant_id: uuid.UUID, session_external_id: str, limit: int
) -> list[EraseReceipt]:
    """The newest receipts of forgets (and deletes) in a session id, newest first."""
    query = (
        select(EraseReceipt)
        .where(
            EraseReceipt.tenant_id == tenant_id,
            EraseReceipt.session_external_id == session_external_id,
        )
        .order_by(EraseReceipt.requested_at.desc())
        .limit(limit)
    )
    return list((await db.execute(query)).scalars().all())


async def tenant_of_receipt(db: AsyncSession, receipt_id: uuid.UUID) -> uuid.UUID | None:
    """The receipt's tenant, read by its id alone: only for an erase job queued by a version
    before jobs carried the tenant (a rolling upgrade). On a database distributed by tenant this
    asks every node."""
    query = select(EraseReceipt.tenant_id).where(EraseReceipt.id == receipt_id)
    return (await db.execute(query)).scalar_one_or_none()


def _pending(tenant_id: uuid.UUID, receipt_id: uuid.UUID) -> Any:
    return (
        (EraseReceipt.tenant_id == tenant_id)
        & (EraseReceipt.id == receipt_id)
        & (EraseReceipt.status != "completed")
    )


async def claim_attempt(
    db: AsyncSession, tenant_id: uuid.UUID, receipt_id: uuid.UUID
) -> dict[str, Any] | None:
    """Count an attempt of the erase job on a receipt not yet complete, locking it for the rest
    of the transaction (a second run of the same receipt waits, then finds it complete); its
    target, None when it is gone or complete."""
    row = await db.execute(
        update(EraseReceipt)
        .where(_pending(tenant_id, receipt_id))
        .values(attempts=EraseReceipt.attempts + 1)
        .returning(EraseReceipt.target)
    )
    found = row.scalar_one_or_none()
    return None if found is None else dict(found)


async def count_attempt(db: AsyncSession, tenant_id: uuid.UUID, receipt_id: uuid.UUID) -> None:
    """An attempt that failed, counted after its transaction (and its own count) rolled back."""
    await db.execute(
        update(EraseReceipt)
        .where(_pending(tenant_id, receipt_id))
        .values(attempts=EraseReceipt.attempts + 1)
    )


async def lock_pending(
    db: AsyncSession, tenant_id: uuid.UUID, receipt_id: uuid.UUID
) -> dict[str, Any] | None:
    """Lock a receipt not yet complete for the rest of the transaction, as `claim_attempt` does
    without counting; its target, None when it is gone or complete."""
    # The conditions of `_pending` spelled out: a statement that locks shows its tenant filter
    # itself (tests/store/test_tenant_filters.py reads each statement on its own).
    row = await db.execute(
        select(EraseReceipt.target)
        .where(
            EraseReceipt.tenant_id == tenant_id,
            EraseReceipt.id == receipt_id,
            EraseReceipt.status != "completed",
        )
        .with_for_update()
    )
    found = row.scalar_one_or_none()
    return None if found is None else dict(found)


async def complete_receipt(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    receipt_id: uuid.UUID,
    stores: dict[str, Any],
    now: datetime,
) -> None:
    await db.execute(
        update(EraseReceipt)
        .where(EraseReceipt.tenant_id == tenant_id, EraseReceipt.id == receipt_id)
        .values(stores=stores, status="completed", completed_at=now)
    )
