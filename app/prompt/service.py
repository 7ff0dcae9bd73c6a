"""build-prompt: gather C0, notes, recalled history and the window, then assemble within budget.

The order of work: (append x_t) → remember C0's size → emergency offload when the window no
longer fits → notes → recall (only once history was offloaded, in auto mode) → pure assembly.
Short sessions get exactly the baseline prompt and never touch the embedder or the indexes.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.schemas import Caller, Scope
from app.core.context import AppContext
from app.core.cpu import off_loop
from app.core.dates import said_at
from app.core.db import local_time_limits, read_once, release
from app.core.errors import BudgetExceeded, InvalidInput
from app.core.observability import after_response, text_fields
from app.core.tokens import message_tokens
from app.db.models import Session
from app.domain.budget import Budget, BudgetConfig, config_error_field
from app.domain.records import RecalledItem, TurnRecord
from app.memory.policy import normalise
from app.notes.policy import render_notes_block
from app.notes.schemas import Notes
from app.notes.service import NotesSnapshot, current_notes
from app.offload.service import inline_offload
from app.prompt import repository
from app.prompt.assembly import (
    AssembledPrompt,
    AssemblyInput,
    ManifestEntry,
    PromptTooLarge,
    assemble_prompt,
    mandatory_costs,
    tools_tokens,
)
from app.prompt.clearing import ToolClearing
from app.prompt.schemas import (
    BuildPromptRequest,
    BuildPromptResponse,
    ManifestItem,
    PromptUsage,
    RecalledItemOut,
    RecallReport,
    ToolResultsOptions,
)
from app.recall.rewrite import window_query
from app.recall.service import (
    MEMORY_PREFIX,
    QueryVectors,
    RecallOutcome,
    early_query_text,
    rank_user_memories,
    recall,
    recalled_item,
    show_best_turns,
)
from app.sessions import repository as sessions_repository
from app.sessions.schemas import AppendTurnsRequest, TurnIn, Usage, Watermark
from app.sessions.service import (
    append_turns,
    effective_config,
    observe_watermark,
    session_budget,
    write_session,
)

logger = logging.getLogger("contextd.prompt")
EMERGENCY_TOP_K = 2  # at the emergency ratio recall is tightened to this many items
# Hits cut down to their best turns per build: enough for the assembler to fill the budget when
# the first ones do not fit (its top-k counts what it includes, not what it tries).
SHOWN_PER_K = 3
SHOWN_MIN = 20
_MANIFEST_ITEMS = TypeAdapter(list[ManifestItem])


def system_messages(system: BuildPromptRequest) -> list[dict[str, Any]]:
    if isinstance(system.system, str):
        return [{"role": "system", "content": system.system}] if system.system else []
    return [m.model_dump() for m in system.system]


async def _remember_c0(db: AsyncSession, context: AppContext, session: Session, c0: int) -> None:
    """Store the system prompt's size (and the watermark state it implies) on the session; when
    the row is locked longer than the inline-offload budget, leave it for a later build."""
    try:
        async with db.begin_nested():
            await local_time_limits(db, context.settings.recall.emergency_offload_timeout_seconds)
            locked = await sessions_repository.lock_session_by_pk(db, session.id)
            if locked is None:
                return
            locked.c0_tokens = c0
            observation = await observe_watermark(
                db, session_budget(context.settings, locked), locked
            )
            await write_session(
                db, context.cache, locked, c0_tokens=c0, offload_armed=observation.armed
            )
    except SQLAlchemyError as exc:
        logger.warning("system prompt size not stored: %s", type(exc).__name__)
    await db.refresh(session)  # a rolled-back savepoint expires what it touched


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


@dataclass(frozen=True)
class Prefetched:
    """What `read_snapshot` found for a build without an append (None: no such session), read
    by the caller of `build_prompt` before it (build-prompt's direct route reads it while the
    request is counted against the rate limit)."""

    found: sessions_repository.SessionWindow | None


async def build_prompt(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    prefetched: Prefetched | None = None,
) -> BuildPromptResponse:
    """Two phases. Writes first, for keys with `sessions:write` (the appended query, the system
    prompt's size, an emergency offload), committed before anything waits on the network; a
    read-only key's build writes nothing (spec §10). Then reads, recall and assembly, holding no
    lock. `prefetched`: the session and its window already read (ignored with an append)."""
    vectors = QueryVectors(context)
    try:
        return await _build_prompt(db, context, caller, session_id, req, prefetched, vectors)
    finally:
        vectors.cancel()  # an embedding nothing awaited (recall failed before needing it)


async def _build_prompt(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    prefetched: Prefetched | None,
    vectors: QueryVectors,
) -> BuildPromptResponse:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    settings = context.settings
    fallbacks: list[str] = []
    writes = caller.has(Scope.WRITE)
    if req.append and req.query is None:
        raise InvalidInput("append needs a query to store", field="query")

    appended_seq: int | None = None
    if req.append:
        appended = await append_turns(
            db,
            caller,
            settings,
            context.cache,
            session_id,
            AppendTurnsRequest(turns=[TurnIn(role="user", content=req.query)]),
            None,
        )
        appended_seq = appended.response.turns[0].seq
    # Builds read without locking the session row (they would serialise behind appends); only a
    # first build of a new session creates it, and only for a key that may write. Without an
    # append the row and its window come in one statement, outside the request's transaction;
    # a build that turns out to write reads the row again through it (`_attached`).
    if req.append:
        snapshot = None
    elif prefetched is not None:
        snapshot = prefetched.found
    else:
        snapshot = await read_snapshot(context, caller, session_id)
    session = (
        snapshot.session
        if snapshot is not None
        else await sessions_repository.get_session(db, caller.tenant_id, session_id)
    )
    if session is None:
        if writes:
            session = await sessions_repository.lock_or_create_session(
                db, caller.tenant_id, session_id
            )
        else:
            session = _unsaved_session(caller.tenant_id, session_id)
    # The query's embedding starts now, on its encoder lane, when recall or the user's items
    # will want it: the rest of the build runs on the event loop meanwhile.
    early = early_query_text(context, req.query) if _embeds_query(session, req) else None
    if early is not None:
        vectors.start(early)
        # One turn of the event loop: the embedding's task sends its cache lookup now and reads
        # the answer at the build's next wait (the notes' read), so the encoder starts then, not
        # after the arms of recall, the first wait long enough otherwise.
        await asyncio.sleep(0)

    system = system_messages(req)
    query_text = req.query or ""
    c0, query_tokens = await off_loop(
        lambda: (
            sum(message_tokens("system", m["content"]) for m in system) + tools_tokens(req.tools),
            message_tokens("user", query_text) if req.query is not None else 0,
        ),
        chars=sum(len(m["content"]) for m in system) + len(query_text),
    )
    try:
        budget = (
            session_budget(settings, session)
            .with_counters(c0=c0)
            .with_window(req.context_limit, req.reserve_tokens)
        )
    except ValidationError as exc:
        field, message = config_error_field(exc)
        raise InvalidInput(message, field=field) from exc
    config = budget.config
    # A query that cannot fit even alone is refused before anything is stored.
    await _refuse_unfit(system, req, budget.available)
    # The system prompt's size is stored when it changes the budget: a session that never
    # reported it is budgeted with the configured assumption, and a build whose size is that
    # assumption (a first build without a system prompt, by default) writes nothing.
    if writes and session_budget(settings, session).c0 != c0:
        if snapshot is not None:
            session, snapshot = await _attached(db, caller, session_id), None
        await _remember_c0(db, context, session, c0)
    timings["prepare"] = _ms(started)
    stage = time.perf_counter()

    notes, notes_block, notes_tokens = await _current_notes(db, context, session)
    if session.offloaded_until_seq > notes.covers_until_seq:
        fallbacks.append("notes_stale")

    # The window no longer fits (worker behind) or sits in the emergency band: offload inline.
    budget = budget.with_counters(c2=notes_tokens)
    emergency = budget.level(extra=query_tokens) == "emergency"
    if emergency and session.c1_turns > 0:
        if not writes:
            fallbacks.append("emergency_offload_skipped")  # a read-only key moves nothing
        else:
            if snapshot is not None:
                session, snapshot = await _attached(db, caller, session_id), None
            freed = await inline_offload(
                db,
                settings,
                context.cache,
                session.id,
                trigger="emergency",
                until_tokens=max(budget.offload_goal(extra=query_tokens), 0),
            )
            if freed is None:
                fallbacks.append("emergency_offload_failed")
            elif freed:
                context.metrics.observe_offload("emergency", freed)
            await db.refresh(session)  # moved turns, or a rolled-back savepoint's expiry
    await release(db)  # no session lock is held past the write phase
    timings["notes_and_offload"] = _ms(stage)

    window = (
        snapshot.window
        if snapshot is not None
        else [
            t
            for t in await sessions_repository.window_turns(db, session.id)
            if t.seq != appended_seq
        ]
    )
    top_k = config.recall_top_k if req.recall.top_k is None else req.recall.top_k
    if emergency:
        top_k = min(top_k, EMERGENCY_TOP_K)
    budget_tokens = (
        config.recall_budget_tokens
        if req.recall.budget_tokens is None
        else req.recall.budget_tokens
    )

    stage = time.perf_counter()
    about, about_dropped = await _about_user(
        db, context, session, req, window, notes.notes, vectors
    )
    if about or about_dropped:
        timings["user_memory"] = _ms(stage)
    outcome, skipped = await _recall(db, context, session, req, window, fallbacks, vectors)
    if outcome is not None:
        timings.update({f"recall_{k}": v for k, v in outcome.timings_ms.items()})
        fallbacks.extend(f for f in outcome.fallbacks if f not in fallbacks)
    recalled: list[RecalledItem] = []
    if outcome is not None:
        shown = await show_best_turns(
            db, context, session, outcome, max(SHOWN_PER_K * top_k, SHOWN_MIN)
        )
        recalled = [recalled_item(hit) for hit in shown]

    stage = time.perf_counter()
    kept = (
        _kept_window(context, caller, session_id, session, window) if snapshot is not None else None
    )
    tail, chunk_of = await _offloaded_tail(context, session, budget, window, kept)
    assembly = AssemblyInput(
        system=system,
        turns=window,
        query=req.query,
        budget=budget.available,
        recall_budget_tokens=budget_tokens,
        top_k=top_k,
        per_item_max_tokens=settings.recall.per_item_max_tokens,
        tools=req.tools,
        notes_block=notes_block,
        recalled=recalled,
        about_user=about,
        about_user_budget_tokens=settings.recall.user_memory_budget_tokens,
        about_user_top_k=settings.recall.user_memory_top_k,
        format=req.format,
        tail=tail,
        chunk_of=chunk_of,
        clearing=_tool_clearing(config, req.tool_results),
        value_table_tokens=config.value_table_tokens,
    )
    assembled = await _assemble(assembly)
    timings["assemble"] = _ms(stage)
    fallbacks.extend(f for f in assembled.flags if f not in fallbacks)
    if context.cache.bypassed:
        fallbacks.append("cache_bypass")

    included = {item.chunk_id for item in assembled.recalled}
    manifest = _manifest_items(assembled, kept)
    # After the notes entry: each item the notes' token cap left out (no text, its turn has it).
    at = next((n + 1 for n, m in enumerate(manifest) if m.id == "notes"), len(manifest))
    manifest[at:at] = [
        ManifestItem(
            id=f"notes:{d.section}:{'memory' if d.seq is None else d.seq}",
            layer="c2",
            source=d.source,
            tokens=d.tokens,
            score=None,
            included=False,
            reason="notes_cap",
        )
        for d in notes.dropped
    ]
    manifest.extend(
        ManifestItem(
            id=item.chunk_id,
            layer="c2",
            source=item.source,
            tokens=0,
            score=item.score,
            included=False,
            reason="in_notes",
        )
        for item in about_dropped
    )
    if outcome is not None:
        manifest.extend(
            ManifestItem(
                id=hit.id.removeprefix(MEMORY_PREFIX),
                layer="c3",
                source=hit.source,
                tokens=0,
                score=hit.score,
                included=False,
                reason=reason,
            )
            for hit, reason in outcome.dropped
        )
    items = [
        RecalledItemOut(
            chunk_id=e.id,
            source="memory" if e.source == "memory" else "chunk",
            turn_range=_turn_range(recalled, e.id),
            turns=_shown_turns(assembled.recalled, e.id),
            score=e.score or 0.0,
            tokens=e.tokens,
        )
        for e in assembled.manifest
        if e.layer == "c3" and e.included and e.id in included
    ]
    stored = session_budget(settings, session)
    timings["total"] = _ms(started)
    build_id = uuid.uuid4()
    response = BuildPromptResponse(
        build_id=str(build_id),
        messages=assembled.messages,
        system=assembled.system,
        usage=PromptUsage(
            c0=assembled.usage["c0"],
            c1=assembled.usage["c1"],
            c2=assembled.usage["c2"],
            recall=assembled.usage["recall"],
            query=assembled.usage["query"],
            total=assembled.usage["total"],
            limit=budget.available,
        ),
        watermark=Watermark.of(stored),
        session_usage=Usage.of(stored),
        recall=RecallReport(
            query_raw=outcome.query.raw if outcome else None,
            query_rewritten=outcome.query.rewritten if outcome else None,
            skipped_reason=skipped,
            items=items,
        ),
        fallbacks=fallbacks,
        notes_version=notes.version,
        manifest=manifest,
        timings_ms=timings,
    )
    recall_hit = None if outcome is None else bool(items)

    def report() -> None:
        _log_build(caller, session_id, response, with_text=settings.log_text)
        context.metrics.observe_build(
            stage_timings_ms=timings,
            usage=assembled.usage,
            fallbacks=fallbacks,
            recall_hit=recall_hit,
        )

    after_response(report)  # over HTTP once the answer is sent: the client does not wait for it
    if writes and (req.persist_manifest or settings.recall.persist_manifests):
        await repository.store_build(
            db,
            build_id,
            session,
            response.model_dump(mode="json", exclude={"messages", "system"}),
            keep=settings.recall.manifests_kept_per_session,
        )
    return response


# The offloaded turns a build reads before its window: those that start within this many times
# what the window leaves of the budget, or within the budget (the shown ones, and more whose
# values the value table may list), at most `TAIL_MAX_TURNS` of them.
TAIL_READ_SHARE = 2
TAIL_MAX_TURNS = 200


async def _offloaded_tail(
    context: AppContext,
    session: Session,
    budget: Budget,
    window: Sequence[TurnRecord],
    kept: "_KeptWindow | None",
) -> tuple[list[TurnRecord], dict[int, str]]:
    """The newest offloaded turns (and their chunks by seq) that the build may show before the
    window, with old tool results as stubs, and whose values the value table may list, when the
    window holds a tool call or result. Read once per version of the session's row (`kept`: the
    window kept for it), like the window."""
    # Only a tool loop's prompt is filled with offloaded turns: a conversation's older turns
    # come back through recall, within B, as they always did (a 128k window filled with old
    # small talk would cost its user far more than it brings).
    in_loop = any(t.tool_calls or t.role == "tool" for t in window)
    if not session.offloaded_until_seq or not in_loop:
        return [], {}
    left = budget.available - budget.c0 - sum(t.token_count for t in window)
    tokens = max(TAIL_READ_SHARE * left, budget.available)
    if kept is not None and kept.tail is not None and kept.tail[0] == tokens:
        return kept.tail[1], kept.tail[2]
    # Only turns before the window's first: an offload that commits between the window's read
    # and this one has moved some of the window's turns, which must not be shown twice.
    before = window[0].seq
    found = await read_once(
        context.reader,
        lambda conn: sessions_repository.offloaded_tail(
            conn, session.id, before=before, tokens=tokens, turns=TAIL_MAX_TURNS
        ),
    )
    tail = [turn for turn, _ in found]
    chunk_of = {turn.seq: chunk for turn, chunk in found}
    if kept is not None:
        kept.tail = (tokens, tail, chunk_of)
    return tail, chunk_of


def _tool_clearing(config: BudgetConfig, options: ToolResultsOptions) -> ToolClearing:
    """The session's clearing controls with the build's overrides on top."""
    excluded = (
        config.tool_results_exclude_tools
        if options.exclude_tools is None
        else options.exclude_tools
    )
    return ToolClearing(
        keep=config.tool_results_keep if options.keep is None else options.keep,
        exclude_tools=frozenset(excluded),
        clear_at_least=(
            config.tool_results_clear_at_least
            if options.clear_at_least is None
            else options.clear_at_least
        ),
        clear_tool_inputs=(
            config.tool_results_clear_tool_inputs
            if options.clear_tool_inputs is None
            else options.clear_tool_inputs
        ),
    )


async def read_snapshot(
    context: AppContext, caller: Caller, session_id: str
) -> sessions_repository.SessionWindow | None:
    """The session and its window in one statement on the reader pool: one round trip. The
    window this process read last for the session is kept (`AppContext.windows`) and not read
    again while the session's row and version are the same (its JSON was ~0.8 ms of PostgreSQL
    and ~1.5 ms of this process a build for a 263-turn window). A forgotten turn's text leaves
    the process at the session's next build here, as the shown chunks' lines do."""
    owner = _window_owner(caller, session_id)
    latest = context.windows.latest(owner)
    kept: _KeptWindow | None = None if latest is None else latest[1]
    found = await read_once(
        context.reader,
        lambda conn: sessions_repository.session_with_window(
            conn, caller.tenant_id, session_id, None if kept is None else kept.read
        ),
    )
    if found is None:
        return None
    key = (owner, found.session.version)
    if latest is not None and latest[1].read.session.id == found.session.id and latest[0] == key[1]:
        context.windows.get(key)  # the kept window: most recently used
    else:
        context.windows.put(key, _KeptWindow(found))
    return found


def _window_owner(caller: Caller, session_id: str) -> str:
    return f"{caller.tenant_id}:{session_id}"


@dataclass(eq=False)
class _KeptWindow:
    """A session's window as read at one version of its row, and the manifest items of its turns
    once a build that included every turn made them (a pure function of the turns)."""

    read: sessions_repository.SessionWindow
    turn_items: list[ManifestItem] | None = None
    # The offloaded tail read at this version: (the tokens it was read for, turns, chunk ids).
    tail: tuple[int, list[TurnRecord], dict[int, str]] | None = None


def _kept_window(
    context: AppContext, caller: Caller, session_id: str, session: Session, window: list[Any]
) -> _KeptWindow | None:
    """The kept window this build's `window` is (the same turn records), if any."""
    kept = context.windows.get((_window_owner(caller, session_id), session.version))
    if not isinstance(kept, _KeptWindow) or kept.read.session.id != session.id:
        return None
    turns = kept.read.window
    if len(turns) != len(window) or any(a is not b for a, b in zip(turns, window, strict=True)):
        return None
    return kept


