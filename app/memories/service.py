"""Remembered items written and read: `remember` (the memory tool's, and the API's with its
provenance), the list and one item, now or as of a date. Writes happen in the request's
transaction (the outer layer commits once) and enqueue their follow-up jobs in it; changes of
an item's lifecycle are in `app.memories.lifecycle`.
"""

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.chat import ChatEndpoint
from app.core.config import Settings
from app.core.context import AppContext
from app.core.errors import InvalidInput, NotFound, TooLong
from app.core.ratelimit import WINDOW_SECONDS, rate_limited
from app.domain.callers import Caller
from app.domain.text import lexical_document
from app.http.pagination import Page, created_after, created_cursor, page_of
from app.jobs.queue import TaskName, enqueue, session_args, session_lock
from app.memories.conflict_judge import judged_contradiction
from app.memories.conflicts import contradicts, judge_candidates
from app.memories.policy import (
    expiry,
    initial_status,
    near_duplicate,
    stated_until,
    trusted_source,
    validity_error,
)
from app.memories.schemas import (
    MemoryIn,
    MemoryList,
    MemoryOut,
    MemoryWritten,
    Provenance,
    RememberRequest,
)
from app.memories.tiers import (
    CONFIRMED,
    WRITTEN,
    Claim,
    Evidence,
    Stability,
    compacted,
    last_seen,
    prevails,
    ranking_weight,
    same_statement,
    stability,
)
from app.store import memories as memories_store
from app.store import sessions as sessions_store
from app.store.memories import Change, stated_at
from app.store.models import MEMORY_INJECTED, Memory, Session, SessionKey
from app.store.sessions import require_session

USER_SESSIONS_REFRESHED = 50  # notes of at most this many of a user's sessions refreshed per write


@dataclass(frozen=True, slots=True)
class Remembered:
    memory: Memory
    outcome: str  # stored, candidate, superseded or duplicate
    previous: Memory | None  # the value it replaces along its key
    replaced: list[Memory]  # every item it superseded: its key's values, what it contradicts


async def remember(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    request: RememberRequest,
    provenance: Provenance,
) -> tuple[str, dict[str, Any]]:
    """The memory tool's `remember`: (answer text, answer data)."""
    done = await store_item(db, context, session, request, provenance)
    memory, previous = done.memory, done.previous
    data = {**_memory_data(memory), "outcome": done.outcome}
    if done.outcome == "duplicate":
        return (
            f"Already remembered (id {memory.id}): {memory.text!r}. Nothing new was stored.",
            data,
        )
    if done.outcome == "candidate":
        return (
            f"Stored as {memory.status} (id {memory.id}, source {memory.source}): it is not "
            "stated as a fact until it is verified.",
            data,
        )
    until = (
        f" It holds until {memory.valid_until:%Y-%m-%d %H:%M} UTC."
        if memory.valid_until is not None
        else ""
    )
    if previous is not None:
        return (
            f"Remembered (id {memory.id}, key {request.key!r}, version {memory.version}); "
            f"it replaces the previous value {previous.text!r}.{until}",
            data,
        )
    if done.replaced:
        replaced = "; ".join(repr(m.text) for m in done.replaced)
        return (
            f"Remembered (id {memory.id}, scope {memory.scope}): {memory.text!r}; it replaces "
            f"{replaced}, which it contradicts.{until}",
            data,
        )
    return f"Remembered (id {memory.id}, scope {memory.scope}): {memory.text!r}.{until}", data


def checked_text(settings: Settings, raw: str | None) -> str:
    text = " ".join((raw or "").split())
    if not text:
        raise InvalidInput("text is empty", field="text")
    if len(text) > settings.memory.remember_max_chars:
        raise TooLong(
            f"text is {len(text)} characters; remember keeps at most "
            f"{settings.memory.remember_max_chars} (store one short point, not a transcript)",
            field="text",
        )
    return text


def check_validity(valid_from: datetime | None, valid_until: datetime | None) -> None:
    problem = validity_error(valid_from, valid_until)
    if problem is not None:
        raise InvalidInput(problem, field="valid_until")


