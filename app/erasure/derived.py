"""Notes derived from a revoked source, taken out now (not at the next notes run): in the
session itself and in the notes of its user's other sessions that quote a remembered item the
revocation took (the most recently changed ones; the erase job does the rest). And the evidence
the source's turns gave the user's items, taken back with the standing it earned them."""

import uuid
from collections.abc import Collection

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.errors import Conflict
from app.erasure.lineage import lines_removed
from app.memories.service import evidence_of, owner_lock, promote_after
from app.memories.tiers import stability, without_sightings
from app.notes.policy import cap, remove_sources
from app.notes.schemas import Notes
from app.notes.service import NotesDraft, memory_items, write_notes
from app.store import memories as memories_store
from app.store import memory_erasure as memory_erasure_store
from app.store import memory_lineage
from app.store import scratchpads as scratchpads_store
from app.store import sessions as sessions_store
from app.store.memories import Change
from app.store.models import Session, SessionKey

NOTES_WRITE_ATTEMPTS = 3  # a notes job may commit a new version between our read and our write
USER_SESSIONS_UPDATED = 50  # notes of at most this many of a user's sessions updated per forget


async def drop_from_notes(
    db: AsyncSession, settings: Settings, cache: Cache, session: Session, seqs: set[int]
) -> int:
    """Now, not at the next refresh: notes without items from `seqs` and with the `remembered`
    section as it stands (a forgotten item gone), as a new notes version, so cached copies of the
    previous one are no longer read (the erase job deletes them). Returns the lines removed.

    A notes job may commit a newer version between our read and our compare-and-set; that
    version may still hold the forgotten items, so read it and try again."""
    for _ in range(NOTES_WRITE_ATTEMPTS):
        pad = await scratchpads_store.get_scratchpad(db, session.tenant_id, session.id)
        if pad is None or pad.version == 0:
            return 0
        before = Notes.model_validate(pad.notes or {})
        notes = remove_sources(before, seqs)
        remembered = memory_items(await memories_store.visible_memories(db, session))
        result = cap(
            notes.with_section("remembered", remembered), settings.notes.max_tokens, pad.generator
        )
        draft = NotesDraft(session, pad.version, pad.covers_until_seq, result, pad.generator)
        if await write_notes(db, cache, draft) == "written":
            return lines_removed(before, notes.with_section("remembered", remembered))
    raise Conflict(
        "the notes changed concurrently while forgetting; nothing was forgotten, retry",
        field="type",
    )


async def users_other_sessions(
    db: AsyncSession, session: Session, users: set[str | None]
) -> list[uuid.UUID]:
    """The sessions of `users` other than `session` whose notes lose a tombstoned user-scope
    item now (read without locks): the most recently changed ones only, so that a request
    stays short; the erase job does the rest (`app.erasure.erase`)."""
    found: list[uuid.UUID] = []
    for user_id in sorted(u for u in users if u):
        found.extend(
            pk
            for pk in await sessions_store.user_session_ids(
                db, session.tenant_id, user_id, USER_SESSIONS_UPDATED
            )
            if pk != session.id
        )
    return found


async def drop_from_others_notes(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    locked: list[Session],
    session_pk: uuid.UUID,
) -> None:
    """`drop_from_notes` in every locked session but `session_pk` (and those being erased)."""
    for other in locked:
        if other.id != session_pk and not sessions_store.erasing(other):
            await drop_from_notes(db, settings, cache, other, set())


async def lineage_sessions(db: AsyncSession, key: SessionKey) -> list[uuid.UUID]:
    """The other sessions whose notes a revocation of this session's turns may change: those
    of the users of the items it derived from its turns or tools (read without locks)."""
    read = await sessions_store.get_session_by_pk(db, *key)
    if read is None:
        return []
    return await users_other_sessions(
        db, read, set(await memory_erasure_store.session_item_users(db, *key, derived_only=True))
    )


async def withdraw_evidence(
    db: AsyncSession, settings: Settings, session: Session, seqs: Collection[int], why: str
) -> list[uuid.UUID]:
    """The sightings of the user's items in the session's turns `seqs` taken back (`why`: the
    turns were forgotten or marked untrusted) — an item held by another of the user's sessions
    too, promoted by the user saying it again here — each item's standing recomputed from the
    evidence left: a promotion they earned is undone, as a version. Returns the items changed."""
    if not session.user_id or not seqs:
        return []
    await memories_store.lock_owner(db, owner_lock(session, "user"))
    changed: list[uuid.UUID] = []
    seen = await memory_lineage.items_seen_in(db, session.tenant_id, session.user_id, session.id)
    for memory in seen:
        evidence = evidence_of(memory)
        kept = without_sightings(evidence, str(session.id), seqs)
        if len(kept) == len(evidence):
            continue
        earned = stability(kept, promote_after(settings))
        fell_back = Change("rule", None, f"back to {earned.tier}: {why}")
        await memories_store.set_evidence(
            db,
            memory,
            [e.as_json() for e in kept],
            (earned.tier, earned.score, earned.reasons),
            fell_back if earned.tier != memory.tier else None,
        )
        changed.append(memory.id)
    return changed
