"""SQL for sessions, turns and idempotency records: every query of those tables lives here.

Lock order. Every transaction that takes more than one lock takes them in this order, so no two
transactions wait on each other in a cycle (a PostgreSQL deadlock):

1. session rows, `SELECT ... FOR UPDATE` (`lock_session_by_pk`, `lock_or_create_session`), and
   several of them in one statement in primary-key order (`lock_sessions`), never one more
   after rows of step 2 or 3 were written;
2. rows of those sessions: turns, chunks, the scratchpad (notes);
3. remembered items (`memories`), after the session rows that hold them.

Offloads (the worker's, an append's or a build's inline one, the memory tool's), forget and
session / user erase (`app.erasure`), notes writes, remember and the sweep's recount all lock the
session row first. A path that must touch several sessions reads which ones without locks, then
locks them all at once (`lock_sessions`). A deadlock or serialization failure that still happens
is retried (`app.core.db.retrying_transaction`).
"""

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    String,
    cast,
    column,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    table,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import true as sa_true
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import driver_connection
from app.domain.budget import REPLY_PRIMING_TOKENS, BudgetConfig
from app.domain.ids import SESSION_ID_PATTERN
from app.domain.records import TurnRecord
from app.store.models import IdempotencyRecord, Session, Turn

# A deleted session is renamed to this prefix and its primary key at once, then erased by a job:
# outside SESSION_ID_PATTERN, so no request can name it.
TOMBSTONE_PREFIX = "~erasing~"


def erasing(session: Session) -> bool:
    """Whether the session is tombstoned, its rows waiting for the erase job."""
    return session.external_id.startswith(TOMBSTONE_PREFIX)


def _not_erasing() -> ColumnElement[bool]:
    """Sessions not waiting for their erase job: their counters are left as they were when the
    session was tombstoned (its turns forgotten, its chunks tombstoned), so the sweep, which
    recounts and offloads, leaves them alone."""
    return ~Session.external_id.startswith(TOMBSTONE_PREFIX, autoescape=True)


# procrastinate's job table (its schema is procrastinate's, not ours): what the sweep checks.
JOBS = table("procrastinate_jobs", column("queueing_lock"), column("status"))


async def get_session(
    db: AsyncSession, tenant_id: uuid.UUID, external_id: str, *, for_update: bool = False
) -> Session | None:
    query = select(Session).where(
        Session.tenant_id == tenant_id, Session.external_id == external_id
    )
    if for_update:
        # Refresh a copy this unit of work already loaded: values read before the lock may be
        # stale, and counters written from them would drift.
        query = query.with_for_update().execution_options(populate_existing=True)
    return (await db.execute(query)).scalar_one_or_none()


async def lock_or_create_session(
    db: AsyncSession, tenant_id: uuid.UUID, external_id: str
) -> Session:
    """The session row, locked for this transaction; created on first use.

    The row lock serialises writers of one session, which is what makes `seq` gap-free.
    """
    found = await get_session(db, tenant_id, external_id, for_update=True)
    if found is not None:
        return found
    await db.execute(
        insert(Session)
        .values(tenant_id=tenant_id, external_id=external_id)
        .on_conflict_do_nothing(index_elements=["tenant_id", "external_id"])
    )
    created = await get_session(db, tenant_id, external_id, for_update=True)
    assert created is not None
    return created


async def lock_sessions(db: AsyncSession, session_pks: Iterable[uuid.UUID]) -> list[Session]:
    """Several session rows locked in one statement, in primary-key order (the lock order);
    those deleted meanwhile are missing from the answer."""
    query = (
        select(Session)
        .where(Session.id.in_(set(session_pks)))
        .order_by(Session.id)
        .with_for_update()
        .execution_options(populate_existing=True)  # see `get_session`
    )
    return list((await db.execute(query)).scalars().all())


