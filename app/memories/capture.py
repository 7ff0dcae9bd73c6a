"""What the user says about themselves becomes user memory: the profile facts and preferences
of the user turns an append stores ("I live in Paris", "we moved to Lyon", "我对花生过敏") are
written as user-scope items of the session's user, trusted (the user's own words) and dated by
the turn; said again, they are evidence for the item already there (`app.memories.tiers`). Runs
in the append's transaction: the items commit with their turns or not at all. Only the user's
turns count (a tool result or an assistant turn never becomes user memory this way), and not
those whose metadata says `"remember": false` (off the record)."""

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.core.cpu import off_loop
from app.domain.dates import said_at
from app.domain.text import lexical_document
from app.jobs.queue import TaskName, enqueue
from app.memories.service import (
    add_evidence,
    owner_lock,
    promote_after,
    refresh_notes_of,
    same_item,
    standing,
    supersede_replaced,
)
from app.memories.tiers import SAID, Evidence, on_the_record, profile_statements, stability
from app.store import memories as memories_store
from app.store.memories import Change
from app.store.models import Memory, Session, Turn

# A longer user turn is a pasted text (a letter, a page), not a statement about the user.
CAPTURE_MAX_CHARS = 2_000


async def capture_user_statements(
    db: AsyncSession, settings: Settings, session: Session, turns: Sequence[Turn]
) -> list[Memory]:
    """Write what the user turns state about the user; returns the items written. Nothing for
    a session without a user_id. The session row is locked by the caller."""
    if not session.user_id or not settings.memory.capture_user_statements:
        return []
    spoken = [
        turn
        for turn in sorted(turns, key=lambda t: t.seq)
        if turn.role == "user"
        and turn.trusted
        and len(turn.content) <= CAPTURE_MAX_CHARS
        and on_the_record(turn.metadata_)
    ]
    said = await off_loop(
        lambda: [(t, clause) for t in spoken for clause, _ in profile_statements(t.content)],
        chars=sum(len(t.content) for t in spoken),
    )
    if not said:
        return []
    await memories_store.lock_owner(db, owner_lock(session, "user"))
    written: list[Memory] = []
    for turn, clause in said:
        when = said_at(turn.metadata_, turn.created_at)
        seen = Evidence(SAID, str(session.id), when, (turn.seq,))
        items = await memories_store.owner_memories(db, session, "user", None)
        same = same_item(settings, clause, items, by_statement=True)
        if same is not None:
            await add_evidence(db, settings, same, seen)
            continue
        written.append(await _write(db, settings, session, clause, seen))
    if not written:  # more evidence changes no text the notes show
        return []
    await refresh_notes_of(db, session, user_scope=True)
    if settings.embedding.kind != "none":
        await enqueue(
            db,
            TaskName.EMBED_MEMORIES,
            {"memory_ids": [str(m.id) for m in written], "tenant_id": str(session.tenant_id)},
        )
    return written


async def _write(
    db: AsyncSession, settings: Settings, session: Session, text: str, seen: Evidence
) -> Memory:
    change = Change("user", None, f"said by the user (turn {seen.seqs[0]})")
    memory = await memories_store.insert_memory(
        db,
        {
            "tenant_id": session.tenant_id,
            "session_id": session.id,
            "user_id": session.user_id,
            "scope": "user",
            "text": text,
            "tags": [],
            "source": "user_turn",
            "turn_seqs": list(seen.seqs),
            "actor": "user",
            "trusted": True,
            "status": "active",
            **standing(stability([seen], promote_after(settings)), [seen]),
        },
        lexical_document(text),
        change,
    )
    await supersede_replaced(db, session, memory, change)
    return memory
