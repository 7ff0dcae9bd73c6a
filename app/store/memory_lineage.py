"""SQL of the lineage of remembered items: those a session wrote from some of its turns (their
`turn_seqs`) or from a tool's results (`source_tool`), which a revocation of that source takes
with it (`app.erasure`), and the user's items the session's turns vouch for (their `evidence`).
Beside `app.store.memories`, which holds the rest of the table's SQL."""

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, cast, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.memories import Change, record_versions
from app.store.models import MEMORY_HELD, MEMORY_LIVE, Memory

DERIVED_FORGOTTEN = Change("agent", None, "the turns it was read in were forgotten")
SOURCE_UNTRUSTED = Change("api_key", None, "its source was marked untrusted")


def _derived_from(
    tenant_id: uuid.UUID, session_pk: uuid.UUID, seqs: Sequence[int], tool: str | None
) -> Any:
    """Items the session wrote from any of `seqs` (their `turn_seqs`) or from `tool`'s results."""
    derived = Memory.turn_seqs.overlap(cast(list(seqs), ARRAY(BigInteger)))
    if tool is not None:
        derived = derived | (Memory.source_tool == tool)
    return (Memory.tenant_id == tenant_id) & (Memory.session_id == session_pk) & derived


async def tombstone_derived_memories(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    seqs: Sequence[int],
    change: Change,
) -> list[uuid.UUID]:
    """Tombstone the items the session wrote from any of the turns `seqs`; returns their ids."""
    if not seqs:
        return []
    result = await db.execute(
        update(Memory)
        .where(_derived_from(tenant_id, session_pk, seqs, None), Memory.status.in_(MEMORY_HELD))
        .values(status="tombstoned", revision=Memory.revision + 1)
        .returning(Memory.id)
    )
    tombstoned = sorted(result.scalars().all())
    await record_versions(db, tenant_id, tombstoned, change)
    return tombstoned


async def quarantine_derived_memories(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    seqs: Sequence[int],
    tool: str | None,
    change: Change,
) -> list[uuid.UUID]:
    """Quarantine the live items the session wrote from the turns `seqs` or from `tool`'s
    results (they leave the prompt; an explicit recall shows them as unconfirmed)."""
    result = await db.execute(
        update(Memory)
        .where(
            _derived_from(tenant_id, session_pk, seqs, tool),
            Memory.status.in_(MEMORY_LIVE),
            Memory.status != "quarantined",
        )
        .values(status="quarantined", trusted=False, revision=Memory.revision + 1)
        .returning(Memory.id)
    )
    quarantined = sorted(result.scalars().all())
    await record_versions(db, tenant_id, quarantined, change)
    return quarantined


async def items_seen_in(
    db: AsyncSession, tenant_id: uuid.UUID, user_id: str, session_pk: uuid.UUID
) -> list[Memory]:
    """The user's held items with evidence from the session (held by it or by another of the
    user's sessions), locked for update, in id order."""
    query = (
        select(Memory)
        .where(
            Memory.tenant_id == tenant_id,
            Memory.user_id == user_id,
            Memory.scope == "user",
            Memory.status.in_(MEMORY_HELD),
            Memory.evidence.contains([{"session": str(session_pk)}]),
        )
        .order_by(Memory.id)
        .with_for_update()
    )
    return list((await db.execute(query)).scalars())
