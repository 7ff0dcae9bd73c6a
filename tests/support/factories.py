"""Direct service-level setup for tests that exercise a service without HTTP."""

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.auth.service import hash_key
from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import create_sessionmaker, unit_of_work
from app.domain.callers import ALL_SCOPES, Caller
from app.sessions import append as append_sessions
from app.sessions import service as sessions
from app.sessions.schemas import AppendTurnsRequest, SessionConfigUpdate


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncSession]:
    async with unit_of_work(create_sessionmaker(engine)) as db:
        yield db


async def new_caller(engine: AsyncEngine, tenant: str | None = None) -> Caller:
    from app.store.keys import get_or_create_tenant

    async with transaction(engine) as db:
        row = await get_or_create_tenant(db, tenant or f"t-{uuid.uuid4().hex[:12]}")
    return Caller(row.id, row.name, frozenset(s.value for s in ALL_SCOPES), None)


async def configure(
    engine: AsyncEngine, caller: Caller, settings: Settings, cache: Cache, sid: str, **config: Any
) -> None:
    async with transaction(engine) as db:
        await sessions.update_session(
            db, caller, settings, cache, sid, SessionConfigUpdate(**config)
        )


async def append(
    engine: AsyncEngine,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    sid: str,
    turns: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    async with transaction(engine) as db:
        outcome = await append_sessions.append_turns(
            db,
            caller,
            settings,
            cache,
            sid,
            AppendTurnsRequest.model_validate({"turns": turns}),
            None,
        )
    return outcome.response.model_dump(mode="json")


async def session_of_key(engine: AsyncEngine, api_key: str, sid: str) -> uuid.UUID:
    """The primary key of session `sid` of the API key's tenant."""
    async with engine.connect() as conn:
        found = await conn.scalar(
            text(
                "SELECT s.id FROM sessions s JOIN api_keys k ON k.tenant_id = s.tenant_id "
                "WHERE k.key_hash = :h AND s.external_id = :sid"
            ),
            {"h": hash_key(api_key), "sid": sid},
        )
    assert found is not None
    return uuid.UUID(str(found))


async def tenant_of(db: AsyncSession, session_pk: uuid.UUID) -> uuid.UUID:
    """The tenant of a session a test holds by its primary key (the store's calls name both)."""
    from app.store.sessions import tenants_of_sessions

    return (await tenants_of_sessions(db, [session_pk]))[session_pk]