def _manifest_items(assembled: AssembledPrompt, kept: _KeptWindow | None) -> list[ManifestItem]:
    """The assembler's entries as response items, in one validation of plain dicts (a recall
    build has one per window turn, ~300: pydantic-core builds the list ~3x faster than
    `model_construct` builds each item in Python, and ~25x faster than the constructor). When
    the build's window is a kept one and every turn is in the prompt, the turns' items are the
    ones made for it before (validating them was ~0.5 ms a build)."""
    entries = assembled.manifest
    if kept is None or assembled.excluded_turns or assembled.tail_turns or assembled.cleared_turns:
        return _validated(entries)
    first = next((n for n, e in enumerate(entries) if e.layer == "c1"), len(entries))
    last = first + len(assembled.included_turns)
    if kept.turn_items is None:
        kept.turn_items = _validated(entries[first:last])
    return [*_validated(entries[:first]), *kept.turn_items, *_validated(entries[last:])]


def _validated(entries: list[ManifestEntry]) -> list[ManifestItem]:
    return _MANIFEST_ITEMS.validate_python(
        [
            {
                "id": e.id,
                "layer": e.layer,
                "source": e.source,
                "tokens": e.tokens,
                "score": None if e.score is None else float(e.score),
                "included": e.included,
                "reason": e.reason,
                "chunk_id": e.chunk_id,
            }
            for e in entries
        ]
    )


