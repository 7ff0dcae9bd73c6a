"""SQL for stored build manifests (prompt_builds), with a per-session retention limit."""

import uuid
from typing import Any

from sqlalchemy import String, cast, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import PromptBuild, Session


async def store_build(
    db: AsyncSession, build_id: uuid.UUID, session: Session, record: dict[str, Any], keep: int
) -> None:
    db.add(
        PromptBuild(id=build_id, tenant_id=session.tenant_id, session_id=session.id, record=record)
    )
    await db.flush()
    newest = (
        select(PromptBuild.id)
        .where(PromptBuild.session_id == session.id)
        .order_by(PromptBuild.created_at.desc(), PromptBuild.id.desc())
        .limit(keep)
    )
    await db.execute(
        delete(PromptBuild).where(
            PromptBuild.session_id == session.id, PromptBuild.id.not_in(newest)
        )
    )


async def get_build(
    db: AsyncSession, session_pk: uuid.UUID, build_id: uuid.UUID
) -> PromptBuild | None:
    query = select(PromptBuild).where(
        PromptBuild.id == build_id, PromptBuild.session_id == session_pk
    )
    return (await db.execute(query)).scalar_one_or_none()


async def delete_builds_quoting(db: AsyncSession, session_pk: uuid.UUID, needles: list[str]) -> int:
    """Delete the session's stored manifests that quote any of `needles` (erased text or ids)."""
    if not needles:
        return 0
    result = await db.execute(
        delete(PromptBuild).where(
            PromptBuild.session_id == session_pk,
            or_(*(cast(PromptBuild.record, String).contains(n) for n in needles)),
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def recent_builds(db: AsyncSession, session_pk: uuid.UUID, limit: int) -> list[PromptBuild]:
    """The newest stored build manifests of a session, newest first."""
    query = (
        select(PromptBuild)
        .where(PromptBuild.session_id == session_pk)
        .order_by(PromptBuild.created_at.desc(), PromptBuild.id.desc())
        .limit(limit)
    )
    return list((await db.execute(query)).scalars().all())
