"""SQL of the memory tool: remembered items, tenant switches, tombstones, erase, receipts."""

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, cast, delete, func, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import (
    Chunk,
    EraseReceipt,
    Memory,
    PromptBuild,
    Scratchpad,
    Session,
    Tenant,
    Turn,
)
from app.embeddings.base import vector_literal

# --- tenants and sessions ------------------------------------------------------------------------


async def tenant_settings(db: AsyncSession, tenant_id: uuid.UUID) -> dict[str, Any]:
    found = await db.execute(select(Tenant.settings).where(Tenant.id == tenant_id))
    return dict(found.scalar_one_or_none() or {})


async def user_session_ids(
    db: AsyncSession, tenant_id: uuid.UUID, user_id: str, limit: int
) -> list[uuid.UUID]:
    rows = await db.execute(
        select(Session.id)
        .where(Session.tenant_id == tenant_id, Session.user_id == user_id)
        .order_by(Session.updated_at.desc())
        .limit(limit)
    )
    return list(rows.scalars())


async def lock_owner(db: AsyncSession, owner: str) -> None:
    """Serialise writers of one memory owner (a session, or a tenant's user) until commit."""
    await db.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:o, 0))"), {"o": owner})


# --- remembered items ----------------------------------------------------------------------------


def _visible(session: Session) -> Any:
    own = Memory.session_id == session.id
    if session.user_id:
        return own | ((Memory.scope == "user") & (Memory.user_id == session.user_id))
    return own


async def list_memories(
    db: AsyncSession, session: Session, *, include_superseded: bool
) -> list[Memory]:
    statuses = ["active", "superseded"] if include_superseded else ["active"]
    query = (
        select(Memory)
        .where(
            Memory.tenant_id == session.tenant_id, _visible(session), Memory.status.in_(statuses)
        )
        .order_by(Memory.created_at, Memory.version)
    )
    return list((await db.execute(query)).scalars())


async def owner_memories(
    db: AsyncSession, session: Session, scope: str, key: str | None
) -> list[Memory]:
    """Active items of one owner (the session, or the session's user) — with `key`, of that key."""
    owner = (
        (Memory.scope == "user") & (Memory.user_id == session.user_id)
        if scope == "user"
        else (Memory.scope == "session") & (Memory.session_id == session.id)
    )
    query = select(Memory).where(
        Memory.tenant_id == session.tenant_id, owner, Memory.status == "active"
    )
    if key is not None:
        query = query.where(Memory.key == key)
    return list((await db.execute(query.order_by(Memory.created_at))).scalars())


async def visible_memory(db: AsyncSession, session: Session, memory_id: uuid.UUID) -> Memory | None:
    query = select(Memory).where(
        Memory.id == memory_id,
        Memory.tenant_id == session.tenant_id,
        _visible(session),
        Memory.status.in_(["active", "superseded"]),
    )
    return (await db.execute(query)).scalar_one_or_none()


async def visible_memory_ids(db: AsyncSession, session: Session) -> list[uuid.UUID]:
    query = select(Memory.id).where(
        Memory.tenant_id == session.tenant_id,
        _visible(session),
        Memory.status.in_(["active", "superseded"]),
    )
    return list((await db.execute(query)).scalars().all())


async def active_chunk_ids(db: AsyncSession, session_pk: uuid.UUID) -> list[uuid.UUID]:
    query = select(Chunk.id).where(Chunk.session_id == session_pk, Chunk.status == "active")
    return list((await db.execute(query)).scalars().all())


async def insert_memory(db: AsyncSession, values: dict[str, Any], lexical_source: str) -> Memory:
    memory = Memory(**values, lexical=func.to_tsvector("simple", lexical_source))
    db.add(memory)
    await db.flush()
    await db.refresh(memory)
    return memory


async def memories_to_embed(
    db: AsyncSession, memory_ids: Sequence[uuid.UUID] | None, model: str, limit: int
) -> list[Memory]:
    """Active items lacking an embedding of `model` (all of them when `memory_ids` is None)."""
    query = (
        select(Memory)
        .where(
            Memory.status == "active",
            Memory.text != "",
            (Memory.embedding.is_(None)) | (Memory.embedding_model != model),
        )
        .order_by(Memory.created_at)
        .limit(limit)
    )
    if memory_ids is not None:
        query = query.where(Memory.id.in_(list(memory_ids)))
    return list((await db.execute(query)).scalars().all())


async def store_memory_embedding(
    db: AsyncSession, memory_id: uuid.UUID, embedding: list[float], model: str
) -> None:
    await db.execute(
        update(Memory)
        .where(Memory.id == memory_id, Memory.status == "active")
        .values(embedding=embedding, embedding_model=model)
    )


async def count_memory_embed_failure(db: AsyncSession, memory_ids: Sequence[uuid.UUID]) -> None:
    await db.execute(
        update(Memory)
        .where(Memory.id.in_(list(memory_ids)))
        .values(embed_attempts=Memory.embed_attempts + 1)
    )