@dataclass(frozen=True)
class _KeptNotes:
    """A session's notes at one version as a build uses them: the snapshot, its block and the
    block's tokens (a version's notes never change)."""

    notes: NotesSnapshot
    block: str
    tokens: int


async def _current_notes(
    db: AsyncSession, context: AppContext, session: Session
) -> tuple[NotesSnapshot, str, int]:
    """The notes the session row names (`current_notes`), rendered and counted, kept per
    process by the session's notes version (`AppContext.notes`): a build of a session whose
    notes did not change reads, parses, renders and counts nothing. Only the version the row
    names is kept (version 0, no notes yet, is read from nothing); a forget writes a new
    version, and the old one leaves the process at the session's next build here."""
    key = (str(session.id), session.notes_version)
    kept = context.notes.get(key) if session.notes_version else None
    if kept is None:
        notes = await current_notes(db, context.cache, session)
        block = render_notes_block(notes.notes)
        kept = _KeptNotes(notes, block, message_tokens("system", block) if block else 0)
        if notes.version == session.notes_version and notes.version:
            context.notes.put(key, kept)
    return kept.notes, kept.block, kept.tokens


async def _attached(db: AsyncSession, caller: Caller, session_id: str) -> Session:
    """The session row read through the request's transaction, for a build that writes it (a
    row deleted since the snapshot is created again, as for a first build)."""
    found = await sessions_repository.get_session(db, caller.tenant_id, session_id)
    if found is not None:
        return found
    return await sessions_repository.lock_or_create_session(db, caller.tenant_id, session_id)


