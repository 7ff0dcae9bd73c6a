"""Marking a source untrusted after the fact (`POST /v1/sessions/{id}/sources/untrust`): the
results of one tool in the session, or a turn range. Nothing is erased — the turns keep their
text, in the window and in their chunks — but everything derived from them is taken out of what
the prompt presents as trusted, in one transaction: the turns quarantined (no notes run derives
from them again; in the window a prompt shows them labelled untrusted), their chunks labelled
untrusted (recall shows them as untrusted data), their sightings of the user's items taken back
as evidence (`withdraw_evidence`), the
remembered items written from them (their `turn_seqs` or `source_tool`) quarantined (out of the
prompt; an explicit recall shows them unconfirmed), their notes lines removed here and in the
notes of the user's other sessions, and the stored manifests built since the source arrived
deleted. The session's cached notes and window are keyed by versions this bumps."""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import retrying_transaction
from app.core.errors import InvalidInput, NotFound
from app.domain.callers import Caller
from app.domain.tool_groups import tool_names
from app.erasure.derived import (
    drop_from_notes,
    drop_from_others_notes,
    lineage_sessions,
    withdraw_evidence,
)
from app.erasure.lineage import derived_at_request
from app.erasure.schemas import DerivedItem, SourceUntrusted, UntrustIn
from app.erasure.service import live_among
from app.store import builds as builds_store
from app.store import chunks as chunks_store
from app.store import memory_lineage
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.memory_lineage import SOURCE_UNTRUSTED
from app.store.models import Session, SessionKey
from app.store.sessions import require_session, write_session
from app.store.turns import to_record


def _checked(body: UntrustIn) -> None:
    if (body.tool is None) == (body.turn_range is None):
        raise InvalidInput("name exactly one source: `tool` or `turn_range`", field="tool")
    if body.turn_range is not None and body.turn_range[0] > body.turn_range[1]:
        raise InvalidInput("turn_range is [first, last] with first <= last", field="turn_range")


async def untrust_source(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    session_id: str,
    body: UntrustIn,
) -> SourceUntrusted:
    _checked(body)
    started = datetime.now(UTC)
    key = (await require_session(db, caller, session_id)).key
    return await retrying_transaction(
        db, lambda: _untrust(db, settings, cache, key, session_id, body, started)
    )


async def _untrust(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    key: SessionKey,
    session_id: str,
    body: UntrustIn,
    started: datetime,
) -> SourceUntrusted:
    others = await lineage_sessions(db, key)
    locked = await sessions_store.lock_sessions(db, key.tenant_id, [key.id, *others])
    session = live_among(locked, key.id)
    if session is None:
        raise NotFound(f"session {session_id!r} not found", field="session_id")
    roles, since = await _source(db, session, body)
    seqs = sorted(roles)
    await turns_store.quarantine_turns(db, session.tenant_id, session.id, seqs, started)
    chunks = await chunks_store.distrust_chunks(db, session.tenant_id, session.id, roles)
    # Before the items' rows are locked: the owner lock comes first (`withdraw_evidence`).
    await withdraw_evidence(db, settings, session, seqs, "its source was marked untrusted")
    memories = await memory_lineage.quarantine_derived_memories(
        db, session.tenant_id, session.id, seqs, body.tool, SOURCE_UNTRUSTED
    )
    lines = await drop_from_notes(db, settings, cache, session, set(seqs))
    derived = [DerivedItem.model_validate(d) for d in derived_at_request(chunks, lines, memories)]
    if memories:
        await drop_from_others_notes(db, settings, cache, locked, session.id)
        derived.append(DerivedItem(kind="other_session_notes", count=len(locked) - 1))
    builds = await builds_store.delete_builds_since(db, session.tenant_id, session.id, since)
    if builds:
        derived.append(DerivedItem(kind="prompt_build", count=builds))
    # The chunks' trust changed: every per-process copy of them is keyed by this version.
    await write_session(db, cache, session, chunks_version=Session.chunks_version + 1)
    return SourceUntrusted(
        session_id=session_id,
        tool=body.tool,
        turn_seqs=seqs,
        derived=derived,
        seconds_to_gone=(datetime.now(UTC) - started).total_seconds(),
    )


async def _source(
    db: AsyncSession, session: Session, body: UntrustIn
) -> tuple[dict[int, str], Any]:
    """The source's live turns (their roles by seq) and when the first of them arrived."""
    if body.turn_range is not None:
        turns = await turns_store.live_turns(db, session.tenant_id, session.id, *body.turn_range)
        field, seqs = "turn_range", [t.seq for t in turns]
    else:
        assert body.tool is not None
        turns = await turns_store.live_turns(db, session.tenant_id, session.id, 1, session.last_seq)
        named = tool_names([to_record(t) for t in turns])
        field, seqs = "tool", sorted(seq for seq, name in named.items() if name == body.tool)
    if not seqs:
        raise NotFound(f"no turns of that {field.replace('_', ' ')} to untrust", field=field)
    source = [t for t in turns if t.seq in seqs]
    return {t.seq: t.role for t in source}, min(t.created_at for t in source)