async def active_visible_memories(
    db: AsyncSession, session: Session, *, user_scope_only: bool = False
) -> list[Memory]:
    """Active items the session sees (its own and its user's), oldest first; with
    `user_scope_only`, only its user's user-scope items."""
    visible = (
        (Memory.scope == "user") & (Memory.user_id == session.user_id)
        if user_scope_only
        else _visible(session)
    )
    query = (
        select(Memory)
        .where(Memory.tenant_id == session.tenant_id, Memory.status == "active", visible)
        .order_by(Memory.created_at)
    )
    return list((await db.execute(query)).scalars().all())


async def nearest_memories(
    db: AsyncSession,
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
            WHERE id = ANY(:ids) AND status = 'active' AND embedding_model = :model
            ORDER BY distance LIMIT :limit
            """
        ),
        {"ids": list(memory_ids), "model": model, "vector": vector_literal(vector), "limit": limit},
    )
    return {str(mid): 1.0 - float(dist) for mid, dist in rows}


async def set_memory_status(db: AsyncSession, memory_ids: Sequence[uuid.UUID], status: str) -> None:
    if memory_ids:
        await db.execute(update(Memory).where(Memory.id.in_(memory_ids)).values(status=status))


async def memories_written_since(db: AsyncSession, session_pk: uuid.UUID, since: datetime) -> int:
    """Rate-limit fallback when Redis is down: items this session wrote in the window."""
    query = select(func.count()).where(
        Memory.session_id == session_pk, Memory.created_at >= since, Memory.source == "memory"
    )
    return int((await db.execute(query)).scalar_one())


# --- forget: tombstones --------------------------------------------------------------------------


async def get_chunk(db: AsyncSession, session_pk: uuid.UUID, chunk_id: uuid.UUID) -> Chunk | None:
    query = select(Chunk).where(Chunk.session_id == session_pk, Chunk.id == chunk_id)
    return (await db.execute(query)).scalar_one_or_none()


async def live_turns(db: AsyncSession, session_pk: uuid.UUID, first: int, last: int) -> list[Turn]:
    query = (
        select(Turn)
        .where(
            Turn.session_id == session_pk,
            Turn.seq.between(first, last),
            Turn.forgotten_at.is_(None),
        )
        .order_by(Turn.seq)
    )
    return list((await db.execute(query)).scalars())


async def chunks_overlapping(
    db: AsyncSession, session_pk: uuid.UUID, first: int, last: int
) -> list[Chunk]:
    query = (
        select(Chunk)
        .where(
            Chunk.session_id == session_pk,
            Chunk.status == "active",
            Chunk.turn_first <= last,
            Chunk.turn_last >= first,
        )
        .order_by(Chunk.turn_first, Chunk.part)
    )
    return list((await db.execute(query)).scalars())


async def forget_turns(db: AsyncSession, turn_ids: Sequence[int], now: datetime) -> None:
    if turn_ids:
        await db.execute(update(Turn).where(Turn.id.in_(turn_ids)).values(forgotten_at=now))


async def tombstone_chunks(db: AsyncSession, chunk_ids: Sequence[uuid.UUID]) -> None:
    if chunk_ids:
        await db.execute(update(Chunk).where(Chunk.id.in_(chunk_ids)).values(status="tombstoned"))


async def reassign_turns(
    db: AsyncSession, session_pk: uuid.UUID, chunk_id: uuid.UUID, first: int, last: int
) -> None:
    await db.execute(
        update(Turn)
        .where(
            Turn.session_id == session_pk,
            Turn.seq.between(first, last),
            Turn.forgotten_at.is_(None),
            Turn.chunk_id.is_not(None),
        )
        .values(chunk_id=chunk_id)
    )


async def rename_session(db: AsyncSession, session_pk: uuid.UUID, tombstone_name: str) -> None:
    """Tombstone a whole session: an external id no client can name, so every read is a 404."""
    await db.execute(
        update(Session).where(Session.id == session_pk).values(external_id=tombstone_name)
    )


async def tombstone_session_rows(db: AsyncSession, session_pk: uuid.UUID, now: datetime) -> None:
    await db.execute(
        update(Turn)
        .where(Turn.session_id == session_pk, Turn.forgotten_at.is_(None))
        .values(forgotten_at=now)
    )
    await db.execute(
        update(Chunk)
        .where(Chunk.session_id == session_pk, Chunk.status == "active")
        .values(status="tombstoned")
    )
    # Includes user-scope items this session wrote: they leave the user's other sessions now.
    await db.execute(
        update(Memory)
        .where(Memory.session_id == session_pk, Memory.status.in_(["active", "superseded"]))
        .values(status="tombstoned")
    )


# --- erase ---------------------------------------------------------------------------------------


async def erase_turns(db: AsyncSession, session_pk: uuid.UUID) -> tuple[int, list[str]]:
    """Blank forgotten turns; returns the count and their former texts (to hunt cached copies)."""
    rows = await db.execute(
        select(Turn.content).where(
            Turn.session_id == session_pk, Turn.forgotten_at.is_not(None), Turn.content != ""
        )
    )
    texts = [t for t in rows.scalars() if t]
    result = await db.execute(
        update(Turn)
        .where(
            Turn.session_id == session_pk,
            Turn.forgotten_at.is_not(None),
            or_(
                Turn.content != "",
                Turn.tool_calls.is_not(None),
                Turn.name.is_not(None),
                cast(Turn.metadata_, String) != "{}",
            ),
        )
        .values(content="", tool_calls=None, name=None, metadata_={})
    )
    return int(result.rowcount or 0), texts  # type: ignore[attr-defined]


async def erase_chunks(db: AsyncSession, session_pk: uuid.UUID) -> tuple[int, int, list[str]]:
    """Tombstoned chunks lose text, terms, tsvector and embedding; (chunks, embeddings, texts)."""
    rows = await db.execute(
        select(Chunk.raw_text, Chunk.embedding.is_not(None)).where(
            Chunk.session_id == session_pk, Chunk.status == "tombstoned"
        )
    )
    found = list(rows)
    result = await db.execute(
        update(Chunk)
        .where(Chunk.session_id == session_pk, Chunk.status == "tombstoned")
        .values(
            raw_text="",
            summary_hint="",
            term_counts={},
            term_total=0,
            lexical=func.to_tsvector("simple", ""),
            embedding=None,
            embedding_model=None,
            status="erased",
        )
    )
    embeddings = sum(1 for _, had in found if had)
    return int(result.rowcount or 0), embeddings, [t for t, _ in found if t]  # type: ignore[attr-defined]


async def erase_memories(
    db: AsyncSession, memory_ids: Sequence[uuid.UUID]
) -> tuple[int, list[str]]:
    if not memory_ids:
        return 0, []
    rows = await db.execute(
        select(Memory.text).where(Memory.id.in_(memory_ids), Memory.status == "tombstoned")
    )
    texts = [t for t in rows.scalars() if t]
    result = await db.execute(
        update(Memory)
        .where(Memory.id.in_(memory_ids), Memory.status == "tombstoned")
        .values(
            text="",
            tags=[],
            key=None,
            lexical=func.to_tsvector("simple", ""),
            embedding=None,
            embedding_model=None,
            status="erased",
        )
    )
    return int(result.rowcount or 0), texts  # type: ignore[attr-defined]


async def session_memory_texts(db: AsyncSession, session_pk: uuid.UUID) -> list[str]:
    rows = await db.execute(select(Memory.text).where(Memory.session_id == session_pk))
    return [t for t in rows.scalars() if t]


async def delete_prompt_builds(db: AsyncSession, session_pk: uuid.UUID, needles: list[str]) -> int:
    """Stored build manifests of the session that quote any erased text or id."""
    if not needles:
        return 0
    result = await db.execute(
        delete(PromptBuild).where(
            PromptBuild.session_id == session_pk,
            or_(*(cast(PromptBuild.record, String).contains(n) for n in needles)),
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def scratchpad(db: AsyncSession, session_pk: uuid.UUID) -> Scratchpad | None:
    return await db.get(Scratchpad, session_pk, populate_existing=True)


async def delete_session_row(db: AsyncSession, session_pk: uuid.UUID) -> dict[str, int]:
    """Delete the session and (by cascade) its turns, chunks, notes, memories and metrics."""
    counts: dict[str, int] = {}
    for name, model in (("turns", Turn), ("chunks", Chunk), ("memories", Memory)):
        found = await db.execute(
            select(func.count()).select_from(model).where(model.session_id == session_pk)  # type: ignore[attr-defined]
        )
        counts[name] = int(found.scalar_one())
    embeddings = await db.execute(
        select(func.count()).where(Chunk.session_id == session_pk, Chunk.embedding.is_not(None))
    )
    counts["embeddings"] = int(embeddings.scalar_one())
    await db.execute(delete(Session).where(Session.id == session_pk))
    return counts


# --- receipts ------------------------------------------------------------------------------------


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
    db: AsyncSession, receipt_id: uuid.UUID, tenant_id: uuid.UUID | None = None
) -> EraseReceipt | None:
    query = select(EraseReceipt).where(EraseReceipt.id == receipt_id)
    if tenant_id is not None:
        query = query.where(EraseReceipt.tenant_id == tenant_id)
    return (
        await db.execute(query.with_for_update() if tenant_id is None else query)
    ).scalar_one_or_none()


async def count_attempt(db: AsyncSession, receipt_id: uuid.UUID) -> None:
    await db.execute(
        update(EraseReceipt)
        .where(EraseReceipt.id == receipt_id)
        .values(attempts=EraseReceipt.attempts + 1)
    )


async def complete_receipt(
    db: AsyncSession, receipt_id: uuid.UUID, stores: dict[str, Any], now: datetime
) -> None:
    await db.execute(
        update(EraseReceipt)
        .where(EraseReceipt.id == receipt_id)
        .values(stores=stores, status="completed", completed_at=now)
    )


def window_start(now: datetime, seconds: int) -> datetime:
    return now - timedelta(seconds=seconds)