async def _assemble(assembly: AssemblyInput) -> AssembledPrompt:
    """`assemble_prompt`, off the event loop for long text (the Anthropic format counts the
    window's text again; the system prompt and query are counted in either)."""
    chars = _mandatory_chars(assembly.system, assembly.query)
    if assembly.format == "anthropic":
        chars += sum(len(t.content) for t in assembly.turns)
    try:
        return await off_loop(lambda: assemble_prompt(assembly), chars=chars)
    except PromptTooLarge as exc:
        raise _budget_exceeded(exc) from exc


async def _refuse_unfit(system: list[dict[str, Any]], req: BuildPromptRequest, budget: int) -> None:
    """The 422 `_assemble` would answer when the system prompt, tools and query alone exceed
    `budget`, from their costs only (assembling a prompt of them was as dear as the build's)."""
    try:
        await off_loop(
            lambda: mandatory_costs(system, req.tools, req.query, budget, req.format),
            chars=_mandatory_chars(system, req.query),
        )
    except PromptTooLarge as exc:
        raise _budget_exceeded(exc) from exc


def _mandatory_chars(system: Sequence[Mapping[str, Any]], query: str | None) -> int:
    return len(query or "") + sum(len(str(m["content"])) for m in system)


def _budget_exceeded(exc: PromptTooLarge) -> BudgetExceeded:
    return BudgetExceeded(
        f"{exc}: the system prompt, tools and query alone do not fit",
        field="query",
        details={"needed": exc.needed, "available": exc.available, "parts": exc.parts},
    )


