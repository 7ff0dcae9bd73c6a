"""Rows that lack a vector of the deployment's embedding model, for chunks and for remembered
items alike: a `Backlog` says which table and which of its rows, and `pending`, `never_embedded`,
`count_pending`, `store_vector` and `count_failure` read and write any of them. A statement that
names rows by id names their tenant too (`TenantRows`)."""

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.models import MEMORY_LIVE, Chunk, Memory

Row = TypeVar("Row", Chunk, Memory)


@dataclass(frozen=True)
class Backlog(Generic[Row]):
    """A table whose rows get a vector of the deployment's model in the background."""

    table: type[Row]
    live: Any  # which rows may still be embedded
    lacks: Callable[[str], Any]  # rows lacking a vector of model m


class TenantRows(NamedTuple):
    """Rows of one tenant, by id: what an embedding job names (one session's chunks, or the
    remembered items one write made)."""

    tenant_id: uuid.UUID
    ids: Sequence[uuid.UUID]


# The two tables test "lacks a vector" differently (`is_distinct_from` vs `!=`): they differ only
# for a row with a vector and no model. Remembered items erased keep an empty text.
CHUNKS: Backlog[Chunk] = Backlog(
    Chunk,
    Chunk.status == "active",
    lambda model: Chunk.embedding.is_(None) | Chunk.embedding_model.is_distinct_from(model),
)
MEMORIES: Backlog[Memory] = Backlog(
    Memory,
    Memory.status.in_(MEMORY_LIVE) & (Memory.text != ""),
    lambda model: (Memory.embedding.is_(None)) | (Memory.embedding_model != model),
)


async def pending(
    db: AsyncSession,
    backlog: Backlog[Row],
    rows: TenantRows | None,
    model: str,
    limit: int,
) -> list[Row]:
    """Live rows among `rows` lacking an embedding of `model`, oldest first; with `rows` None,
    every tenant's (the sweep's and `contextd reembed`'s read, no lock taken)."""
    table = backlog.table
    query = (
        select(table)
        .where(backlog.live, backlog.lacks(model))
        .order_by(table.created_at)
        .limit(limit)
    )
    if rows is not None:
        query = query.where(table.tenant_id == rows.tenant_id, table.id.in_(list(rows.ids)))
    return list((await db.execute(query)).scalars().all())


async def never_embedded(db: AsyncSession, backlog: Backlog[Row], limit: int) -> list[Row]:
    """Live rows with no vector at all, oldest first: what the sweep re-queues when their embed
    job failed for good. Rows holding another model's vector are left to `contextd reembed`.
    For chunks the condition is the partial index `ix_chunks_unembedded`'s, so the read costs
    the backlog's size, not the table's."""
    table = backlog.table
    query = (
        select(table)
        .where(backlog.live, table.embedding.is_(None))
        .order_by(table.created_at)
        .limit(limit)
    )
    return list((await db.execute(query)).scalars().all())


async def count_pending(db: AsyncSession, backlog: Backlog[Row], model: str) -> int:
    query = select(func.count()).where(backlog.live, backlog.lacks(model))
    return int((await db.execute(query)).scalar_one())


async def store_vector(
    db: AsyncSession,
    backlog: Backlog[Row],
    tenant_id: uuid.UUID,
    row_id: uuid.UUID,
    vector: list[float],
    model: str,
) -> None:
    """Store the row's vector, only while the row is still active (an erased row keeps none)."""
    table = backlog.table
    await db.execute(
        update(table)
        .where(table.tenant_id == tenant_id, table.id == row_id, backlog.live)
        .values(embedding=vector, embedding_model=model)
    )


async def count_failure(db: AsyncSession, backlog: Backlog[Row], rows: TenantRows) -> None:
    table = backlog.table
    await db.execute(
        update(table)
        .where(table.tenant_id == rows.tenant_id, table.id.in_(list(rows.ids)))
        .values(embed_attempts=table.embed_attempts + 1)
    )


def _grouped(pairs: Iterable[tuple[uuid.UUID, uuid.UUID]]) -> list[TenantRows]:
    """(tenant, row id) pairs as rows by tenant, in the order each tenant first appears."""
    grouped: dict[uuid.UUID, list[uuid.UUID]] = {}
    for tenant, row_id in pairs:
        grouped.setdefault(tenant, []).append(row_id)
    return [TenantRows(tenant, ids) for tenant, ids in grouped.items()]


def by_tenant(found: Sequence[Row]) -> list[TenantRows]:
    """Rows read across tenants (`pending` without `rows`, `never_embedded`), by tenant."""
    return _grouped((row.tenant_id, row.id) for row in found)


async def tenants_of(
    db: AsyncSession, backlog: Backlog[Row], ids: Sequence[uuid.UUID]
) -> list[TenantRows]:
    """The rows of `ids` that still exist, grouped by tenant, read by their ids alone: only for
    an embedding job queued by a version before jobs carried the tenant (a rolling upgrade),
    whose ids may even span tenants (the items' sweep queued one job for all). On a database
    distributed by tenant this asks every node."""
    table = backlog.table
    query = select(table.tenant_id, table.id).where(table.id.in_(list(ids))).order_by(table.id)
    return _grouped((tenant, row_id) for tenant, row_id in (await db.execute(query)).all())
