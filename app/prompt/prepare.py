"""A build's first phase, its writes: append the query when asked, resolve the session, start
the query's embedding, measure the system prompt and the query, budget the build (refusing what
cannot fit) and remember the system prompt's size. What it settles is the `BuildState` the later
phases carry."""

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings
from app.core.context import AppContext
from app.core.cpu import off_loop
from app.core.db import local_time_limits
from app.core.errors import BudgetExceeded, InvalidInput
from app.domain.budget import Budget, BudgetConfig, config_error_field
from app.domain.callers import Caller, Scope
from app.domain.tokens import message_tokens
from app.offload.watermark import observe_watermark
from app.prompt.assembly import PromptTooLarge, mandatory_costs, tools_tokens
from app.prompt.schemas import BuildPromptRequest
from app.prompt.snapshot import Prefetched, attached, resolve_session
from app.recall.query_vectors import QueryVectors, early_query_text
from app.sessions.append import append_turns
from app.sessions.schemas import AppendTurnsRequest, TurnIn
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session
from app.store.sessions import session_budget, write_session

logger = logging.getLogger("contextd.prompt")


@dataclass
class BuildState:
    """What the phases of one build share: settled by `prepare`, then re-bound where a phase
    changes it (the session once a build writes it, the budget once the notes are counted)."""

    started: float  # perf_counter at the build's start: `timings_ms.total` counts from it
    writes: bool  # the caller may write the session (`sessions:write`)
    session: Session
    snapshot: turns_store.SessionWindow | None  # None: read through the transaction
    appended_seq: int | None  # the query's turn when the build appended it
    system: list[dict[str, Any]]
    query_tokens: int
    budget: Budget
    config: BudgetConfig
    timings: dict[str, float]  # the response's `timings_ms`, stage by stage
    fallbacks: list[str]  # the response's `fallbacks`, in the order they happened
    emergency: bool = False  # the window sits in the emergency band (set with the notes)


async def prepare(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    prefetched: Prefetched | None,
    vectors: QueryVectors,
) -> BuildState:
    started = time.perf_counter()
    settings = context.settings
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
    session, snapshot = await resolve_session(
        db, context, caller, session_id, req, prefetched, writes
    )
    # The query's embedding starts now, on its encoder lane, when recall or the user's items
    # will want it: the rest of the build runs on the event loop meanwhile.
    early = early_query_text(context, req.query) if embeds_query(session, req) else None
    if early is not None:
        vectors.start(early)
        # One turn of the event loop: the embedding's task sends its cache lookup now and reads
        # the answer at the build's next wait (the notes' read), so the encoder starts then, not
        # after the arms of recall, the first wait long enough otherwise.
        await asyncio.sleep(0)

    system = system_messages(req)
    c0, query_tokens = await _measure(system, req)
    budget = _budget(settings, session, c0, req)
    # A query that cannot fit even alone is refused before anything is stored.
    await _refuse_unfit(system, req, budget.available)
    # The system prompt's size is stored when it changes the budget: a session that never
    # reported it is budgeted with the configured assumption, and a build whose size is that
    # assumption (a first build without a system prompt, by default) writes nothing.
    if writes and session_budget(settings, session).c0 != c0:
        if snapshot is not None:
            session, snapshot = await attached(db, caller, session_id), None
        await _remember_c0(db, context, session, c0)
    return BuildState(
        started=started,
        writes=writes,
        session=session,
        snapshot=snapshot,
        appended_seq=appended_seq,
        system=system,
        query_tokens=query_tokens,
        budget=budget,
        config=budget.config,
        timings={"prepare": elapsed_ms(started)},
        fallbacks=[],
    )


def system_messages(system: BuildPromptRequest) -> list[dict[str, Any]]:
    if isinstance(system.system, str):
        return [{"role": "system", "content": system.system}] if system.system else []
    return [m.model_dump() for m in system.system]


async def _measure(system: list[dict[str, Any]], req: BuildPromptRequest) -> tuple[int, int]:
    """C0 (the system prompt and the tools) and the query's tokens, off the loop for long text."""
    query_text = req.query or ""
    return await off_loop(
        lambda: (
            sum(message_tokens("system", m["content"]) for m in system) + tools_tokens(req.tools),
            message_tokens("user", query_text) if req.query is not None else 0,
        ),
        chars=sum(len(m["content"]) for m in system) + len(query_text),
    )


def _budget(settings: Settings, session: Session, c0: int, req: BuildPromptRequest) -> Budget:
    """The session's budget with this build's C0 and window overrides (a 422 naming the field
    when the overrides do not make a valid configuration)."""
    try:
        return (
            session_budget(settings, session)
            .with_counters(c0=c0)
            .with_window(req.context_limit, req.reserve_tokens)
        )
    except ValidationError as exc:
        field, message = config_error_field(exc)
        raise InvalidInput(message, field=field) from exc


async def _remember_c0(db: AsyncSession, context: AppContext, session: Session, c0: int) -> None:
    """Store the system prompt's size (and the watermark state it implies) on the session; when
    the row is locked longer than the inline-offload budget, leave it for a later build."""
    try:
        async with db.begin_nested():
            await local_time_limits(db, context.settings.recall.emergency_offload_timeout_seconds)
            locked = await sessions_store.lock_session_by_pk(db, session.tenant_id, session.id)
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


async def _refuse_unfit(system: list[dict[str, Any]], req: BuildPromptRequest, budget: int) -> None:
    """The 422 the assembly would answer when the system prompt, tools and query alone exceed
    `budget`, from their costs only (assembling a prompt of them was as dear as the build's)."""
    try:
        await off_loop(
            lambda: mandatory_costs(system, req.tools, req.query, budget, req.format),
            chars=mandatory_chars(system, req.query),
        )
    except PromptTooLarge as exc:
        raise budget_exceeded(exc) from exc


def mandatory_chars(system: Sequence[Mapping[str, Any]], query: str | None) -> int:
    return len(query or "") + sum(len(str(m["content"])) for m in system)


def budget_exceeded(exc: PromptTooLarge) -> BudgetExceeded:
    return BudgetExceeded(
        f"{exc}: the system prompt, tools and query alone do not fit",
        field="query",
        details={"needed": exc.needed, "available": exc.available, "parts": exc.parts},
    )


def embeds_query(session: Any, req: BuildPromptRequest) -> bool:
    """Whether recall or the user's items (`app.prompt.gather`) will embed the query (a session
    without chunks yet that gets some from this build's emergency offload is recalled too:
    recall then starts the embedding itself)."""
    if req.recall.mode == "never":
        return False
    return bool(session.user_id) or req.recall.mode != "auto" or has_history(session)


def has_history(session: Any) -> bool:
    """Whether the session has offloaded turns to recall. Chunks alone are not enough: those of
    a huge tool result layered on arrival belong to a turn still in the window, which recall
    leaves out."""
    return bool(session.chunk_count and session.offloaded_until_seq)


def elapsed_ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)
