"""SQL for tenants and API keys."""

import uuid
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import ApiKey, Tenant


async def get_or_create_tenant(db: AsyncSession, name: str) -> Tenant:
    await db.execute(
        insert(Tenant).values(name=name).on_conflict_do_nothing(index_elements=["name"])
    )
    return (await db.execute(select(Tenant).where(Tenant.name == name))).scalar_one()


async def add_key(
    db: AsyncSession, tenant_id: uuid.UUID, key_prefix: str, key_hash: str, scopes: list[str]
) -> ApiKey:
    key = ApiKey(tenant_id=tenant_id, key_prefix=key_prefix, key_hash=key_hash, scopes=scopes)
    db.add(key)
    await db.flush()
    return key


async def find_active_key(db: AsyncSession, key_hash: str) -> tuple[ApiKey, Tenant] | None:
    row = (
        await db.execute(
            select(ApiKey, Tenant)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
        )
    ).first()
    return (row[0], row[1]) if row else None


async def find_active_key_by_id(
    db: AsyncSession, key_id: uuid.UUID
) -> tuple[ApiKey, Tenant] | None:
    row = (
        await db.execute(
            select(ApiKey, Tenant)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        )
    ).first()
    return (row[0], row[1]) if row else None


async def list_keys(db: AsyncSession, tenant_name: str | None) -> list[tuple[ApiKey, Tenant]]:
    """Every key (of `tenant_name` only, when given), by tenant, oldest first."""
    query = select(ApiKey, Tenant).join(Tenant, Tenant.id == ApiKey.tenant_id)
    if tenant_name is not None:
        query = query.where(Tenant.name == tenant_name)
    rows = await db.execute(query.order_by(Tenant.name, ApiKey.created_at, ApiKey.id))
    return [(key, tenant) for key, tenant in rows.all()]


async def revoke_key(db: AsyncSession, key_id: uuid.UUID) -> tuple[ApiKey, Tenant] | None:
    """Mark the key revoked (a key already revoked keeps its first time); None: no such key."""
    await db.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
    )
    row = (
        await db.execute(
            select(ApiKey, Tenant)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.id == key_id)
            .execution_options(populate_existing=True)
        )
    ).first()
    return (row[0], row[1]) if row else None


async def tenant_settings(db: AsyncSession, tenant_id: uuid.UUID) -> dict[str, Any]:
    found = await db.execute(select(Tenant.settings).where(Tenant.id == tenant_id))
    return dict(found.scalar_one_or_none() or {})
