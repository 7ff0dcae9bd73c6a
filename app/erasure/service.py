"""Erasure, step one: tombstone in the request's transaction, so recall, build-prompt, notes and
every cache stop showing the target as soon as the request commits; then enqueue the erase job
(step two, `app.erasure.erase`) with its receipt. Three entry points: `forget` (the memory tool's
`forget` type: a chunk, a turn range or a remembered item), `delete_session` (the whole session)
and `delete_user` (a user's sessions and the items remembered for them elsewhere).

A chunk only partly covered by a forgotten turn range is tombstoned whole (its raw text, terms and
embedding mix both), and the turns of it that were *not* forgotten are re-chunked into new chunks:
every remaining turn stays covered by exactly one active chunk (spec §2), no kept detail lost.

Every entry point takes the session rows it changes first, in one statement (the lock order of
`app.store`), and runs in a transaction of its own that a deadlock or serialization failure
retries (`app.core.db.retrying_transaction`); a user delete takes one such transaction per
session, so none grows with the user's size.

A turn range is first widened to whole tool-call groups (`app.domain.tool_groups.atomic_units`
over the session's live turns), so forgetting a tool call also forgets its results and the other
way round: no tool result is ever left without its call (spec §2), in the window or in a chunk.
"""

import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import CACHE_ERRORS, Cache
from app.core.config import Settings
from app.core.db import after_commit, retrying_transaction
from app.core.errors import InvalidInput, NotFound
from app.domain.callers import Caller
from app.domain.tool_groups import atomic_units
from app.erasure.derived import (
    drop_from_notes,
    drop_from_others_notes,
    lineage_sessions,
    users_other_sessions,
    withdraw_evidence,
)
from app.erasure.lineage import derived_at_request
from app.erasure.schemas import (
    ErasedMemory,
    ErasedSession,
    ForgetTarget,
    SessionErased,
    UserErased,
)
from app.jobs.queue import TaskName, embedding_lock, enqueue, session_lock
from app.offload.service import write_chunks
from app.store import chunks as chunks_store
from app.store import memories as memories_store
from app.store import memory_erasure as memory_erasure_store
from app.store import memory_lineage
from app.store import receipts as receipts_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.memories import FORGOTTEN, SESSION_DELETED, USER_DELETED
from app.store.memory_lineage import DERIVED_FORGOTTEN
from app.store.models import Session, SessionKey, Turn
from app.store.sessions import require_session, session_budget, session_cache_key, write_session
from app.store.turns import to_record

USER_SESSIONS_PER_DELETE = 100  # sessions a user delete tombstones per call: a request stays short
# A session delete erases inline (`app.erasure.erase.erase_now`) when that is cheap: a session of
# at most this many bytes of turn text, a cache of at most this many keys to hunt, and in a user
# delete while the request has run less than this; its job then waits this long, for a process
# that died.
INLINE_MAX_TEXT_BYTES = 4 * 1024 * 1024
INLINE_MAX_CACHE_KEYS = 5_000
INLINE_SECONDS = 2.0
INLINE_JOB_DELAY_SECONDS = 10.0

logger = logging.getLogger("contextd.erasure")
EraseNow = Callable[[uuid.UUID, uuid.UUID], Awaitable[bool]]  # (tenant, receipt id)


def parse_id(value: str, field: str, what: str) -> uuid.UUID:
    """A malformed id is reported like an unknown one: it names nothing the caller can see."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(f"{what} {value!r} not found", field=field) from None


SHORT_REF = re.compile(r"[0-9a-f]{8,31}")


def resolve_ref(value: str, known: Sequence[uuid.UUID], field: str, what: str) -> uuid.UUID:
    """A full id, or the short form prompts show (`app.prompt.blocks.short_id`): a prefix of at
    least 8 hex digits naming exactly one of `known`."""
    if not SHORT_REF.fullmatch(value.lower()):
        return parse_id(value, field, what)
    matches = [k for k in known if str(k).startswith(value.lower())]
    if not matches:
        raise NotFound(f"{what} {value!r} not found", field=field)
    if len(matches) > 1:
        raise InvalidInput(f"{what} {value!r} is ambiguous: give more digits", field=field)
    return matches[0]


async def forget(
    db: AsyncSession, settings: Settings, cache: Cache, session: Session, request: ForgetTarget
) -> tuple[str, dict[str, Any]]:
    """The memory tool's `forget`: (answer text, answer data), committed."""
    key, session_id = session.key, session.external_id
    return await retrying_transaction(
        db, lambda: _forget(db, settings, cache, key, session_id, request)
    )


