"""What a build gathers around its window before assembly: the notes (and an emergency offload
when the window no longer fits), the items remembered about the user, recalled history, the
offloaded tail a tool loop shows, and the tool-result clearing controls."""

import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.db import read_once, release
from app.domain.budget import Budget, BudgetConfig
from app.domain.callers import Caller
from app.domain.dates import said_at
from app.domain.records import RecalledItem, TurnRecord
from app.domain.tokens import message_tokens
from app.memories.policy import normalise
from app.memories.service import claim, user_memory_disputes, user_memory_weight
from app.memories.tiers import dispute, disputed_fact
from app.notes.policy import render_notes_block
from app.notes.schemas import Notes
from app.notes.service import NotesSnapshot, current_notes, in_force_at
from app.offload.service import inline_offload
from app.prompt.clearing import ToolClearing
from app.prompt.prepare import BuildState, elapsed_ms, has_history
from app.prompt.schemas import BuildPromptRequest, ManifestItem, ToolResultsOptions
from app.prompt.snapshot import KeptWindow, attached
from app.recall.hits import MEMORY_PREFIX, RecallHit, RecallOutcome, recalled_item
from app.recall.memory_arms import RankedMemory, rank_user_memories
from app.recall.query_vectors import QueryVectors
from app.recall.rewrite import window_query
from app.recall.service import recall
from app.recall.shown import show_best_turns
from app.store import turns as turns_store
from app.store.models import Memory, Session
from app.store.sessions import effective_config

logger = logging.getLogger("contextd.prompt")
EMERGENCY_TOP_K = 2  # at the emergency ratio recall is tightened to this many items
# Hits cut down to their best turns per build: enough for the assembler to fill the budget when
# the first ones do not fit (its top-k counts what it includes, not what it tries).
SHOWN_PER_K = 3
SHOWN_MIN = 20
# The offloaded turns a build reads before its window: those that start within this many times
# what the window leaves of the budget, or within the budget (the shown ones, and more whose
# values the value table may list), at most `TAIL_MAX_TURNS` of them.
TAIL_READ_SHARE = 2
TAIL_MAX_TURNS = 200


@dataclass(frozen=True)
class KeptNotes:
    """A session's notes at one version as a build uses them: the snapshot, its block and the
    block's tokens (a version's notes never change)."""

    notes: NotesSnapshot
    block: str
    tokens: int


async def notes_and_emergency(
    db: AsyncSession, context: AppContext, caller: Caller, session_id: str, build: BuildState
) -> KeptNotes:
    """The session's notes; then, when the window no longer fits (worker behind) or sits in the
    emergency band, an inline offload. Ends the write phase: no session lock is held past it."""
    notes = await _current_notes(db, context, build.session)
    if build.session.offloaded_until_seq > notes.notes.covers_until_seq:
        build.fallbacks.append("notes_stale")

    # The window no longer fits (worker behind) or sits in the emergency band: offload inline.
    build.budget = build.budget.with_counters(c2=notes.tokens)
    build.emergency = build.budget.level(extra=build.query_tokens) == "emergency"
    if build.emergency and build.session.c1_turns > 0:
        if not build.writes:
            build.fallbacks.append("emergency_offload_skipped")  # a read-only key moves nothing
        else:
            await _offload_inline(db, context, caller, session_id, build)
    await release(db)  # no session lock is held past the write phase
    return notes


async def _offload_inline(
    db: AsyncSession, context: AppContext, caller: Caller, session_id: str, build: BuildState
) -> None:
    if build.snapshot is not None:
        build.session, build.snapshot = await attached(db, caller, session_id), None
    freed = await inline_offload(
        db,
        context.settings,
        context.cache,
        build.session.tenant_id,
        build.session.id,
        trigger="emergency",
        until_tokens=max(build.budget.offload_goal(extra=build.query_tokens), 0),
    )
    if freed is None:
        build.fallbacks.append("emergency_offload_failed")
    elif freed:
        context.metrics.observe_offload("emergency", freed)
    await db.refresh(build.session)  # moved turns, or a rolled-back savepoint's expiry


async def _current_notes(db: AsyncSession, context: AppContext, session: Session) -> KeptNotes:
    """The notes the session row names (`current_notes`), rendered and counted, kept per
    process by the session's notes version (`AppContext.notes`): a build of a session whose
    notes did not change reads, parses, renders and counts nothing. Only the version the row
    names is kept (version 0, no notes yet, is read from nothing); a forget writes a new
    version, and the old one leaves the process at the session's next build here."""
    key = (str(session.id), session.notes_version)
    kept = context.notes.get(key) if session.notes_version else None
    now = datetime.now(UTC)  # a remembered item whose validity ended leaves the block now
    if kept is None or kept.notes.notes.lapses_by(now):
        notes = in_force_at(await current_notes(db, context.cache, session), now)
        block = render_notes_block(notes.notes)
        kept = KeptNotes(notes, block, message_tokens("system", block) if block else 0)
        if notes.version == session.notes_version and notes.version:
            context.notes.put(key, kept)
    return kept