async def store_item(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    request: RememberRequest,
    provenance: Provenance,
) -> Remembered:
    """A new remembered item with its provenance (or the one that already says it). A trusted
    item is active at once and replaces the live value of its key; an untrusted one waits as a
    candidate and replaces it only once verified."""
    settings = context.settings
    text = checked_text(settings, request.text)
    scope = request.scope or "session"
    if scope == "user" and not session.user_id:
        raise InvalidInput(
            "scope 'user' needs the session's user_id (set it with PUT /v1/sessions/{id})",
            field="scope",
        )
    now = datetime.now(UTC)
    # A validity the caller gave wins; else the one the text states ("until Friday").
    valid_until = provenance.valid_until or stated_until(text, now)
    check_validity(provenance.valid_from, valid_until)
    tags = sorted({t.strip()[:64] for t in request.tags or [] if t.strip()})
    await _check_rate(db, context, session)
    status = "quarantined" if provenance.echoes_orders else initial_status(provenance.source, text)
    # Only a fact replaces what it contradicts (`supersede_replaced`).
    judged = (
        await judged_contradicted(db, context, session, scope, text)
        if status in MEMORY_INJECTED
        else frozenset()
    )
    session = await locked_session(db, session)
    await memories_store.lock_owner(db, owner_lock(session, scope))
    existing = await memories_store.owner_memories(db, session, scope, request.key)
    same = same_item(settings, text, existing, by_statement=scope == "user")
    # Said again, written down or confirmed: evidence for a user-scope item (`tiers`).
    seen = Evidence(
        CONFIRMED if provenance.actor == "user" else WRITTEN,
        str(session.id),
        now,
        provenance.turn_seqs,
    )
    if same is not None:
        if scope == "user":
            await add_evidence(db, settings, same, seen)
        return Remembered(same, "duplicate", None, [])
    previous: Memory | None = existing[-1] if request.key is not None and existing else None
    earned = stability([seen], promote_after(settings)) if scope == "user" else None
    why = f"written ({provenance.source})"
    if provenance.echoes_orders:
        why += f"; quarantined: it repeats a {provenance.source_tool} result that gives orders"
    elif status == "quarantined":
        why += "; quarantined: its text gives orders to the model"
    change = Change(provenance.actor, provenance.key_id, why)
    memory = await memories_store.insert_memory(
        db,
        {
            "tenant_id": session.tenant_id,
            "session_id": session.id,
            "user_id": session.user_id,
            "scope": scope,
            "key": request.key,
            "text": text,
            "tags": tags,
            "source": provenance.source,
            "source_tool": provenance.source_tool,
            "turn_seqs": list(provenance.turn_seqs),
            "actor": provenance.actor,
            "actor_key_id": provenance.key_id,
            # An explicit `remember` is trusted although the model may have copied it from a
            # tool result it read: the source "remember" says the agent wrote it (and
            # `source_tool` which result it repeats, when it repeats one still in the window).
            "trusted": trusted_source(provenance.source) and status != "quarantined",
            "status": status,
            "version": previous.version + 1 if previous else 1,
            "supersedes": previous.id if previous else None,
            "valid_from": provenance.valid_from,
            "valid_until": valid_until,
            "expires_at": expiry(now, provenance.ttl_seconds),
            **(standing(earned, [seen]) if earned is not None else {}),
        },
        lexical_document(text),
        change,
    )
    replaced = await supersede_replaced(db, session, memory, change, judged=judged)
    await refresh_notes_of(db, session, user_scope=scope == "user")
    if settings.embedding.kind != "none":
        await enqueue(
            db,
            TaskName.EMBED_MEMORIES,
            {"memory_ids": [str(memory.id)], "tenant_id": str(memory.tenant_id)},
        )
    if status not in MEMORY_INJECTED:
        return Remembered(memory, "candidate", previous, [])
    return Remembered(memory, "superseded" if replaced else "stored", previous, replaced)


def owner_lock(session: Session, scope: str) -> str:
    """The advisory lock that serialises the writers of one owner's items."""
    if scope == "user":
        return f"memory:{session.tenant_id}:user:{session.user_id}"
    return f"memory:session:{session.id}"


