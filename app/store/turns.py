"""SQL for turns and idempotency records: appends, the build's one-statement read of a session
and its window, the offloaded tail, turns of chunks, forget and erase of turn text."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import (
    String,
    cast,
    column,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import true as sa_true
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import driver_connection
from app.domain.records import TurnRecord
from app.domain.tool_groups import ToolCallTally
from app.store.models import IdempotencyRecord, Session, Turn


async def insert_turns(db: AsyncSession, rows: Sequence[dict[str, Any]]) -> list[Turn]:
    result = await db.execute(insert(Turn).returning(Turn), list(rows))
    return list(result.scalars().all())


async def tool_call_tallies(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, ids: Sequence[str]
) -> dict[str, ToolCallTally]:
    """For each of `ids` the session's live (not forgotten) turns issued or answered: how many
    calls and results carry it, in one statement."""
    if not ids:
        return {}
    calls = (
        func.jsonb_array_elements(Turn.tool_calls)
        .table_valued(column("value", JSONB))
        .render_derived(name="call")
    )
    issued = (
        select(calls.c.value["id"].astext.label("id"), literal(1).label("calls"), literal(0))
        .select_from(Turn)
        .join(calls, sa_true())
        .where(
            Turn.tenant_id == tenant_id,
            Turn.session_id == session_pk,
            Turn.tool_calls.is_not(None),
            Turn.forgotten_at.is_(None),
            calls.c.value["id"].astext.in_(list(ids)),
        )
    )
    answered = select(Turn.tool_call_id, literal(0), literal(1)).where(
        Turn.tenant_id == tenant_id,
        Turn.session_id == session_pk,
        Turn.role == "tool",
        Turn.tool_call_id.in_(list(ids)),
        Turn.forgotten_at.is_(None),
    )
    both = union_all(issued, answered).subquery()
    id_, n_calls, n_results = both.c
    query = select(id_, func.sum(n_calls), func.sum(n_results)).group_by(id_)
    rows = (await db.execute(query)).all()
    return {str(i): ToolCallTally(int(c), int(r)) for i, c, r in rows}


async def list_turns(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    *,
    after_seq: int,
    limit: int,
    role: str | None,
) -> list[Turn]:
    query = (
        select(Turn)
        .where(
            Turn.tenant_id == tenant_id,
            Turn.session_id == session_pk,
            Turn.seq > after_seq,
            Turn.forgotten_at.is_(None),
        )
        .order_by(Turn.seq)
        .limit(limit)
    )
    if role is not None:
        query = query.where(Turn.role == role)
    return list((await db.execute(query)).scalars().all())


_RECORD_COLUMNS = (
    Turn.seq,
    Turn.role,
    Turn.content,
    Turn.token_count,
    Turn.created_at,
    Turn.name,
    Turn.tool_calls,
    Turn.tool_call_id,
    Turn.metadata_,
)
# What a `TurnRecord` is read from, in its fields' order (`quarantined` last).
_RECORD_SELECT = (
    ", ".join(column.name for column in _RECORD_COLUMNS) + ", quarantined_at IS NOT NULL"
)

_WINDOW = (
    "SELECT "
    + _RECORD_SELECT
    + " FROM turns WHERE tenant_id = %(tenant)s AND session_id = %(session)s "
    "AND chunk_id IS NULL AND forgotten_at IS NULL "
    "ORDER BY seq"
)  # run by the driver itself: psycopg's placeholders


async def window_turns(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> list[TurnRecord]:
    """C1: turns not yet offloaded nor forgotten, in order, read in `db`'s transaction by the
    driver itself (every build that writes and every offload reads the whole window: SQLAlchemy's
    result processing cost more than the read, 10,000 turns ~0.3 s)."""
    await db.flush()  # what the ORM holds back is part of the transaction's state
    driver = await driver_connection(await db.connection())
    cursor = await driver.execute(_WINDOW, {"tenant": tenant_id, "session": session_pk})
    return [TurnRecord(*row) for row in await cursor.fetchall()]


# The session row and its window (C1) in one statement: what a build that writes nothing reads.
_SESSION_COLUMNS = tuple(c.name for c in Session.__table__.columns)


_SESSION_WITH_WINDOW = (
    "SELECT "
    + ", ".join(f"s.{name}" for name in _SESSION_COLUMNS)
    + ", CASE WHEN s.id = %(kept_id)s AND s.version = %(kept_version)s THEN NULL ELSE "
    "(SELECT coalesce(json_agg(json_build_array(t.seq, t.role, t.content, t.token_count, "
    "t.created_at, t.name, t.tool_calls, t.tool_call_id, t.metadata, "
    "t.quarantined_at IS NOT NULL) "
    "ORDER BY t.seq), '[]') "
    "FROM turns t WHERE t.session_id = s.id AND t.tenant_id = s.tenant_id AND t.chunk_id IS NULL "
    "AND t.forgotten_at IS NULL) "
    "END FROM sessions s WHERE s.tenant_id = %(tenant)s AND s.external_id = %(external)s"
)  # run by the driver itself (`read_once`): psycopg's placeholders


_SESSION_ATTRIBUTES = tuple(
    Session.__mapper__.get_property_by_column(c).key for c in Session.__table__.columns
)


@dataclass(frozen=True)
class SessionWindow:
    """A session row (detached: read, never written through) and its window, read together."""

    session: Session
    window: list[TurnRecord]


async def session_with_window(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: uuid.UUID,
    external_id: str,
    kept: SessionWindow | None = None,
) -> SessionWindow | None:
    """The session and `window_turns` in one statement (one round trip, one snapshot).

    `kept`: this session as read before. Its window is not read again while the session row is
    the same row at the same version: every change of the window (append, offload, forget)
    bumps the version in its own transaction (`update_session`), and a session deleted and
    created again under the same external id is another row."""
    params = {
        "tenant": tenant_id,
        "external": external_id,
        "kept_id": None if kept is None else kept.session.id,
        "kept_version": None if kept is None else kept.session.version,
    }
    row = await (await conn.execute(_SESSION_WITH_WINDOW, params)).fetchone()
    if row is None:
        return None
    # Filled as SQLAlchemy's loader fills an instance (the constructor records every attribute
    # as a change to flush, ~15x the time; this row is never written through).
    session = Session.__mapper__.class_manager.new_instance()
    session.__dict__.update(zip(_SESSION_ATTRIBUTES, row[:-1], strict=True))
    if row[-1] is None:
        assert kept is not None  # the window is left out only for the kept row and version
        return SessionWindow(session, list(kept.window))
    window = [
        TurnRecord(seq, role, text, tokens, datetime.fromisoformat(at), *rest)
        for seq, role, text, tokens, at, *rest in row[-1]
    ]
    return SessionWindow(session, window)


_OFFLOADED_TAIL = (
    "SELECT "
    + _RECORD_SELECT
    + ", chunk_id FROM (SELECT *, sum(token_count) OVER (ORDER BY seq DESC) AS newer "
    "FROM turns WHERE tenant_id = %(tenant)s AND session_id = %(session)s "
    "AND chunk_id IS NOT NULL AND forgotten_at IS NULL "
    "AND seq < %(before)s ORDER BY seq DESC LIMIT %(turns)s) t "
    "WHERE newer - token_count < %(tokens)s ORDER BY seq"
)  # run by the driver itself (`read_once`): psycopg's placeholders


async def offloaded_tail(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    *,
    before: int,
    tokens: int,
    turns: int,
) -> list[tuple[TurnRecord, str]]:
    """The newest offloaded live turns before seq `before`, in seq order, with their chunk ids:
    at most `turns` of them, and only as many as start within `tokens` of the newest (what a
    build may still show before its window)."""
    cursor = await conn.execute(
        _OFFLOADED_TAIL,
        {
            "tenant": tenant_id,
            "session": session_pk,
            "before": before,
            "tokens": tokens,
            "turns": turns,
        },
    )
    return [(TurnRecord(*row[:-1]), str(row[-1])) for row in await cursor.fetchall()]


async def offloaded_turns(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, after_seq: int
) -> list[Turn]:
    """Live turns already moved into chunks, after `after_seq`, in order (what notes read): a
    quarantined turn is left out, nothing may be derived from it."""
    query = (
        select(Turn)
        .where(
            Turn.tenant_id == tenant_id,
            Turn.session_id == session_pk,
            Turn.seq > after_seq,
            Turn.chunk_id.is_not(None),
            Turn.forgotten_at.is_(None),
            Turn.quarantined_at.is_(None),
        )
        .order_by(Turn.seq)
    )
    return list((await db.execute(query)).scalars().all())


async def live_turns(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, first: int, last: int
) -> list[Turn]:
    """Turns `first..last` not forgotten, in the window or offloaded, in order."""
    query = (
        select(Turn)
        .where(
            Turn.tenant_id == tenant_id,
            Turn.session_id == session_pk,
            Turn.seq.between(first, last),
            Turn.forgotten_at.is_(None),
        )
        .order_by(Turn.seq)
    )
    return list((await db.execute(query)).scalars())


_TURNS_OF_CHUNKS = (
    "SELECT chunk_id, "
    + _RECORD_SELECT
    + " FROM turns WHERE tenant_id = %(tenant)s AND session_id = %(session)s "
    "AND chunk_id = ANY(CAST(%(chunks)s AS uuid[])) "
    "AND forgotten_at IS NULL ORDER BY seq"
)  # run by the driver itself (`read_once`): psycopg's placeholders


async def turns_of_chunks(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    chunk_ids: Sequence[str],
) -> dict[str, list[TurnRecord]]:
    """The live turns each chunk covers, in seq order (recall shows a chunk's best turns), as
    plain records."""
    if not chunk_ids:
        return {}
    cursor = await conn.execute(
        _TURNS_OF_CHUNKS,
        {"tenant": tenant_id, "session": session_pk, "chunks": list(chunk_ids)},
    )
    out: dict[str, list[TurnRecord]] = {}
    for chunk_id, *record in await cursor.fetchall():
        out.setdefault(str(chunk_id), []).append(TurnRecord(*record))
    return out


async def assign_turns(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    ranges: Sequence[tuple[uuid.UUID, int, int]],
) -> int:
    """Mark the live turns of each (chunk id, seq_first, seq_last) range as covered by that chunk
    (an offload moving them out of the window, or a re-chunk after forget), in one statement.
    Returns the rows marked."""
    if not ranges:
        return 0
    # One (chunk, seq) pair per turn: an equality join PostgreSQL hashes, where a join on
    # `seq BETWEEN first AND last` compares every turn of the session with every range.
    chunk_ids = [chunk for chunk, first, last in ranges for _ in range(first, last + 1)]
    seqs = [seq for _, first, last in ranges for seq in range(first, last + 1)]
    result = await db.execute(
        text(
            "UPDATE turns SET chunk_id = r.chunk_id "
            "FROM unnest(CAST(:chunk_ids AS uuid[]), CAST(:seqs AS bigint[])) AS r(chunk_id, seq) "
            "WHERE turns.tenant_id = :tenant AND turns.session_id = :session AND turns.seq = r.seq "
            "AND turns.forgotten_at IS NULL"
        ),
        {"tenant": tenant_id, "session": session_pk, "chunk_ids": chunk_ids, "seqs": seqs},
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def forget_turns(
    db: AsyncSession, tenant_id: uuid.UUID, turn_ids: Sequence[int], now: datetime
) -> None:
    if turn_ids:
        await db.execute(
            update(Turn)
            .where(Turn.tenant_id == tenant_id, Turn.id.in_(turn_ids))
            .values(forgotten_at=now)
        )


async def forget_session_turns(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, now: datetime
) -> None:
    await db.execute(
        update(Turn)
        .where(
            Turn.tenant_id == tenant_id, Turn.session_id == session_pk, Turn.forgotten_at.is_(None)
        )
        .values(forgotten_at=now)
    )


async def quarantine_turns(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    seqs: Sequence[int],
    now: datetime,
) -> list[int]:
    """Mark live turns of `seqs` untrusted and quarantined; returns the seqs newly marked."""
    if not seqs:
        return []
    result = await db.execute(
        update(Turn)
        .where(
            Turn.tenant_id == tenant_id,
            Turn.session_id == session_pk,
            Turn.seq.in_(seqs),
            Turn.forgotten_at.is_(None),
            Turn.quarantined_at.is_(None),
        )
        .values(trusted=False, quarantined_at=now)
        .returning(Turn.seq)
    )
    return sorted(result.scalars())


async def erase_turns(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> tuple[int, list[str]]:
    """Blank forgotten turns; returns the count and their former texts (to hunt cached copies)."""
    rows = await db.execute(
        select(Turn.content).where(
            Turn.tenant_id == tenant_id,
            Turn.session_id == session_pk,
            Turn.forgotten_at.is_not(None),
            Turn.content != "",
        )
    )
    texts = [t for t in rows.scalars() if t]
    result = await db.execute(
        update(Turn)
        .where(
            Turn.tenant_id == tenant_id,
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


async def session_turn_texts(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> tuple[int, list[str]]:
    """(turns, their texts) of a session about to be deleted (to hunt cached copies)."""
    query = select(Turn.content).where(Turn.tenant_id == tenant_id, Turn.session_id == session_pk)
    texts = list((await db.execute(query)).scalars())
    return len(texts), [t for t in texts if t]


async def claim_idempotency_key(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    key: str,
    request_hash: str,
    lifetime: timedelta,
) -> IdempotencyRecord | None:
    """Claim `key` for this transaction. Returns the earlier record when the key was used within
    `lifetime`; a record older than that is claimed again, as if the key were new.

    A concurrent claim of the same key waits on the unique index until the first transaction
    ends, then sees its committed record: a replay never writes twice.
    """
    record = IdempotencyRecord.__table__
    claim = insert(IdempotencyRecord).values(
        tenant_id=tenant_id, session_id=session_pk, key=key, request_hash=request_hash
    )
    claimed = await db.execute(
        claim.on_conflict_do_update(
            index_elements=[record.c.tenant_id, record.c.session_id, record.c.key],
            set_={
                "request_hash": request_hash,
                "status_code": None,
                "response": None,
                "created_at": func.now(),
            },
            where=record.c.created_at < func.now() - lifetime,
        ).returning(IdempotencyRecord.key)
    )
    if claimed.first() is not None:
        return None
    query = select(IdempotencyRecord).where(
        IdempotencyRecord.tenant_id == tenant_id,
        IdempotencyRecord.session_id == session_pk,
        IdempotencyRecord.key == key,
    )
    return (await db.execute(query)).scalar_one()


async def purge_idempotency_records(db: AsyncSession, lifetime: timedelta, limit: int) -> int:
    """Delete up to `limit` idempotency records older than `lifetime` (oldest first, through
    `ix_idempotency_keys_created`); how many went."""
    expired = (
        select(IdempotencyRecord.tenant_id, IdempotencyRecord.session_id, IdempotencyRecord.key)
        .where(IdempotencyRecord.created_at < func.now() - lifetime)
        .order_by(IdempotencyRecord.created_at)
        .limit(limit)
    )
    record = IdempotencyRecord.__table__
    gone = await db.execute(
        delete(IdempotencyRecord)
        .where(tuple_(record.c.tenant_id, record.c.session_id, record.c.key).in_(expired))
        .returning(IdempotencyRecord.key)
    )
    return len(gone.all())


async def store_idempotent_response(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    key: str,
    status_code: int,
    response: dict[str, Any],
) -> None:
    await db.execute(
        update(IdempotencyRecord)
        .where(
            IdempotencyRecord.tenant_id == tenant_id,
            IdempotencyRecord.session_id == session_pk,
            IdempotencyRecord.key == key,
        )
        .values(status_code=status_code, response=response)
    )


async def turn_timeline(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID
) -> list[tuple[int, Any, int]]:
    """(seq, created_at, token_count) of every turn of a session, in order (no content)."""
    query = (
        select(Turn.seq, Turn.created_at, Turn.token_count)
        .where(Turn.tenant_id == tenant_id, Turn.session_id == session_pk)
        .order_by(Turn.seq)
    )
    return [(int(r[0]), r[1], int(r[2])) for r in (await db.execute(query)).all()]


async def session_text_bytes(db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID) -> int:
    """The bytes of a session's turn texts (what an erase reads, and hunts copies of; its chunks
    hold the same text). PostgreSQL answers a stored text's length without reading it."""
    total = await db.scalar(
        select(func.coalesce(func.sum(func.octet_length(Turn.content)), 0)).where(
            Turn.tenant_id == tenant_id, Turn.session_id == session_pk
        )
    )
    return int(total or 0)


def to_record(turn: Turn) -> TurnRecord:
    return TurnRecord(
        seq=turn.seq,
        role=turn.role,
        content=turn.content,
        token_count=turn.token_count,
        created_at=turn.created_at,
        name=turn.name,
        tool_calls=turn.tool_calls,
        tool_call_id=turn.tool_call_id,
        metadata=turn.metadata_,
        quarantined=turn.quarantined_at is not None,
    )