def recall_limits(
    config: BudgetConfig, req: BuildPromptRequest, emergency: bool
) -> tuple[int, int]:
    """Recall's top-k (tightened at the emergency ratio) and its budget B, with the build's
    overrides."""
    top_k = config.recall_top_k if req.recall.top_k is None else req.recall.top_k
    if emergency:
        top_k = min(top_k, EMERGENCY_TOP_K)
    budget_tokens = (
        config.recall_budget_tokens
        if req.recall.budget_tokens is None
        else req.recall.budget_tokens
    )
    return top_k, budget_tokens


@dataclass(frozen=True)
class Gathered:
    """The remembered items and recalled history a build offers the assembler."""

    about: list[RecalledItem]  # about the user: offered
    about_dropped: list[RecalledItem]  # about the user: left out, the notes hold them
    outcome: RecallOutcome | None  # None: recall did not run (`skipped` says why)
    skipped: str | None
    recalled: list[RecalledItem]  # recall's hits cut down to their best turns


async def gather(
    db: AsyncSession,
    context: AppContext,
    req: BuildPromptRequest,
    build: BuildState,
    window: list[TurnRecord],
    notes: Notes,
    top_k: int,
    vectors: QueryVectors,
) -> Gathered:
    """ "About this user", then recall and the turns its hits show; their timings and fallbacks
    go into `build`."""
    stage = time.perf_counter()
    about, about_dropped = await _about_user(
        db, context, build.session, req, window, notes, vectors
    )
    if about or about_dropped:
        build.timings["user_memory"] = elapsed_ms(stage)
    outcome, recalled, skipped = await _recall(
        db, context, build.session, req, window, top_k, build.fallbacks, vectors
    )
    if outcome is not None:
        build.timings.update({f"recall_{k}": v for k, v in outcome.timings_ms.items()})
        build.fallbacks.extend(f for f in outcome.fallbacks if f not in build.fallbacks)
    return Gathered(about, about_dropped, outcome, skipped, recalled)


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
            disputes = await user_memory_disputes(db, session, [r.memory for r in ranked])
    except Exception:  # the user's items are an extra: their failure never fails the build
        logger.exception("user memories unavailable")
        return [], []
    # Tiers weigh the ranking at the time of the window's last turn, as recall dates it.
    now = said_at(window[-1].metadata, window[-1].created_at) if window else datetime.now(UTC)
    return _weighed_about(context, ranked, now, disputes, notes)


def _weighed_about(
    context: AppContext,
    ranked: list[RankedMemory],
    now: datetime,
    disputes: dict[uuid.UUID, list[Memory]],
    notes: Notes,
) -> tuple[list[RecalledItem], list[RecalledItem]]:
    """The user's items by relevance times their tier's weight (a settled item over one seen
    once, a fresh one over one unseen for `memory.decay_days`); a fact an unconfirmed item
    contradicts is dated and followed by that item, marked not current."""
    weighted = sorted(
        ((r, user_memory_weight(context.settings, r.memory, now)) for r in ranked),
        key=lambda rw: (-rw[0].score * rw[1], -rw[1]),
    )
    in_notes = {normalise(item.text) for item in notes.remembered}
    offered: list[RecalledItem] = []
    dropped: list[RecalledItem] = []
    for r, weight in weighted:
        memory, contradicting = r.memory, disputes.get(r.memory.id, [])
        text = memory.text
        if contradicting:
            text = disputed_fact(memory.text, claim(memory).said_at)
        item = RecalledItem(
            chunk_id=str(memory.id),
            text=text,
            ts=memory.created_at,
            trusted=memory.trusted,
            score=round(r.score * weight, 6),
            source="user_memory",
        )
        if normalise(memory.text) in in_notes and not contradicting:
            dropped.append(item)
            continue
        offered.append(item)
        offered.extend(
            RecalledItem(
                chunk_id=str(other.id),
                text=dispute(
                    other.text, other.source, other.source_tool, other.created_at, memory.text
                ),
                ts=other.created_at,
                trusted=False,
                score=item.score,
                source="user_memory",
            )
            for other in contradicting
        )
    return offered, dropped