def same_item(
    settings: Settings, text: str, items: list[Memory], *, by_statement: bool
) -> Memory | None:
    """The item of `items` that says what `text` says: near the same words, or (`by_statement`)
    the same slot and value ("I live in Lyon", "we moved to Lyon")."""
    same = near_duplicate(text, [(str(m.id), m.text) for m in items], settings.memory.dedup_jaccard)
    if same is not None:
        return next(m for m in items if str(m.id) == same)
    if by_statement:
        return next((m for m in items if same_statement(m.text, text)), None)
    return None


def promote_after(settings: Settings) -> timedelta:
    return timedelta(days=settings.memory.promote_after_days)


def evidence_of(memory: Memory) -> list[Evidence]:
    return [Evidence.of_json(e) for e in memory.evidence]


async def add_evidence(
    db: AsyncSession, settings: Settings, memory: Memory, seen: Evidence
) -> None:
    """One more sighting of a user-scope item; when it earns the item its promotion, the
    change is a version saying which evidence."""
    evidence = compacted([*evidence_of(memory), seen])
    earned = stability(evidence, promote_after(settings))
    promoted = memory.tier != earned.tier
    await memories_store.set_evidence(
        db,
        memory,
        [e.as_json() for e in evidence],
        (earned.tier, earned.score, earned.reasons),
        Change("rule", None, f"promoted {earned.tier}: {', '.join(earned.reasons)}")
        if promoted
        else None,
    )


def standing(earned: Stability, evidence: list[Evidence]) -> dict[str, Any]:
    """The tier columns of a new user-scope item."""
    return {
        "tier": earned.tier,
        "evidence": [e.as_json() for e in evidence],
        "stability": earned.score,
        "stable_by": list(earned.reasons),
    }


def claim(memory: Memory) -> Claim:
    """What precedence weighs of an item: its trust and when it was last said."""
    return Claim(memory.trusted, last_seen(evidence_of(memory), memory.created_at))


def user_memory_weight(settings: Settings, memory: Memory, now: datetime) -> float:
    """What a user-scope item's relevance is multiplied by when a build ranks it (1.0 for an
    item with no tier): its stability, and its decay after `memory.decay_days` unseen."""
    if memory.tier is None or memory.stability is None:
        return 1.0
    return ranking_weight(
        memory.stability,
        last_seen(evidence_of(memory), memory.created_at),
        now,
        timedelta(days=settings.memory.decay_days),
        settings.memory.stale_weight,
    )


async def user_memory_disputes(
    db: AsyncSession, session: Session, facts: list[Memory]
) -> dict[uuid.UUID, list[Memory]]:
    """The unconfirmed items of the session's user (a tool's word, an inference) that
    contradict each of `facts`: precedence keeps them out of force, and the prompt shows them
    beside the fact, dated, never as current."""
    if not facts or not session.user_id:
        return {}
    unconfirmed = await memories_store.owner_unconfirmed(db, session, "user")
    found = {fact.id: [m for m in unconfirmed if contradicts(fact.text, m.text)] for fact in facts}
    return {fact_id: items for fact_id, items in found.items() if items}


async def locked_session(db: AsyncSession, session: Session) -> Session:
    """The session row locked before its items (the lock order of `app.store`): an erase of
    the session tombstones its items under that lock."""
    locked = await sessions_store.lock_session_by_pk(db, session.tenant_id, session.id)
    if locked is None or sessions_store.erasing(locked):
        raise NotFound(f"session {session.external_id!r} not found", field="session_id")
    return locked


