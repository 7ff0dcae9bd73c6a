"""SQL for stored build manifests (prompt_builds), with a per-session retention limit."""

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import String, cast, delete, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import PromptBuild, Session

# A session's build stored and its older ones trimmed in one statement: the DELETE sees the rows
# as they were before the INSERT, so it keeps `keep - 1` of them beside the new one.
_STORE_BUILD = text(
    "WITH stored AS (INSERT INTO prompt_builds (id, tenant_id, session_id, record) "
    "VALUES (:id, :tenant, :session, CAST(:record AS jsonb))) "
    "DELETE FROM prompt_builds WHERE tenant_id = :tenant AND session_id = :session AND id NOT IN ("
    "SELECT id FROM prompt_builds WHERE tenant_id = :tenant AND session_id = :session "
    "ORDER BY created_at DESC, id DESC LIMIT :older)"
)
# Only when the transaction wrote nothing yet (no transaction id assigned).
_ASYNC_COMMIT_IF_READ_ONLY = text(
    "SELECT set_config('synchronous_commit', 'off', true) "
    "WHERE pg_current_xact_id_if_assigned() IS NULL"
)


async def store_build(
    db: AsyncSession, build_id: uuid.UUID, session: Session, record: dict[str, Any], keep: int
) -> None:
    """Store a build's record and trim the session's to the newest `keep`. A build writes nothing
    else most of the time: its transaction then commits without waiting for the WAL flush (a
    manifest lost in a crash costs nothing; a transaction that wrote before, an appended turn
    say, keeps its durable commit)."""
    await db.flush()  # what the ORM holds back counts as written before
    await db.execute(_ASYNC_COMMIT_IF_READ_ONLY)
    await db.execute(
        _STORE_BUILD,
        {
            "id": build_id,
            "tenant": session.tenant_id,
            "session": session.id,
            "record": json.dumps(record, ensure_ascii=False),
            "older": keep - 1,
        },
    )


async def get_build(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, build_id: uuid.UUID
) -> PromptBuild | None:
    query = select(PromptBuild).where(
        PromptBuild.tenant_id == tenant_id,
        PromptBuild.id == build_id,
        PromptBuild.session_id == session_pk,
    )
    return (await db.execute(query)).scalar_one_or_none()


async def delete_builds_quoting(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, needles: list[str]
) -> int:
    """Delete the session's stored manifests that quote any of `needles` (erased text or ids)."""
    if not needles:
        return 0
    result = await db.execute(
        delete(PromptBuild).where(
            PromptBuild.tenant_id == tenant_id,
            PromptBuild.session_id == session_pk,
            or_(*(cast(PromptBuild.record, String).contains(n) for n in needles)),
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def delete_builds_since(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, since: datetime
) -> int:
    """Delete the session's stored manifests built at or after `since`."""
    result = await db.execute(
        delete(PromptBuild).where(
            PromptBuild.tenant_id == tenant_id,
            PromptBuild.session_id == session_pk,
            PromptBuild.created_at >= since,
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def recent_builds(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, limit: int
) -> list[PromptBuild]:
    """The newest stored build manifests of a session, newest first."""
    query = (
        select(PromptBuild)
        .where(PromptBuild.tenant_id == tenant_id, PromptBuild.session_id == session_pk)
        .order_by(PromptBuild.created_at.desc(), PromptBuild.id.desc())
        .limit(limit)
    )
    return list((await db.execute(query)).scalars().all())