async def lock_session_by_pk(db: AsyncSession, session_pk: uuid.UUID) -> Session | None:
    query = (
        select(Session)
        .where(Session.id == session_pk)
        .with_for_update()
        .execution_options(populate_existing=True)  # see `get_session`
    )
    return (await db.execute(query)).scalar_one_or_none()


async def insert_turns(db: AsyncSession, rows: Sequence[dict[str, Any]]) -> list[Turn]:
    result = await db.execute(insert(Turn).returning(Turn), list(rows))
    return list(result.scalars().all())


@dataclass(frozen=True, slots=True)
class ToolCallTally:
    """How often the session's live turns issued a tool call id, and answered it."""

    calls: int = 0
    results: int = 0


async def tool_call_tallies(
    db: AsyncSession, session_pk: uuid.UUID, ids: Sequence[str]
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
            Turn.session_id == session_pk,
            Turn.tool_calls.is_not(None),
            Turn.forgotten_at.is_(None),
            calls.c.value["id"].astext.in_(list(ids)),
        )
    )
    answered = select(Turn.tool_call_id, literal(0), literal(1)).where(
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
    session_pk: uuid.UUID,
    *,
    after_seq: int,
    limit: int,
    role: str | None,
) -> list[Turn]:
    query = (
        select(Turn)
        .where(Turn.session_id == session_pk, Turn.seq > after_seq, Turn.forgotten_at.is_(None))
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


_WINDOW = (
    "SELECT "
    + ", ".join(column.name for column in _RECORD_COLUMNS)
    + " FROM turns WHERE session_id = %(session)s AND chunk_id IS NULL AND forgotten_at IS NULL "
    "ORDER BY seq"
)  # run by the driver itself: psycopg's placeholders


async def window_turns(db: AsyncSession, session_pk: uuid.UUID) -> list[TurnRecord]:
    """C1: turns not yet offloaded nor forgotten, in order, read in `db`'s transaction by the
    driver itself (every build that writes and every offload reads the whole window: SQLAlchemy's
    result processing cost more than the read, 10,000 turns ~0.3 s)."""
    await db.flush()  # what the ORM holds back is part of the transaction's state
    driver = await driver_connection(await db.connection())
    cursor = await driver.execute(_WINDOW, {"session": session_pk})
    return [TurnRecord(*row) for row in await cursor.fetchall()]


# The session row and its window (C1) in one statement: what a build that writes nothing reads.
_SESSION_COLUMNS = tuple(c.name for c in Session.__table__.columns)
_SESSION_WITH_WINDOW = (
    "SELECT "
    + ", ".join(f"s.{name}" for name in _SESSION_COLUMNS)
    + ", CASE WHEN s.id = %(kept_id)s AND s.version = %(kept_version)s THEN NULL ELSE "
    "(SELECT coalesce(json_agg(json_build_array(t.seq, t.role, t.content, t.token_count, "
    "t.created_at, t.name, t.tool_calls, t.tool_call_id, t.metadata) ORDER BY t.seq), '[]') "
    "FROM turns t WHERE t.session_id = s.id AND t.chunk_id IS NULL AND t.forgotten_at IS NULL) "
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
        TurnRecord(seq, role, content, tokens, datetime.fromisoformat(at), name, calls, call, meta)
        for seq, role, content, tokens, at, name, calls, call, meta in row[-1]
    ]
    return SessionWindow(session, window)


_OFFLOADED_TAIL = (
    "SELECT "
    + ", ".join(column.name for column in _RECORD_COLUMNS)
    + ", chunk_id FROM (SELECT *, sum(token_count) OVER (ORDER BY seq DESC) AS newer "
    "FROM turns WHERE session_id = %(session)s AND chunk_id IS NOT NULL AND forgotten_at IS NULL "
    "AND seq < %(before)s ORDER BY seq DESC LIMIT %(turns)s) t "
    "WHERE newer - token_count < %(tokens)s ORDER BY seq"
)  # run by the driver itself (`read_once`): psycopg's placeholders


async def offloaded_tail(
    conn: psycopg.AsyncConnection[Any],
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
        {"session": session_pk, "before": before, "tokens": tokens, "turns": turns},
    )
    return [(TurnRecord(*row[:-1]), str(row[-1])) for row in await cursor.fetchall()]


async def offloaded_turns(db: AsyncSession, session_pk: uuid.UUID, after_seq: int) -> list[Turn]:
    """Live turns already moved into chunks, after `after_seq`, in order (what notes read)."""
    query = (
        select(Turn)
        .where(
            Turn.session_id == session_pk,
            Turn.seq > after_seq,
            Turn.chunk_id.is_not(None),
            Turn.forgotten_at.is_(None),
        )
        .order_by(Turn.seq)
    )
    return list((await db.execute(query)).scalars().all())


async def live_turns(db: AsyncSession, session_pk: uuid.UUID, first: int, last: int) -> list[Turn]:
    """Turns `first..last` not forgotten, in the window or offloaded, in order."""
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


_TURNS_OF_CHUNKS = (
    "SELECT chunk_id, "
    + ", ".join(column.name for column in _RECORD_COLUMNS)
    + " FROM turns WHERE session_id = %(session)s AND chunk_id = ANY(CAST(%(chunks)s AS uuid[])) "
    "AND forgotten_at IS NULL ORDER BY seq"
)  # run by the driver itself (`read_once`): psycopg's placeholders


async def turns_of_chunks(
    conn: psycopg.AsyncConnection[Any], session_pk: uuid.UUID, chunk_ids: Sequence[str]
) -> dict[str, list[TurnRecord]]:
    """The live turns each chunk covers, in seq order (recall shows a chunk's best turns), as
    plain records."""
    if not chunk_ids:
        return {}
    cursor = await conn.execute(
        _TURNS_OF_CHUNKS, {"session": session_pk, "chunks": list(chunk_ids)}
    )
    out: dict[str, list[TurnRecord]] = {}
    for chunk_id, *record in await cursor.fetchall():
        out.setdefault(str(chunk_id), []).append(TurnRecord(*record))
    return out


async def assign_turns(
    db: AsyncSession, session_pk: uuid.UUID, ranges: Sequence[tuple[uuid.UUID, int, int]]
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
            "WHERE turns.session_id = :session AND turns.seq = r.seq "
            "AND turns.forgotten_at IS NULL"
        ),
        {"session": session_pk, "chunk_ids": chunk_ids, "seqs": seqs},
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def forget_turns(db: AsyncSession, turn_ids: Sequence[int], now: datetime) -> None:
    if turn_ids:
        await db.execute(update(Turn).where(Turn.id.in_(turn_ids)).values(forgotten_at=now))


async def forget_session_turns(db: AsyncSession, session_pk: uuid.UUID, now: datetime) -> None:
    await db.execute(
        update(Turn)
        .where(Turn.session_id == session_pk, Turn.forgotten_at.is_(None))
        .values(forgotten_at=now)
    )


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


async def session_turn_texts(db: AsyncSession, session_pk: uuid.UUID) -> tuple[int, list[str]]:
    """(turns, their texts) of a session about to be deleted (to hunt cached copies)."""
    query = select(Turn.content).where(Turn.session_id == session_pk)
    texts = list((await db.execute(query)).scalars())
    return len(texts), [t for t in texts if t]


async def user_session_ids(
    db: AsyncSession, tenant_id: uuid.UUID, user_id: str, limit: int
) -> list[uuid.UUID]:
    """A user's sessions, most recently changed first."""
    rows = await db.execute(
        select(Session.id)
        .where(Session.tenant_id == tenant_id, Session.user_id == user_id)
        .order_by(Session.updated_at.desc())
        .limit(limit)
    )
    return list(rows.scalars())


async def update_session(db: AsyncSession, session_pk: uuid.UUID, **values: Any) -> int:
    """Update the row and bump its version; returns the new version (for cache invalidation)."""
    result = await db.execute(
        update(Session)
        .where(Session.id == session_pk)
        .values(version=Session.version + 1, **values)
        .returning(Session.version)
    )
    return int(result.scalar_one())


async def delete_session(db: AsyncSession, session_pk: uuid.UUID) -> None:
    await db.execute(delete(Session).where(Session.id == session_pk))


async def claim_idempotency_key(
    db: AsyncSession, tenant_id: uuid.UUID, session_pk: uuid.UUID, key: str, request_hash: str
) -> IdempotencyRecord | None:
    """Claim `key` for this transaction. Returns the earlier record when the key was used.

    A concurrent claim of the same key waits on the unique index until the first transaction
    ends, then sees its committed record: a replay never writes twice.
    """
    claimed = await db.execute(
        insert(IdempotencyRecord)
        .values(tenant_id=tenant_id, session_id=session_pk, key=key, request_hash=request_hash)
        .on_conflict_do_nothing()
        .returning(IdempotencyRecord.key)
    )
    if claimed.first() is not None:
        return None
    query = select(IdempotencyRecord).where(
        IdempotencyRecord.tenant_id == tenant_id,
        IdempotencyRecord.session_id == session_pk,
        IdempotencyRecord.key == key,
    )
    return (await db.execute(query)).scalar_one()


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


async def get_session_by_pk(db: AsyncSession, session_pk: uuid.UUID) -> Session | None:
    return await db.get(Session, session_pk, populate_existing=True)


def _configured(name: str, default: float, as_type: type[BigInteger] | type[Float[float]]) -> Any:
    """A budget field of the session's own configuration, else the deployment default."""
    return func.coalesce(Session.config[name].astext.cast(as_type()), default)


def usage_ratio_sql(defaults: BudgetConfig) -> ColumnElement[float]:
    """`app.domain.budget.Budget.ratio` of each session row, in SQL (a test pins the two
    together): (c0 + c1 + c2 + reply priming) / (C - r)."""
    c0 = func.coalesce(Session.c0_tokens, _configured("c0_tokens", defaults.c0_tokens, BigInteger))
    usage = c0 + Session.c1_tokens + Session.c2_tokens + REPLY_PRIMING_TOKENS
    available = _configured("context_limit", defaults.context_limit, BigInteger) - _configured(
        "reserve_tokens", defaults.reserve_tokens, BigInteger
    )
    return usage.cast(Float()) / func.greatest(available, 1)


def _over_trigger(defaults: BudgetConfig) -> ColumnElement[bool]:
    trigger: ColumnElement[float] = _configured("trigger_ratio", defaults.trigger_ratio, Float)
    return usage_ratio_sql(defaults) >= trigger


async def sessions_over_watermark(
    db: AsyncSession, defaults: BudgetConfig, limit: int = 500
) -> list[uuid.UUID]:
    """Sessions at or over their trigger ratio, changed since their last offload, with no offload
    job pending: the safety net for a job that failed for good. The offload re-checks before
    moving anything."""
    pending_offload = exists().where(
        JOBS.c.queueing_lock == func.concat("offload:", cast(Session.id, String)),
        cast(JOBS.c.status, String).in_(["todo", "doing"]),
    )
    query = (
        select(Session.id)
        .where(
            _not_erasing(),
            Session.c1_turns > 0,
            Session.last_offload_at.is_(None) | (Session.updated_at > Session.last_offload_at),
            _over_trigger(defaults),
            ~pending_offload,
        )
        .limit(limit)
    )
    return list((await db.execute(query)).scalars())


def _listed(tenant_id: uuid.UUID, user_id: str | None = None) -> ColumnElement[bool]:
    """A tenant's sessions (a user's, with `user_id`), but for those being erased, whose ids no
    client can name."""
    listed = (Session.tenant_id == tenant_id) & Session.external_id.regexp_match(SESSION_ID_PATTERN)
    return listed if user_id is None else listed & (Session.user_id == user_id)


async def list_sessions(
    db: AsyncSession, tenant_id: uuid.UUID, *, limit: int, offset: int
) -> list[Session]:
    """A tenant's sessions, most recently changed first (the inspector's pages)."""
    query = (
        select(Session)
        .where(_listed(tenant_id))
        .order_by(Session.updated_at.desc(), Session.id)
        .limit(limit)
        .offset(offset)
    )
    return list((await db.execute(query)).scalars().all())


async def sessions_page(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    user_id: str | None,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Session]:
    """A tenant's sessions (a user's, with `user_id`), newest first, from the one after the
    (created_at, id) `after`: a keyset that no later change of a session moves."""
    query = select(Session).where(_listed(tenant_id, user_id))
    if after is not None:
        query = query.where(tuple_(Session.created_at, Session.id) < tuple_(*after))
    query = query.order_by(Session.created_at.desc(), Session.id.desc()).limit(limit)
    return list((await db.execute(query)).scalars().all())


async def count_sessions(db: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> int:
    """A user's sessions a client can name."""
    query = select(func.count()).where(_listed(tenant_id, user_id))
    return int((await db.execute(query)).scalar_one())


async def turn_timeline(db: AsyncSession, session_pk: uuid.UUID) -> list[tuple[int, Any, int]]:
    """(seq, created_at, token_count) of every turn of a session, in order (no content)."""
    query = (
        select(Turn.seq, Turn.created_at, Turn.token_count)
        .where(Turn.session_id == session_pk)
        .order_by(Turn.seq)
    )
    return [(int(r[0]), r[1], int(r[2])) for r in (await db.execute(query)).all()]


# --- counters ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """The counters a session row keeps so that no request re-reads its history."""

    c1_tokens: int
    c1_turns: int
    turn_count: int
    chunk_count: int


# `app.offload.repository.active_chunk_count`: chunks are counted where they are queried.
ChunkCount = Callable[[Any], Any]


def _counted(chunk_count: ChunkCount) -> tuple[Any, Any, Any, Any]:
    """Correlated subqueries recounting each counter of the outer `Session` row from the rows."""
    window = (Turn.session_id == Session.id) & Turn.chunk_id.is_(None) & Turn.forgotten_at.is_(None)
    return (
        select(func.coalesce(func.sum(Turn.token_count), 0)).where(window).scalar_subquery(),
        select(func.count()).where(window).scalar_subquery(),
        select(func.count()).where(Turn.session_id == Session.id).scalar_subquery(),
        chunk_count(Session.id),
    )


async def sessions_with_drift(
    db: AsyncSession,
    defaults: BudgetConfig,
    chunk_count: ChunkCount,
    *,
    changed_since: datetime,
    limit: int = 500,
) -> list[uuid.UUID]:
    """Sessions changed since `changed_since`, or over their trigger, whose stored counters
    differ from a recount of their rows (read without locks: the caller re-checks under one)."""
    c1_tokens, c1_turns, turn_count, chunks = _counted(chunk_count)
    query = (
        select(Session.id)
        .where(
            _not_erasing(),
            (Session.updated_at >= changed_since) | _over_trigger(defaults),
            or_(
                Session.c1_tokens != c1_tokens,
                Session.c1_turns != c1_turns,
                Session.turn_count != turn_count,
                Session.chunk_count != chunks,
            ),
        )
        .order_by(Session.updated_at.desc())
        .limit(limit)
    )
    return list((await db.execute(query)).scalars())


async def recount(db: AsyncSession, session_pk: uuid.UUID, chunk_count: ChunkCount) -> Counters:
    """The counters of one session, recounted from its turn and chunk rows."""
    row = (await db.execute(select(*_counted(chunk_count)).where(Session.id == session_pk))).one()
    return Counters(*(int(v) for v in row))
