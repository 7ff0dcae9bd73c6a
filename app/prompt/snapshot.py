"""What a build reads of its session: the row and its window, read together on the reader pool
without a lock, and kept per process by the row's version (`AppContext.windows`) so that a build
of an unchanged session reads its turns from nothing."""

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.db import read_once
from app.domain.callers import Caller
from app.domain.records import TurnRecord
from app.prompt.schemas import BuildPromptRequest, ManifestItem
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session


@dataclass(frozen=True)
class Prefetched:
    """What `read_snapshot` found for a build without an append (None: no such session), read
    by the caller of `build_prompt` before it (build-prompt's direct route reads it while the
    request is counted against the rate limit)."""

    found: turns_store.SessionWindow | None


async def resolve_session(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    prefetched: Prefetched | None,
    writes: bool,
) -> tuple[Session, turns_store.SessionWindow | None]:
    """The build's session and, for a build without an append, the snapshot it was read from
    (None: read through the request's transaction)."""
    # Builds read without locking the session row (they would serialise behind appends); only a
    # first build of a new session creates it, and only for a key that may write. Without an
    # append the row and its window come in one statement, outside the request's transaction;
    # a build that turns out to write reads the row again through it (`attached`).
    if req.append:
        snapshot = None
    elif prefetched is not None:
        snapshot = prefetched.found
    else:
        snapshot = await read_snapshot(context, caller, session_id)
    session = (
        snapshot.session
        if snapshot is not None
        else await sessions_store.get_session(db, caller.tenant_id, session_id)
    )
    if session is None:
        if writes:
            session = await sessions_store.lock_or_create_session(db, caller.tenant_id, session_id)
        else:
            session = _unsaved_session(caller.tenant_id, session_id)
    return session, snapshot


def _unsaved_session(tenant_id: uuid.UUID, session_id: str) -> Session:
    """What a read-only build of a session that does not exist reads: an empty session that is
    never added to the database."""
    return Session(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        external_id=session_id,
        config={},
        last_seq=0,
        c0_tokens=None,
        c1_tokens=0,
        c1_turns=0,
        c2_tokens=0,
        notes_version=0,
        offloaded_until_seq=0,
        turn_count=0,
        chunk_count=0,
        chunks_version=0,
        offload_armed=True,
    )


async def read_window(
    db: AsyncSession,
    session: Session,
    snapshot: turns_store.SessionWindow | None,
    appended_seq: int | None,
) -> list[TurnRecord]:
    """The build's window: the snapshot's, or read through the request's transaction without the
    turn this build appended (the query, which the prompt ends with)."""
    return (
        snapshot.window
        if snapshot is not None
        else [
            t
            for t in await turns_store.window_turns(db, session.tenant_id, session.id)
            if t.seq != appended_seq
        ]
    )


async def read_snapshot(
    context: AppContext, caller: Caller, session_id: str
) -> turns_store.SessionWindow | None:
    """The session and its window in one statement on the reader pool: one round trip. The
    window this process read last for the session is kept (`AppContext.windows`) and not read
    again while the session's row and version are the same (its JSON was ~0.8 ms of PostgreSQL
    and ~1.5 ms of this process a build for a 263-turn window). A forgotten turn's text leaves
    the process at the session's next build here, as the shown chunks' lines do."""
    owner = _window_owner(caller, session_id)
    latest = context.windows.latest(owner)
    kept: KeptWindow | None = None if latest is None else latest[1]
    found = await read_once(
        context.reader,
        lambda conn: turns_store.session_with_window(
            conn, caller.tenant_id, session_id, None if kept is None else kept.read
        ),
    )
    if found is None:
        return None
    key = (owner, found.session.version)
    if latest is not None and latest[1].read.session.id == found.session.id and latest[0] == key[1]:
        context.windows.get(key)  # the kept window: most recently used
    else:
        context.windows.put(key, KeptWindow(found))
    return found


def _window_owner(caller: Caller, session_id: str) -> str:
    return f"{caller.tenant_id}:{session_id}"


@dataclass(eq=False)
class KeptWindow:
    """A session's window as read at one version of its row, and the manifest items of its turns
    once a build that included every turn made them (a pure function of the turns)."""

    read: turns_store.SessionWindow
    turn_items: list[ManifestItem] | None = None
    # The offloaded tail read at this version: (the tokens it was read for, turns, chunk ids).
    tail: tuple[int, list[TurnRecord], dict[int, str]] | None = None


def kept_window(
    context: AppContext, caller: Caller, session_id: str, session: Session, window: list[Any]
) -> KeptWindow | None:
    """The kept window this build's `window` is (the same turn records), if any."""
    kept = context.windows.get((_window_owner(caller, session_id), session.version))
    if not isinstance(kept, KeptWindow) or kept.read.session.id != session.id:
        return None
    turns = kept.read.window
    if len(turns) != len(window) or any(a is not b for a, b in zip(turns, window, strict=True)):
        return None
    return kept


async def attached(db: AsyncSession, caller: Caller, session_id: str) -> Session:
    """The session row read through the request's transaction, for a build that writes it (a
    row deleted since the snapshot is created again, as for a first build)."""
    found = await sessions_store.get_session(db, caller.tenant_id, session_id)
    if found is not None:
        return found
    return await sessions_store.lock_or_create_session(db, caller.tenant_id, session_id)