async def supersede_replaced(
    db: AsyncSession,
    session: Session,
    memory: Memory,
    change: Change,
    *,
    said_at: datetime | None = None,
    judged: frozenset[uuid.UUID] = frozenset(),
) -> list[Memory]:
    """Once an item is a fact, it supersedes the other live values of its key and the items of
    its owner it contradicts (`app.memories.conflicts`: "I live in Paris" … "we moved to Lyon",
    预算 5 万 … 预算改成 8 万) as precedence says (`app.memories.tiers.prevails`): a fact is
    trusted or verified, so it outranks a candidate (an inference, a tool's word), and between
    facts the newer wins — when it was said (`said_at`, else its last evidence) is what counts,
    so a statement dated before the fact it contradicts is kept as history. `judged`: the items
    the LLM conflict judge said it contradicts (`judged_contradicted`, asked before the write's
    locks). Returns the items it superseded."""
    if memory.status not in MEMORY_INJECTED:
        return []
    keyed = await memories_store.live_keyed_memories(db, memory, session) if memory.key else []
    seen = {m.id for m in keyed} | {memory.id}
    # In force, or a candidate an explicit statement outranks (an inference, a tool's word).
    others = [
        *await memories_store.owner_memories(db, session, memory.scope, None),
        *await memories_store.owner_unconfirmed(db, session, memory.scope),
    ]
    unkeyed = [m for m in others if m.id not in seen]
    by_rules = [m for m in unkeyed if contradicts(m.text, memory.text)]
    by_judge = [m for m in unkeyed if m.id in judged and m not in by_rules]
    contradicted = by_rules + by_judge
    newer = claim(memory) if said_at is None else Claim(memory.trusted, said_at)
    if any(m.status in MEMORY_INJECTED and not prevails(newer, claim(m)) for m in contradicted):
        # Said before what it contradicts (a turn dated earlier, appended late): history.
        await memories_store.set_memory_status(
            db,
            memory.tenant_id,
            [memory.id],
            "superseded",
            Change("rule", None, "older than what it contradicts"),
        )
        await db.refresh(memory)
        return []
    replaced = keyed + [m for m in by_rules if prevails(newer, claim(m))]
    replaced_by_judge = [m for m in by_judge if prevails(newer, claim(m))]
    for items, why in (
        (replaced, f"replaced by {memory.id}"),
        (replaced_by_judge, f"replaced by {memory.id}, judged by the LLM to contradict it"),
    ):
        if items:
            await memories_store.set_memory_status(
                db,
                memory.tenant_id,
                [m.id for m in items],
                "superseded",
                Change(change.actor, change.key_id, why),
            )
    return replaced + replaced_by_judge


async def judged_contradicted(
    db: AsyncSession, context: AppContext, session: Session, scope: str, text: str
) -> frozenset[uuid.UUID]:
    """The ids of the owner's items the LLM conflict judge says `text` contradicts, when it is
    configured: only items the rules are silent about, at most `conflict_llm_candidates`, asked
    at once; a failed judgement is a "no". Called before the write locks its session and owner:
    the judge may take its whole timeout, and an append to the session must not wait for it. An
    item written meanwhile is not judged (the rules still are); `supersede_replaced` acts only
    on the judged items still in force under the locks."""
    settings = context.settings.memory
    if not settings.conflict_llm_base_url:
        return frozenset()
    endpoint = ChatEndpoint(
        settings.conflict_llm_base_url,
        settings.conflict_llm_model,
        settings.conflict_llm_api_key,
        settings.conflict_llm_timeout_seconds,
    )
    others = [
        *await memories_store.owner_memories(db, session, scope, None),
        *await memories_store.owner_unconfirmed(db, session, scope),
    ]
    asked = [
        others[i]
        for i in judge_candidates(text, [m.text for m in others], settings.conflict_llm_candidates)
    ]
    verdicts = await asyncio.gather(
        *(judged_contradiction(context.http, endpoint, m.text, text) for m in asked)
    )
    return frozenset(m.id for m, contradicted in zip(asked, verdicts, strict=True) if contradicted)


async def _check_rate(db: AsyncSession, context: AppContext, session: Session) -> None:
    limit = context.settings.memory.remember_per_minute
    count = await context.rate_limiter.hit_session(
        "remember", session.tenant_id, session.external_id
    )
    if context.cache.bypassed:  # Redis down: what every process wrote shows in Postgres
        since = datetime.now(UTC) - timedelta(seconds=WINDOW_SECONDS)
        count = max(
            count,
            await memories_store.memories_written_since(db, session.tenant_id, session.id, since)
            + 1,
        )
    if count > limit:
        raise rate_limited("remember calls per session", limit, "type")