async def _forget(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    key: SessionKey,
    session_id: str,
    request: ForgetTarget,
) -> tuple[str, dict[str, Any]]:
    if request.memory_id is not None:
        return await _forget_memory(db, settings, cache, key, session_id, request.memory_id)
    # Items of the user derived from the forgotten turns leave their other sessions' notes
    # too: those sessions are locked with this one, before anything else.
    others = await lineage_sessions(db, key)
    locked = await sessions_store.lock_sessions(db, key.tenant_id, [key.id, *others])
    session = live_among(locked, key.id)
    if session is None:
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    if request.chunk_id is not None:
        chunk_pk = resolve_ref(
            request.chunk_id,
            await chunks_store.active_chunk_ids(db, session.tenant_id, session.id),
            "chunk_id",
            "chunk",
        )
        chunk = await chunks_store.get_chunk(db, session.tenant_id, session.id, chunk_pk)
        if chunk is None:
            raise NotFound(f"chunk {request.chunk_id!r} not found", field="chunk_id")
        first, last = chunk.turn_first, chunk.turn_last
        target: dict[str, Any] = {"kind": "chunk", "chunk_id": str(chunk.id)}
    else:
        assert request.turn_range is not None
        first, last = request.turn_range
        target = {"kind": "turn_range", "turn_range": [first, last]}
        widened = await _widen_to_tool_groups(db, session, first, last)
        if widened != (first, last):
            first, last = widened
            target["widened_to"] = [first, last]
    turns = await turns_store.live_turns(db, session.tenant_id, session.id, first, last)
    if not turns:
        raise NotFound(f"no turns {first}-{last} to forget", field="turn_range")
    return await _forget_turns(db, settings, cache, locked, session, turns, target)


async def _widen_to_tool_groups(
    db: AsyncSession, session: Session, first: int, last: int
) -> tuple[int, int]:
    """`[first, last]` grown to the whole tool-call groups its live turns belong to."""
    live = await turns_store.live_turns(db, session.tenant_id, session.id, 1, session.last_seq)
    lo, hi = first, last
    for unit in atomic_units([to_record(t) for t in live]):
        if any(first <= live[i].seq <= last for i in unit):
            lo, hi = min(lo, live[unit[0]].seq), max(hi, live[unit[-1]].seq)
    return lo, hi