async def _about_user(
    db: AsyncSession,
    context: AppContext,
    session: Any,
    req: BuildPromptRequest,
    window: list[Any],
    notes: Notes,
    vectors: QueryVectors,
) -> tuple[list[RecalledItem], list[RecalledItem]]:
    """The remembered items of the session's user (scope user), ranked against the query, from
    the session's first turn on; (offered, left out because the notes already hold them).
    Nothing at all for a session without a user_id (its prompt stays the baseline)."""
    if not session.user_id or req.recall.mode == "never":
        return [], []
    query = req.query
    if query is None:
        query = window_query(window) or ""
    try:
        async with db.begin_nested():
            ranked = await rank_user_memories(db, context, session, query, [], vectors)
    except Exception:  # the user's items are an extra: their failure never fails the build
        logger.exception("user memories unavailable")
        return [], []
    in_notes = {normalise(item.text) for item in notes.remembered}
    offered: list[RecalledItem] = []
    dropped: list[RecalledItem] = []
    for r in ranked:
        item = RecalledItem(
            chunk_id=str(r.memory.id),
            text=r.memory.text,
            ts=r.memory.created_at,
            trusted=r.memory.trusted,
            score=r.score,
            source="user_memory",
        )
        (dropped if normalise(r.memory.text) in in_notes else offered).append(item)
    return offered, dropped