def _memory_data(memory: Memory) -> dict[str, Any]:
    return {
        "memory_id": str(memory.id),
        "text": memory.text,
        "key": memory.key,
        "scope": memory.scope,
        "tags": list(memory.tags),
        "version": memory.version,
        "supersedes": str(memory.supersedes) if memory.supersedes else None,
        "status": memory.status,
        "revision": memory.revision,
        "source": memory.source,
        "trusted": memory.trusted,
        "valid_until": memory.valid_until.isoformat() if memory.valid_until else None,
    }


async def refresh_notes_of(db: AsyncSession, session: Session, *, user_scope: bool) -> None:
    """Enqueue a notes refresh (the `remembered` section) for the session, and for the user's
    other sessions when a user-scope item changed."""
    targets = [session.id]
    if user_scope and session.user_id:
        others = await sessions_store.user_session_ids(
            db, session.tenant_id, session.user_id, USER_SESSIONS_REFRESHED
        )
        targets.extend(pk for pk in others if pk != session.id)
    for pk in targets:
        await enqueue(
            db,
            TaskName.REFRESH_NOTES,
            session_args(SessionKey(session.tenant_id, pk)),
            lock=session_lock(pk),
            queueing_lock=f"notes:{pk}",
        )


async def list_memories(
    db: AsyncSession,
    caller: Caller,
    session_id: str,
    page: Page,
    *,
    include_superseded: bool,
    as_of: datetime | None = None,
) -> MemoryList:
    """The items the session sees; `as_of` a date, those stated as facts then, as they were."""
    session = await require_session(db, caller, session_id)
    if as_of is not None:
        return await _list_as_of(db, session, page, as_of)
    rows = await memories_store.list_memories(
        db,
        session,
        include_superseded=include_superseded,
        after=created_after(page),
        limit=page.fetch,
    )
    shown, next_cursor = page_of(rows, page, lambda m: created_cursor(m.created_at, m.id))
    now = datetime.now(UTC)
    return MemoryList(
        memories=[MemoryOut.of(m, session, stated_at(m, now)) for m in shown],
        next_cursor=next_cursor,
    )


async def _list_as_of(db: AsyncSession, session: Session, page: Page, at: datetime) -> MemoryList:
    after = created_after(page)
    rows = [
        (memory, then)
        for memory, then in await memories_store.memories_as_of(db, session, at)
        if stated_at(then, at) and (after is None or (memory.created_at, memory.id) > after)
    ][: page.fetch]
    shown, next_cursor = page_of(rows, page, lambda r: created_cursor(r[0].created_at, r[0].id))
    return MemoryList(
        memories=[MemoryOut.of(m, session, True, then) for m, then in shown],
        next_cursor=next_cursor,
    )


async def get_memory(
    db: AsyncSession,
    caller: Caller,
    session_id: str,
    memory_id: uuid.UUID,
    as_of: datetime | None = None,
) -> MemoryOut:
    """One item the session sees, whatever its status; `as_of` a date, as it was then."""
    session = await require_session(db, caller, session_id)
    if as_of is not None:
        found = await memories_store.memories_as_of(db, session, as_of, memory_id)
        if not found:
            raise NotFound(
                f"memory {memory_id} did not exist at {as_of.isoformat()}", field="memory_id"
            )
        item, then = found[0]
        return MemoryOut.of(item, session, stated_at(then, as_of), then)
    memory = await memories_store.find_memory(db, session, memory_id)
    if memory is None:
        raise NotFound(f"memory {memory_id} not found", field="memory_id")
    return MemoryOut.of(memory, session, stated_at(memory, datetime.now(UTC)))


async def create_memory(
    db: AsyncSession, context: AppContext, caller: Caller, session_id: str, body: MemoryIn
) -> MemoryWritten:
    """An item written through the API, its provenance given; the writer is the API key."""
    session = await require_session(db, caller, session_id)
    provenance = Provenance(
        source=body.source,
        actor=body.actor,
        key_id=caller.key_id,
        source_tool=body.source_tool,
        turn_seqs=tuple(body.turn_seqs),
        valid_from=body.valid_from,
        valid_until=body.valid_until,
        ttl_seconds=body.ttl_seconds,
    )
    done = await store_item(db, context, session, body, provenance)
    memory = done.memory
    return MemoryWritten(
        outcome=done.outcome,
        memory=MemoryOut.of(memory, session, stated_at(memory, datetime.now(UTC))),
    )
