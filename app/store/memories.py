"""SQL for remembered items (the `memories` table): every query of it lives here, but those of
the embedding backlog (`app.store.embedding_backlog`)."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, func, insert, literal, or_, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.embeddings.base import vector_literal
from app.store.models import (
    MEMORY_HELD,
    MEMORY_INJECTED,
    MEMORY_LIVE,
    Memory,
    MemoryVersion,
    Session,
    SessionKey,
)


@dataclass(frozen=True, slots=True)
class Change:
    """Who changes remembered items and why, written into each version the change makes."""

    actor: str  # user, agent, api_key, rule, system
    key_id: uuid.UUID | None
    reason: str


# The changes erasure makes: a forget through the memory tool, a session or a user deleted.
FORGOTTEN = Change("agent", None, "forgotten")
SESSION_DELETED = Change("api_key", None, "its session was deleted")
USER_DELETED = Change("api_key", None, "its user was deleted")


async def lock_owner(db: AsyncSession, owner: str) -> None:
    """Serialise writers of one memory owner (a session, or a tenant's user) until commit."""
    await db.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:o, 0))"), {"o": owner})


# --- remembered items ----------------------------------------------------------------------------


def _visible(session: Session) -> Any:
    own = Memory.session_id == session.id
    if session.user_id:
        own = own | ((Memory.scope == "user") & (Memory.user_id == session.user_id))
    return (Memory.tenant_id == session.tenant_id) & own


def _valid_at(at: Any, valid_from: Any, valid_until: Any, expires_at: Any) -> Any:
    return and_(
        or_(valid_from.is_(None), valid_from <= at),
        or_(valid_until.is_(None), valid_until > at),
        or_(expires_at.is_(None), expires_at > at),
    )


def in_force(at: Any = None) -> Any:
    """Items stated as facts at `at` (default: the transaction's time): verified or active, and
    within their validity and TTL."""
    at = func.now() if at is None else at
    return Memory.status.in_(MEMORY_INJECTED) & _valid_at(
        at, Memory.valid_from, Memory.valid_until, Memory.expires_at
    )


def stated_at(state: Memory | MemoryVersion, at: datetime) -> bool:
    """`in_force` for an item or a version already read."""
    return (
        state.status in MEMORY_INJECTED
        and (state.valid_from is None or state.valid_from <= at)
        and (state.valid_until is None or state.valid_until > at)
        and (state.expires_at is None or state.expires_at > at)
    )


async def visible_memories(db: AsyncSession, session: Session) -> list[Memory]:
    """Items in force of the session, and of its user when the session has one."""
    query = (
        select(Memory)
        .where(Memory.tenant_id == session.tenant_id, _visible(session), in_force())
        .order_by(Memory.created_at, Memory.id)
    )
    return list((await db.execute(query)).scalars())


async def unconfirmed_memories(db: AsyncSession, session: Session) -> list[Memory]:
    """Candidates and quarantined items the session sees (an explicit recall shows them)."""
    query = (
        select(Memory)
        .where(
            Memory.tenant_id == session.tenant_id,
            _visible(session),
            Memory.status.in_(("candidate", "quarantined")),
        )
        .order_by(Memory.created_at, Memory.id)
    )
    return list((await db.execute(query)).scalars())