async def _recall(
    db: AsyncSession,
    context: AppContext,
    session: Any,
    req: BuildPromptRequest,
    window: list[Any],
    fallbacks: list[str],
    vectors: QueryVectors,
) -> tuple[RecallOutcome | None, str | None]:
    """Run the recall chain when the mode and the session call for it; never fail the build."""
    if req.recall.mode == "never":
        return None, "mode_never"
    if req.recall.mode == "auto" and not _has_history(session):
        return None, "no_history"
    query = req.query
    if query is None:
        query = window_query(window)
    if not query:
        return None, "no_query"
    candidates = (
        req.recall.candidates or effective_config(context.settings, session).recall_candidates
    )
    recent = [t.content for t in window[-2:]]
    try:
        outcome = await recall(
            db,
            context,
            session,
            query,
            recent_turns=recent,
            candidates=candidates,
            window_seqs={t.seq for t in window},
            # Remembered items reach the prompt through the notes and the "about this user"
            # block, not as recalled history.
            include_memories=False,
            now=said_at(window[-1].metadata, window[-1].created_at) if window else None,
            query_vectors=vectors,
        )
    except Exception:  # any failure of the recall chain degrades to C0 + C1 + C2, never a 500
        logger.exception("recall unavailable")
        await db.rollback()  # only reads since the write phase committed
        fallbacks.append("recall_unavailable")
        return None, "recall_unavailable"
    return outcome, None