async def _forget_turns(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    locked: list[Session],
    session: Session,
    turns: list[Turn],
    target: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    now = datetime.now(UTC)
    seqs = {t.seq for t in turns}
    first, last = min(seqs), max(seqs)
    chunks = await chunks_store.chunks_overlapping(db, session.tenant_id, session.id, first, last)
    dead = [c.id for c in chunks]
    await turns_store.forget_turns(db, session.tenant_id, [t.id for t in turns], now)
    await chunks_store.tombstone_chunks(db, session.tenant_id, dead)
    # The sightings of the user's items in these turns taken back (an item of another session
    # said again here loses what that earned it), before the items' rows are locked: the
    # user's item writers take the owner lock first.
    await withdraw_evidence(db, settings, session, seqs, "the turns it was said in were forgotten")
    # Remembered items written from these turns go with them (the lineage, issue 36).
    derived = await memory_lineage.tombstone_derived_memories(
        db, session.tenant_id, session.id, sorted(seqs), DERIVED_FORGOTTEN
    )

    # Re-chunk what the tombstoned chunks held besides the forgotten turns.
    new_ids: list[uuid.UUID] = []
    if chunks:
        span_first = min(c.turn_first for c in chunks)
        span_last = max(c.turn_last for c in chunks)
        kept = [
            t
            for t in await turns_store.live_turns(
                db, session.tenant_id, session.id, span_first, span_last
            )
            if t.chunk_id is not None
        ]
        for run in _runs(kept):
            new_ids.extend(await write_chunks(db, settings, session, [to_record(t) for t in run]))
    window = [t for t in turns if t.chunk_id is None]
    # The active chunks change (even when their count does not): the per-process BM25 indexes
    # are keyed by `chunks_version`.
    chunks_changed = {"chunks_version": Session.chunks_version + 1} if dead or new_ids else {}
    after = session_budget(settings, session).after_leaving(sum(t.token_count for t in window))
    await write_session(
        db,
        cache,
        session,
        chunk_count=session.chunk_count - len(dead) + len(new_ids),
        c1_tokens=after.c1,
        c1_turns=session.c1_turns - len(window),
        **chunks_changed,
    )
    if new_ids:
        await enqueue(
            db,
            TaskName.EMBED_CHUNKS,
            {"chunk_ids": [str(c) for c in new_ids], "tenant_id": str(session.tenant_id)},
            lock=embedding_lock(session.id),
        )
    lines = await drop_from_notes(db, settings, cache, session, seqs)
    if derived:
        await drop_from_others_notes(db, settings, cache, locked, session.id)
    receipt_id = await _schedule_erase(
        db,
        session,
        {
            **target,
            "turn_seqs": sorted(seqs),
            "chunk_ids": [str(c) for c in dead],
            "memory_ids": [str(m) for m in derived],
            "derived": derived_at_request(dead, lines, derived),
        },
    )
    data: dict[str, Any] = {
        "forgotten_turns": sorted(seqs),
        "tombstoned_chunks": [str(c) for c in dead],
        "tombstoned_memories": [str(m) for m in derived],
        "rechunked_into": [str(c) for c in new_ids],
        "erase_receipt_id": str(receipt_id),
        "status": "tombstoned",
    }
    items = f", {len(derived)} remembered item(s) written from them" if derived else ""
    text = (
        f"Forgotten: turns {first}-{last} ({len(seqs)} turns, {len(dead)} chunks{items}). They "
        "no longer appear in recall, notes or prompts; the raw text is being erased in the "
        f"background (erase receipt {receipt_id})."
    )
    if "widened_to" in target:
        asked_first, asked_last = target["turn_range"]
        data["widened_to"] = target["widened_to"]
        text = (
            f"Turn range {asked_first}-{asked_last} was widened to {first}-{last} so that no "
            f"tool call is kept without its tool result (or a result without its call). {text}"
        )
    return text, data


def _runs(turns: list[Turn]) -> list[list[Turn]]:
    runs: list[list[Turn]] = []
    for turn in turns:
        if runs and runs[-1][-1].seq == turn.seq - 1:
            runs[-1].append(turn)
        else:
            runs.append([turn])
    return runs


async def _forget_memory(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    key: SessionKey,
    session_id: str,
    memory_id: str,
) -> tuple[str, dict[str, Any]]:
    session_pk = key.id
    read = await sessions_store.get_session_by_pk(db, key.tenant_id, session_pk)
    if read is None or sessions_store.erasing(read):
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    pk = resolve_ref(
        memory_id,
        await memories_store.visible_memory_ids(db, read),
        "memory_id",
        "memory",
    )
    memory = await memories_store.visible_memory(db, read, pk)
    if memory is None:
        raise NotFound(f"memory {memory_id!r} not found", field="memory_id")
    memory_pk, users = memory.id, {memory.user_id} if memory.scope == "user" else set()
    # A user's item leaves the notes of their other sessions too: all locked before the item.
    others = await users_other_sessions(db, read, users)
    locked = await sessions_store.lock_sessions(db, key.tenant_id, [session_pk, *others])
    session = live_among(locked, session_pk)
    if session is None:
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    await memories_store.set_memory_status(db, key.tenant_id, [memory_pk], "tombstoned", FORGOTTEN)
    lines = await drop_from_notes(db, settings, cache, session, set())
    await drop_from_others_notes(db, settings, cache, locked, session_pk)
    receipt_id = await _schedule_erase(
        db,
        session,
        {
            "kind": "memory",
            "memory_ids": [str(memory_pk)],
            "derived": derived_at_request([], lines, []),
        },
    )
    text = (
        f"Forgotten: remembered item {memory_pk}. It no longer appears in notes, recall or "
        f"prompts; its text is being erased in the background (erase receipt {receipt_id})."
    )
    return text, {
        "memory_id": str(memory_pk),
        "erase_receipt_id": str(receipt_id),
        "status": "tombstoned",
    }


def live_among(locked: list[Session], session_pk: uuid.UUID) -> Session | None:
    """The session `session_pk` among `locked`, unless it was deleted or tombstoned meanwhile."""
    found = next((s for s in locked if s.id == session_pk), None)
    return None if found is None or sessions_store.erasing(found) else found


async def _schedule_erase(db: AsyncSession, session: Session, target: dict[str, Any]) -> uuid.UUID:
    receipt = await receipts_store.add_receipt(
        db, session.tenant_id, session.external_id, {**target, "session_pk": str(session.id)}
    )
    await enqueue(
        db,
        TaskName.ERASE,
        {"receipt_id": str(receipt.id), "tenant_id": str(session.tenant_id)},
        lock=session_lock(session.id),
    )
    return receipt.id


async def delete_session(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    session_id: str,
    erase_now: EraseNow | None = None,
) -> SessionErased:
    """Tombstone the whole session now (it is a 404 from this commit on, and its id free for
    reuse), with the user-scope items it wrote (out of the user's other notes too), and enqueue
    the job that erases it; then, when cheap, erase it with `erase_now` (its receipt complete
    before the answer): its erase receipt id and whether it is complete."""
    session = await require_session(db, caller, session_id)
    key = session.key
    others = await users_other_sessions(
        db, session, set(await memory_erasure_store.session_item_users(db, *key))
    )
    inline = erase_now is not None and await _cache_small(cache)
    tombstoned = await retrying_transaction(
        db,
        lambda: _erase_session(
            db, settings, cache, key, others, lambda s: s.external_id == session_id, inline
        ),
    )
    if tombstoned is None:  # deleted by a concurrent call
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    erased = await _erase_inline(erase_now, key.tenant_id, *tombstoned)
    return SessionErased(
        session_id=session_id,
        erase_receipt_id=str(tombstoned[0]),
        status="completed" if erased else "pending",
    )


async def _cache_small(cache: Cache) -> bool:
    """Whether an inline erase's hunt through the cache is short (`INLINE_MAX_CACHE_KEYS`)."""
    client = cache.client
    if client is None:
        return True
    try:
        return int(await client.dbsize()) <= INLINE_MAX_CACHE_KEYS
    except CACHE_ERRORS:
        return False  # the job retries until Redis answers


async def _erase_inline(
    erase_now: EraseNow | None, tenant_id: uuid.UUID, receipt_id: uuid.UUID, inline: bool
) -> bool:
    """The inline erase of a tombstoned session: whether it erased it (one that fails, or is
    not tried, is left to its job)."""
    if erase_now is None or not inline:
        return False
    try:
        await erase_now(tenant_id, receipt_id)
    except Exception as exc:  # the tombstone is committed: the answer is still 202
        logger.warning("inline erase of receipt %s failed (%r); its job retries", receipt_id, exc)
        return False
    return True


async def delete_user(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    user_id: str,
    erase_now: EraseNow | None = None,
) -> UserErased:
    """Everything of a user: up to `USER_SESSIONS_PER_DELETE` of their sessions deleted as
    `delete_session` does, and every item remembered for them that a session still holds
    (one of theirs left for a later call, or a session since given another user) forgotten
    there, each holder with its erase receipt.

    One transaction per session and per holder, each committed with its receipt and job: no
    transaction grows with the user's size, and a failure midway leaves those done erased
    (their receipts complete) and the rest to the next call. Sessions are erased inline with
    `erase_now`, as `delete_session` does, while the request has run less than
    `INLINE_SECONDS`; the rest by their jobs."""
    started = time.monotonic()
    tenant_id = caller.tenant_id
    sessions = [
        (s.id, s.external_id)
        for s in await sessions_store.sessions_page(
            db, tenant_id, user_id=user_id, after=None, limit=USER_SESSIONS_PER_DELETE
        )
    ]

    def still_theirs(session: Session) -> bool:
        return session.tenant_id == tenant_id and session.user_id == user_id

    erased_sessions = []
    small_cache = erase_now is not None and await _cache_small(cache)
    for session_pk, session_id in sessions:
        inline = small_cache and time.monotonic() - started < INLINE_SECONDS
        # The user's other sessions go too: their notes are left to the erase jobs.
        tombstoned = await retrying_transaction(
            db,
            partial(
                _erase_session,
                db,
                settings,
                cache,
                SessionKey(tenant_id, session_pk),
                [],
                still_theirs,
                inline,
            ),
        )
        if tombstoned is not None:
            erased = await _erase_inline(erase_now, tenant_id, *tombstoned)
            erased_sessions.append(
                ErasedSession(
                    session_id=session_id,
                    erase_receipt_id=str(tombstoned[0]),
                    status="completed" if erased else "pending",
                )
            )
    erased_memories: list[ErasedMemory] = []
    for holder_pk in await memory_erasure_store.user_memories_by_session(db, tenant_id, user_id):
        forgotten = await retrying_transaction(
            db, partial(_forget_user_items, db, settings, cache, holder_pk, tenant_id, user_id)
        )
        if forgotten is not None:
            holder_id, memory_ids, receipt_id = forgotten
            erased_memories.extend(
                ErasedMemory(
                    memory_id=str(m), session_id=holder_id, erase_receipt_id=str(receipt_id)
                )
                for m in memory_ids
            )
    if not erased_sessions and not erased_memories:
        raise NotFound(f"no session or remembered item of user {user_id!r}", field="user_id")
    return UserErased(
        user_id=user_id,
        sessions=erased_sessions,
        memories=erased_memories,
        remaining_sessions=await sessions_store.count_sessions(db, tenant_id, user_id),
        status="pending"
        if erased_memories or any(s.status == "pending" for s in erased_sessions)
        else "completed",
    )


async def _forget_user_items(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    holder_pk: uuid.UUID,
    tenant_id: uuid.UUID,
    user_id: str,
) -> tuple[str, list[uuid.UUID], uuid.UUID] | None:
    """Forget the items remembered for the user that `holder_pk` holds: (its session id, the
    items, the erase receipt), None when there are none any more."""
    holder = live_among(await sessions_store.lock_sessions(db, tenant_id, [holder_pk]), holder_pk)
    if holder is None:  # being erased: its items were tombstoned with it
        return None
    memory_ids = await memory_erasure_store.tombstone_user_memories(
        db, holder_pk, tenant_id, user_id, USER_DELETED
    )
    if not memory_ids:
        return None
    await drop_from_notes(db, settings, cache, holder, set())
    receipt_id = await _schedule_erase(
        db, holder, {"kind": "memory", "memory_ids": [str(m) for m in memory_ids]}
    )
    return holder.external_id, memory_ids, receipt_id


async def _erase_session(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    key: SessionKey,
    others: list[uuid.UUID],
    wanted: Callable[[Session], bool],
    inline: bool,
) -> tuple[uuid.UUID, bool] | None:
    """Tombstone the session `key` and enqueue its erase: its receipt id and whether
    the caller erases it inline (`inline` asked and the session small: its job then waits),
    None when it is gone, being erased, or no longer `wanted` once locked. The notes of
    `others` (the sessions of the users its user-scope items were written for) lose those
    items now."""
    session_pk = key.id
    locked = await sessions_store.lock_sessions(db, key.tenant_id, [session_pk, *others])
    session = live_among(locked, session_pk)
    if session is None or not wanted(session):
        return None
    session_id, tenant_id = session.external_id, session.tenant_id
    now = datetime.now(UTC)
    await turns_store.forget_session_turns(db, session.tenant_id, session.id, now)
    await chunks_store.tombstone_session_chunks(db, session.tenant_id, session.id)
    # Before the items' rows are locked: the owner lock comes first (`withdraw_evidence`).
    every_turn = range(1, session.last_seq + 1)
    await withdraw_evidence(
        db, settings, session, every_turn, "the session it was said in was deleted"
    )
    await memory_erasure_store.tombstone_session_memories(
        db, session.tenant_id, session.id, SESSION_DELETED
    )
    await drop_from_others_notes(db, settings, cache, locked, session_pk)
    cache_key = session_cache_key(cache, tenant_id, session_id)
    version = await write_session(
        db,
        cache,
        session,
        external_id=f"{sessions_store.TOMBSTONE_PREFIX}{session.id}",
        chunks_version=Session.chunks_version + 1,  # every active chunk was just tombstoned
    )

    async def _retire_cached_view() -> None:  # write_session saw the row's new external id
        await cache.invalidate_versioned(cache_key, version)

    after_commit(db, _retire_cached_view)
    receipt = await receipts_store.add_receipt(
        db,
        tenant_id,
        session_id,
        {
            "kind": "session",
            "session_pk": str(session.id),
            "session_id": session_id,
            "tenant_id": str(tenant_id),
        },
    )
    inline = (
        inline
        and await turns_store.session_text_bytes(db, session.tenant_id, session.id)
        <= INLINE_MAX_TEXT_BYTES
    )
    await enqueue(
        db,
        TaskName.ERASE,
        {"receipt_id": str(receipt.id), "tenant_id": str(tenant_id)},
        lock=session_lock(session.id),
        delay_seconds=INLINE_JOB_DELAY_SECONDS if inline else None,
    )
    return receipt.id, inline