async def list_memories(
    db: AsyncSession,
    session: Session,
    *,
    include_superseded: bool,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int | None = None,
) -> list[Memory]:
    """Visible items (unconfirmed ones too, expired ones kept as history), oldest first
    (`created_at`, then id); a page of them with `after`/`limit`."""
    statuses = MEMORY_HELD if include_superseded else MEMORY_LIVE
    query = (
        select(Memory)
        .where(
            Memory.tenant_id == session.tenant_id, _visible(session), Memory.status.in_(statuses)
        )
        .order_by(Memory.created_at, Memory.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(Memory.created_at, Memory.id) > after)
    return list((await db.execute(query)).scalars())


def _owned_by(session: Session, scope: str) -> Any:
    of_tenant = Memory.tenant_id == session.tenant_id
    if scope == "user":
        return of_tenant & (Memory.scope == "user") & (Memory.user_id == session.user_id)
    return of_tenant & (Memory.scope == "session") & (Memory.session_id == session.id)


async def owner_memories(
    db: AsyncSession, session: Session, scope: str, key: str | None
) -> list[Memory]:
    """Items in force of one owner (the session, or the session's user) — with `key`, of that
    key — oldest first."""
    query = select(Memory).where(
        Memory.tenant_id == session.tenant_id, _owned_by(session, scope), in_force()
    )
    if key is not None:
        query = query.where(Memory.key == key)
    return list((await db.execute(query.order_by(Memory.created_at))).scalars())


async def live_keyed_memories(db: AsyncSession, memory: Memory, session: Session) -> list[Memory]:
    """The other live items of `memory`'s owner and key (those a new value of it supersedes)."""
    query = select(Memory).where(
        Memory.tenant_id == memory.tenant_id,
        _owned_by(session, memory.scope),
        Memory.key == memory.key,
        Memory.id != memory.id,
        Memory.status.in_(MEMORY_LIVE),
    )
    return list((await db.execute(query.order_by(Memory.created_at))).scalars())


async def owner_unconfirmed(db: AsyncSession, session: Session, scope: str) -> list[Memory]:
    """Candidates of one owner (untrusted items waiting to be verified), oldest first."""
    query = select(Memory).where(
        Memory.tenant_id == session.tenant_id,
        _owned_by(session, scope),
        Memory.status == "candidate",
    )
    return list((await db.execute(query.order_by(Memory.created_at))).scalars())


async def set_evidence(
    db: AsyncSession,
    memory: Memory,
    evidence: list[dict[str, Any]],
    standing: tuple[str, float, Sequence[str]],
    promotion: Change | None = None,
) -> None:
    """Record the item's evidence and its standing (tier, stability, which evidence). More
    evidence alone is not a change of the item (its revision stays); a `promotion` is, and
    gets its version."""
    tier, score, stable_by = standing
    values: dict[str, Any] = {
        "evidence": evidence,
        "tier": tier,
        "stability": score,
        "stable_by": list(stable_by),
    }
    if promotion is not None:
        values["revision"] = Memory.revision + 1
    await db.execute(
        update(Memory)
        .where(Memory.tenant_id == memory.tenant_id, Memory.id == memory.id)
        .values(**values)
    )
    if promotion is not None:
        await record_versions(db, memory.tenant_id, [memory.id], promotion)
    await db.refresh(memory)


async def visible_memory(db: AsyncSession, session: Session, memory_id: uuid.UUID) -> Memory | None:
    """An item the session sees that a forget may still take."""
    query = select(Memory).where(
        Memory.id == memory_id,
        Memory.tenant_id == session.tenant_id,
        _visible(session),
        Memory.status.in_(MEMORY_HELD),
    )
    return (await db.execute(query)).scalar_one_or_none()


async def find_memory(
    db: AsyncSession, session: Session, memory_id: uuid.UUID, *, lock: bool = False
) -> Memory | None:
    """An item the session sees, whatever its status (its record outlives its text)."""
    query = select(Memory).where(
        Memory.id == memory_id, Memory.tenant_id == session.tenant_id, _visible(session)
    )
    if lock:
        query = query.with_for_update()
    return (await db.execute(query)).scalar_one_or_none()


async def visible_memory_ids(db: AsyncSession, session: Session) -> list[uuid.UUID]:
    query = select(Memory.id).where(
        Memory.tenant_id == session.tenant_id,
        _visible(session),
        Memory.status.in_(MEMORY_HELD),
    )
    return list((await db.execute(query)).scalars().all())


async def insert_memory(
    db: AsyncSession, values: dict[str, Any], lexical_source: str, change: Change
) -> Memory:
    """A new item and its first version."""
    memory = Memory(**values, lexical=func.to_tsvector("simple", lexical_source))
    db.add(memory)
    await db.flush()
    await db.refresh(memory)
    await record_versions(db, memory.tenant_id, [memory.id], change)
    return memory


# --- versions ------------------------------------------------------------------------------------


def _content_hash(column: Any) -> Any:
    return case(
        (column == "", None),
        else_=func.encode(func.sha256(func.convert_to(column, "UTF8")), "hex"),
    )


async def record_versions(
    db: AsyncSession, tenant_id: uuid.UUID, memory_ids: Sequence[uuid.UUID], change: Change
) -> None:
    """A version of each item as it now is (its current `revision`): call after each change."""
    if not memory_ids:
        return
    state = select(
        Memory.tenant_id,
        Memory.id,
        Memory.revision,
        Memory.status,
        func.nullif(Memory.text, ""),
        _content_hash(Memory.text),
        Memory.trusted,
        literal(change.actor),
        literal(change.key_id),
        literal(change.reason),
        Memory.valid_from,
        Memory.valid_until,
        Memory.expires_at,
    ).where(Memory.tenant_id == tenant_id, Memory.id.in_(memory_ids))
    columns = [
        "tenant_id",
        "memory_id",
        "revision",
        "status",
        "text",
        "content_hash",
        "trusted",
        "actor",
        "actor_key_id",
        "reason",
        "valid_from",
        "valid_until",
        "expires_at",
    ]
    await db.execute(insert(MemoryVersion).from_select(columns, state))


async def change_memory(
    db: AsyncSession,
    memory: Memory,
    values: dict[str, Any],
    change: Change,
    *,
    expected_revision: int,
    lexical_source: str | None = None,
) -> bool:
    """Apply `values` to the item as a new revision, only if it is still at
    `expected_revision` (compare-and-set); False when it moved on."""
    if lexical_source is not None:
        values = {**values, "lexical": func.to_tsvector("simple", lexical_source)}
    result = await db.execute(
        update(Memory)
        .where(
            Memory.id == memory.id,
            Memory.tenant_id == memory.tenant_id,
            Memory.revision == expected_revision,
        )
        .values(**values, revision=Memory.revision + 1)
        .returning(Memory.id)
    )
    if result.scalar_one_or_none() is None:
        return False
    await record_versions(db, memory.tenant_id, [memory.id], change)
    await db.refresh(memory)
    return True


async def memory_versions(db: AsyncSession, memory: Memory) -> list[MemoryVersion]:
    query = (
        select(MemoryVersion)
        .where(MemoryVersion.tenant_id == memory.tenant_id, MemoryVersion.memory_id == memory.id)
        .order_by(MemoryVersion.revision)
    )
    return list((await db.execute(query)).scalars())


async def redact_version(db: AsyncSession, memory: Memory, revision: int) -> MemoryVersion | None:
    """Drop the text of one version of the item, keeping its record; None if there is none."""
    result = await db.execute(
        update(MemoryVersion)
        .where(
            MemoryVersion.tenant_id == memory.tenant_id,
            MemoryVersion.memory_id == memory.id,
            MemoryVersion.revision == revision,
        )
        .values(text=None, redacted_at=func.coalesce(MemoryVersion.redacted_at, func.now()))
        .returning(MemoryVersion)
    )
    return result.scalar_one_or_none()


async def memories_as_of(
    db: AsyncSession, session: Session, at: datetime, memory_id: uuid.UUID | None = None
) -> list[tuple[Memory, MemoryVersion]]:
    """The items the session sees that existed at `at`, each with its version of that moment
    (the last written by then), oldest first."""
    last = (
        select(MemoryVersion)
        .where(MemoryVersion.tenant_id == session.tenant_id, MemoryVersion.created_at <= at)
        .order_by(MemoryVersion.memory_id, MemoryVersion.revision.desc())
        .ext(distinct_on(MemoryVersion.memory_id))
    )
    if memory_id is not None:
        last = last.where(MemoryVersion.memory_id == memory_id)
    then = last.subquery()
    version = aliased(MemoryVersion, then)
    query = (
        select(Memory, version)
        .join(then, (then.c.memory_id == Memory.id) & (then.c.tenant_id == Memory.tenant_id))
        .where(Memory.tenant_id == session.tenant_id, _visible(session))
        .order_by(Memory.created_at, Memory.id)
    )
    return [(m, v) for m, v in (await db.execute(query)).all()]


async def active_visible_memories(
    db: AsyncSession, session: Session, *, user_scope_only: bool = False
) -> list[Memory]:
    """Items in force the session sees (its own and its user's), oldest first; with
    `user_scope_only`, only its user's user-scope items."""
    visible = _owned_by(session, "user") if user_scope_only else _visible(session)
    query = (
        select(Memory)
        .where(Memory.tenant_id == session.tenant_id, in_force(), visible)
        .order_by(Memory.created_at)
    )
    return list((await db.execute(query)).scalars().all())


async def nearest_memories(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    memory_ids: Sequence[uuid.UUID],
    model: str,
    dim: int,
    vector: Sequence[float],
    limit: int,
) -> dict[str, float]:
    """Cosine similarity of the closest of `memory_ids` embedded with `model`, best first (an
    exact scan: a session sees tens to hundreds of items)."""
    if not memory_ids:
        return {}
    rows = await db.execute(
        text(
            f"""
            SELECT id, embedding::vector({int(dim)}) <=> CAST(:vector AS vector({int(dim)}))
                AS distance
            FROM memories
            WHERE tenant_id = :tenant AND id = ANY(:ids) AND status = ANY(:statuses)
                AND embedding_model = :model
            ORDER BY distance LIMIT :limit
            """
        ),
        {
            "tenant": tenant_id,
            "ids": list(memory_ids),
            "statuses": list(MEMORY_LIVE),
            "model": model,
            "vector": vector_literal(vector),
            "limit": limit,
        },
    )
    return {str(mid): 1.0 - float(dist) for mid, dist in rows}


async def set_memory_status(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    memory_ids: Sequence[uuid.UUID],
    status: str,
    change: Change,
) -> None:
    """Move the items to `status`, a new version each."""
    if memory_ids:
        await db.execute(
            update(Memory)
            .where(Memory.tenant_id == tenant_id, Memory.id.in_(memory_ids))
            .values(status=status, revision=Memory.revision + 1)
        )
        await record_versions(db, tenant_id, memory_ids, change)


async def crossed_validity(
    db: AsyncSession, since: datetime, until: datetime
) -> list[tuple[SessionKey, bool]]:
    """Sessions holding stated items that entered or left force in (since, until] (a
    `valid_from`, `valid_until` or TTL passed), every tenant's (the minutely sweep's read, no
    lock): (the session, whether one is user-scope)."""
    crossed = or_(
        *(
            (column > since) & (column <= until)
            for column in (Memory.valid_from, Memory.valid_until, Memory.expires_at)
        )
    )
    query = (
        select(Memory.tenant_id, Memory.session_id, func.bool_or(Memory.scope == "user"))
        .where(Memory.status.in_(MEMORY_INJECTED), Memory.session_id.is_not(None), crossed)
        .group_by(Memory.tenant_id, Memory.session_id)
    )
    return [
        (SessionKey(tenant, pk), bool(user))
        for tenant, pk, user in (await db.execute(query)).all()
        if pk is not None
    ]


async def memories_written_since(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, since: datetime
) -> int:
    """Rate-limit fallback when Redis is down: items this session wrote in the window (by the
    memory tool or the API alike: both count against `memory.remember_per_minute`)."""
    query = select(func.count()).where(
        Memory.tenant_id == tenant_id, Memory.session_id == session_pk, Memory.created_at >= since
    )
    return int((await db.execute(query)).scalar_one())


async def count_memories(
    db: AsyncSession, tenant_id: uuid.UUID, session_id: str, user_id: str | None
) -> int:
    """Active remembered items visible in a session (by its external id, so a cached session
    view can be completed without loading the row): its own, and its user's."""
    own = Memory.session_id.in_(
        select(Session.id).where(Session.tenant_id == tenant_id, Session.external_id == session_id)
    )
    visible = own | ((Memory.scope == "user") & (Memory.user_id == user_id)) if user_id else own
    query = select(func.count()).where(Memory.tenant_id == tenant_id, in_force(), visible)
    return int((await db.execute(query)).scalar_one())