def _embeds_query(session: Any, req: BuildPromptRequest) -> bool:
    """Whether recall (`_recall`) or the user's items (`_about_user`) will embed the query (a
    session without chunks yet that gets some from this build's emergency offload is recalled
    too: recall then starts the embedding itself)."""
    if req.recall.mode == "never":
        return False
    return bool(session.user_id) or req.recall.mode != "auto" or _has_history(session)


def _has_history(session: Any) -> bool:
    """Whether the session has offloaded turns to recall. Chunks alone are not enough: those of
    a huge tool result layered on arrival belong to a turn still in the window, which recall
    leaves out."""
    return bool(session.chunk_count and session.offloaded_until_seq)


def _turn_range(items: list[RecalledItem], item_id: str) -> list[int] | None:
    for item in items:
        if item.chunk_id == item_id and item.turn_first is not None and item.turn_last is not None:
            return [item.turn_first, item.turn_last]
    return None


def _shown_turns(items: list[RecalledItem], item_id: str) -> list[int] | None:
    for item in items:
        if item.chunk_id == item_id and item.seqs is not None:
            return list(item.seqs)
    return None


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


def _log_build(
    caller: Caller, session_id: str, response: BuildPromptResponse, *, with_text: bool
) -> None:
    """One structured line per build with the fields of spec §7 and the tenant (over HTTP it
    stands for the access line too: `timings_ms.total` is the server's time); the query as its
    length and hash unless conversation text is logged on purpose (CONTEXTD_LOG_TEXT)."""
    logger.info(
        "build_prompt",
        extra={
            "tenant": caller.tenant_name,
            "session": session_id,
            "build_id": response.build_id,
            "usage_ratio": response.watermark.ratio,
            **text_fields("query_raw", response.recall.query_raw, with_text=with_text),
            **text_fields("query_rewritten", response.recall.query_rewritten, with_text=with_text),
            "recall_ids": [i.chunk_id for i in response.recall.items],
            "rerank_scores": [i.score for i in response.recall.items],
            "final_k": len(response.recall.items),
            "timings_ms": response.timings_ms,
            "fallbacks": response.fallbacks,
            "tokens_total": response.usage.total,
        },
    )
