"""Notes (C2) regeneration behind a version check, and reads through a versioned cache key.

`compute_notes` reads scratchpad version v and the turns offloaded since it was written;
`write_notes` stores v+1 only if the row is still at v. A slower job that lost the race discards
its result and is counted (`stale_writes`), never written over newer notes.
"""

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

import httpx
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.cpu import off_loop
from app.domain.tokens import message_tokens
from app.notes.llm import NotesGenerationError, llm_extract
from app.notes.policy import cap, merge, notes_tokens, render_notes_block
from app.notes.rules import extract
from app.notes.schemas import DroppedNote, NoteItem, Notes, NotesResult
from app.store import memories as memories_store
from app.store import scratchpads as scratchpads_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Memory, Scratchpad, Session
from app.store.sessions import write_session
from app.store.turns import to_record

# What a refresh did: "written" (v+1 stored), "stale" (lost the version race, discarded),
# "failed" (generation failed, rebuild flagged), "gone" (the session was deleted, or is being).
NotesOutcome = Literal["written", "stale", "failed", "gone"]


@dataclass(frozen=True)
class NotesDraft:
    session: Session
    base_version: int
    covers_until_seq: int
    result: NotesResult | None  # None: generation failed, keep the previous notes
    generator: str


def memory_items(memories: list[Memory]) -> list[NoteItem]:
    return [
        NoteItem(
            text=m.text,
            seq=None,
            subject=m.key,
            source="memory",
            trusted=m.trusted,
            valid_until=min((t for t in (m.valid_until, m.expires_at) if t), default=None),
        )
        for m in memories
    ]


def notes_message_tokens(notes: Notes) -> int:
    """C2 as the prompt pays for it: the rendered block as one system message, framing included."""
    block = render_notes_block(notes)
    return message_tokens("system", block) if block else 0


async def compute_notes(
    db: AsyncSession,
    settings: Settings,
    session: Session,
    *,
    rebuild: bool = False,
    llm_client: httpx.AsyncClient | None = None,
) -> NotesDraft:
    """New notes from the previous ones plus the turns offloaded since (or from all raw turns)."""
    await scratchpads_store.ensure_scratchpad(db, session)
    pad = await scratchpads_store.get_scratchpad(db, session.tenant_id, session.id)
    assert pad is not None
    # Every so often, and after a failed generation, start again from the raw turns so that
    # notes never drift as a summary of a summary.
    every = settings.notes.rebuild_every_versions
    rebuild = rebuild or pad.rebuild_pending or (every > 0 and (pad.version + 1) % every == 0)
    previous = Notes() if rebuild else Notes.model_validate(pad.notes or {})
    after = 0 if rebuild else pad.covers_until_seq
    turns = [
        to_record(t)
        for t in await turns_store.offloaded_turns(db, session.tenant_id, session.id, after)
    ]
    covers = max([after, *(t.seq for t in turns)])
    generator = settings.notes.generator
    try:
        if generator == "llm" and turns:
            if llm_client is None or not settings.notes.llm_base_url:
                raise NotesGenerationError(
                    "the llm notes generator needs CONTEXTD_NOTES__LLM_BASE_URL"
                )
            notes = await llm_extract(
                llm_client,
                settings.notes.llm_base_url,
                settings.notes.llm_model,
                settings.notes.llm_api_key,
                previous,
                turns,
                settings.notes.llm_timeout_seconds,
            )
        else:
            notes = await off_loop(
                lambda: merge(previous, extract(turns, previous)),
                chars=sum(len(t.content) for t in turns),
            )
    except NotesGenerationError:
        return NotesDraft(session, pad.version, pad.covers_until_seq, None, generator)
    notes = notes.with_section(
        "remembered", memory_items(await memories_store.visible_memories(db, session))
    )
    return NotesDraft(
        session, pad.version, covers, cap(notes, settings.notes.max_tokens, generator), generator
    )