async def _recall(
    db: AsyncSession,
    context: AppContext,
    session: Any,
    req: BuildPromptRequest,
    window: list[Any],
    top_k: int,
    fallbacks: list[str],
    vectors: QueryVectors,
) -> tuple[RecallOutcome | None, list[RecalledItem], str | None]:
    """Run the recall chain when the mode and the session call for it; never fail the build."""
    if req.recall.mode == "never":
        return None, [], "mode_never"
    if req.recall.mode == "auto" and not has_history(session):
        return None, [], "no_history"
    query = req.query
    if query is None:
        query = window_query(window)
    if not query:
        return None, [], "no_query"
    candidates = (
        req.recall.candidates or effective_config(context.settings, session).recall_candidates
    )
    try:
        outcome, recalled = await recalled_history(
            db,
            context,
            session,
            query,
            window,
            candidates=candidates,
            top_k=top_k,
            # Remembered items reach the prompt through the notes and the "about this user"
            # block, not as recalled history.
            include_memories=False,
            query_vectors=vectors,
        )
    except Exception:  # any failure of the recall chain degrades to C0 + C1 + C2, never a 500
        logger.exception("recall unavailable")
        await db.rollback()  # only reads since the write phase committed
        fallbacks.append("recall_unavailable")
        return None, [], "recall_unavailable"
    return outcome, recalled, None


async def recalled_history(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    query: str,
    window: Sequence[TurnRecord],
    *,
    candidates: int,
    top_k: int,
    include_memories: bool,
    memory_source: str = "memory",
    query_vectors: QueryVectors | None = None,
    query_timeout_s: float | None = None,
    keep: Callable[[RecallOutcome, RecallHit], bool] | None = None,
    shown_seqs: Collection[int] | None = None,
    floored: bool = False,
) -> tuple[RecallOutcome, list[RecalledItem]]:
    """Recall of `query` beside the window (its last two turns resolve the query, its turns
    are left out, or only `shown_seqs` when given, its last turn's time dates it), the hits
    `keep` accepts, each with its best turns: what build-prompt's recalled block and the
    memory tool's `recall` both choose from (`app.prompt.choosing.choose_recalled`).
    `floored`: when no hit reaches the relevance floor, none is offered (`below_floor`)."""
    outcome = await recall(
        db,
        context,
        session,
        query,
        recent_turns=[t.content for t in window[-2:]],
        candidates=candidates,
        window_seqs={t.seq for t in window} if shown_seqs is None else shown_seqs,
        include_memories=include_memories,
        now=said_at(window[-1].metadata, window[-1].created_at) if window else None,
        query_timeout_s=query_timeout_s,
        query_vectors=query_vectors,
        by_meaning=floored,
    )
    shown_max = max(SHOWN_PER_K * top_k, SHOWN_MIN)
    if floored:
        outcome = above_floor(outcome, shown_max)
    if keep is not None:
        outcome = replace(outcome, hits=[hit for hit in outcome.hits if keep(outcome, hit)])
    shown = await show_best_turns(db, context, session, outcome, shown_max)
    return outcome, [recalled_item(hit, memory_source=memory_source) for hit in shown]


def above_floor(outcome: RecallOutcome, listed: int) -> RecallOutcome:
    """`outcome` as it is when one of its first hits reaches the relevance floor; else with no
    hits, its first `listed` left out as `below_floor`."""
    if outcome.confident or not outcome.hits:
        return outcome
    below = [(hit, "below_floor") for hit in outcome.hits[:listed]]
    return replace(outcome, hits=[], dropped=[*below, *outcome.dropped])


def recall_manifest(manifest: list[ManifestItem], outcome: RecallOutcome) -> None:
    """The recalled items of `manifest` given their relevance and the floor, then the manifest
    items of what recall found and left out, with the reason."""
    if outcome.judge is not None:
        # Judged when shown: an item left over budget is not quoted, and judging every offered
        # item (~70 a build) would cost the build ~1 ms.
        hits = {hit.id.removeprefix(MEMORY_PREFIX): hit for hit in outcome.hits}
        for item in manifest:
            if item.layer == "c3" and item.included and item.id in hits:
                item.relevance, item.floor = outcome.relevance(hits[item.id]), outcome.floor
    manifest.extend(
        ManifestItem(
            id=hit.id.removeprefix(MEMORY_PREFIX),
            layer="c3",
            source=hit.source,
            tokens=0,
            score=hit.score,
            included=False,
            reason=reason,
            relevance=outcome.relevance(hit) if reason == "below_floor" else None,
            floor=outcome.floor,
        )
        for hit, reason in outcome.dropped
    )


async def offloaded_tail(
    context: AppContext,
    session: Session,
    budget: Budget,
    window: Sequence[TurnRecord],
    kept: KeptWindow | None,
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
        lambda conn: turns_store.offloaded_tail(
            conn, session.tenant_id, session.id, before=before, tokens=tokens, turns=TAIL_MAX_TURNS
        ),
    )
    tail = [turn for turn, _ in found]
    chunk_of = {turn.seq: chunk for turn, chunk in found}
    if kept is not None:
        kept.tail = (tokens, tail, chunk_of)
    return tail, chunk_of


def tool_clearing(config: BudgetConfig, options: ToolResultsOptions) -> ToolClearing:
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
