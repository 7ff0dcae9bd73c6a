"""Setup for the tests that migrate their own database down, write rows as an older schema held
them, and upgrade again (modules marked `OWN_DATABASE`)."""

import asyncio
import uuid

from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.core.migrate import alembic_config
from tests.conftest import new_key
from tests.support.factories import transaction


async def session_before(
    engine: AsyncEngine, settings: Settings, revision: str, *, user_id: str
) -> tuple[str, uuid.UUID]:
    """Migrates the database down to `revision`, then writes by SQL a session 'before' of
    `user_id` under a new tenant; returns that tenant's key (read and write) and the session's
    id."""
    url = settings.database_url or ""
    await asyncio.to_thread(command.downgrade, alembic_config(url), revision)
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    key = await new_key(engine, tenant, ["sessions:read", "sessions:write"])
    session_pk = uuid.uuid4()
    async with transaction(engine) as db:
        await db.execute(
            text(
                "INSERT INTO sessions (id, tenant_id, external_id, user_id)"
                " SELECT :id, id, 'before', :user FROM tenants WHERE name = :t"
            ),
            {"id": session_pk, "user": user_id, "t": tenant},
        )
    return key, session_pk