async def write_notes(db: AsyncSession, cache: Cache, draft: NotesDraft) -> NotesOutcome:
    """Compare-and-set v -> v+1. "stale" when another writer got there first (counted).

    The session row is locked first (the lock order of `app.store`: a session's
    scratchpad is written only under its row lock); "gone" when it was deleted meanwhile."""
    tenant_id, session_pk = draft.session.tenant_id, draft.session.id
    if await sessions_store.lock_session_by_pk(db, tenant_id, session_pk) is None:
        return "gone"
    if draft.result is None:
        await scratchpads_store.flag_rebuild_pending(db, tenant_id, session_pk, draft.base_version)
        return "failed"
    written = await scratchpads_store.compare_and_set(
        db,
        tenant_id,
        session_pk,
        draft.base_version,
        {
            "covers_until_seq": draft.covers_until_seq,
            "notes": draft.result.notes.model_dump(mode="json"),
            "token_count": draft.result.token_count,
            "generator": draft.generator,
            "rebuild_pending": False,
            "dropped_items": len(draft.result.dropped),
            "dropped": [d.model_dump(mode="json") for d in draft.result.dropped],
        },
    )
    if not written:
        await scratchpads_store.count_stale_write(db, tenant_id, session_pk)
        return "stale"
    await write_session(
        db,
        cache,
        draft.session,
        c2_tokens=notes_message_tokens(draft.result.notes),
        notes_version=draft.base_version + 1,
    )
    return "written"


async def refresh_notes(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    tenant_id: uuid.UUID,
    session_pk: uuid.UUID,
    *,
    rebuild: bool = False,
    llm_client: httpx.AsyncClient | None = None,
) -> NotesOutcome:
    session = await sessions_store.get_session_by_pk(db, tenant_id, session_pk)
    if session is None or sessions_store.erasing(session):
        return "gone"  # or waiting for its erase job, which deletes the notes
    draft = await compute_notes(db, settings, session, rebuild=rebuild, llm_client=llm_client)
    return await write_notes(db, cache, draft)


@dataclass(frozen=True)
class NotesSnapshot:
    """One committed notes version. Versions are immutable, so a copy cached under its version
    number is always exact."""

    version: int
    covers_until_seq: int
    notes: Notes
    token_count: int
    dropped: list[DroppedNote]  # what the token cap left out of this version


def in_force_at(snapshot: NotesSnapshot, at: datetime) -> NotesSnapshot:
    """The snapshot without the lines whose validity ended by `at`, its tokens those of the
    lines left."""
    if not snapshot.notes.lapses_by(at):
        return snapshot
    notes = snapshot.notes.in_force(at)
    return replace(snapshot, notes=notes, token_count=notes_tokens(notes))


def empty_notes() -> NotesSnapshot:
    """Version 0: the notes of a session no writer has written yet."""
    return NotesSnapshot(version=0, covers_until_seq=0, notes=Notes(), token_count=0, dropped=[])


def stored_notes(pad: Scratchpad) -> NotesSnapshot:
    """A stored notes version as it was written."""
    return NotesSnapshot(
        version=pad.version,
        covers_until_seq=pad.covers_until_seq,
        notes=Notes.model_validate(pad.notes or {}),
        token_count=pad.token_count,
        dropped=[DroppedNote.model_validate(d) for d in pad.dropped or []],
    )


def notes_cache_key(cache: Cache, session: Session, version: int) -> str:
    """In the session's slot; the row id names it too, for a forget's erase to find."""
    return cache.session_key(
        "notes", session.tenant_id, session.external_id, session.id, f"v{version}"
    )


async def current_notes(db: AsyncSession, cache: Cache, session: Session) -> NotesSnapshot:
    """The notes version the session row names, from the cache when it holds that version.
    Version 0 is the empty notes no writer has replaced yet: no read at all."""
    if session.notes_version == 0:
        return empty_notes()
    key = notes_cache_key(cache, session, session.notes_version)
    cached = await cache.get_json(key)
    if cached is not None:
        return NotesSnapshot(
            version=cached["version"],
            covers_until_seq=cached["covers_until_seq"],
            notes=Notes.model_validate(cached["notes"]),
            token_count=cached["token_count"],
            dropped=[DroppedNote.model_validate(d) for d in cached.get("dropped", [])],
        )
    pad = await scratchpads_store.get_scratchpad(db, session.tenant_id, session.id)
    if pad is None:
        return empty_notes()
    snapshot = stored_notes(pad)
    if pad.version == session.notes_version:
        await cache.set_json(
            key,
            {
                "version": snapshot.version,
                "covers_until_seq": snapshot.covers_until_seq,
                "notes": snapshot.notes.model_dump(mode="json"),
                "token_count": snapshot.token_count,
                "dropped": [d.model_dump(mode="json") for d in snapshot.dropped],
            },
        )
    return snapshot
