"""Sessions and turns: append (watermark check, offload enqueue), list, configure, and the
repair of a session's counters from its rows."""

import hashlib
import json
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.schemas import Caller
from app.core.cache import Cache
from app.core.config import Settings
from app.core.cpu import off_loop
from app.core.errors import (
    Conflict,
    DuplicateToolCallId,
    DuplicateToolResult,
    InvalidInput,
    MissingToolCallId,
    PayloadTooLarge,
    UnknownToolCall,
)
from app.core.tokens import message_tokens
from app.domain.budget import (
    Budget,
    BudgetConfig,
    Observation,
    config_error_field,
)
from app.http.input import json_size
from app.http.pagination import Page, created_after, created_cursor, encode_cursor, page_of
from app.jobs.queue import enqueue_offload
from app.offload.repository import active_chunk_count
from app.sessions import layering
from app.sessions.layering import LayeredResult, content_ids, layer
from app.sessions.schemas import (
    AppendedTurn,
    AppendTurnsRequest,
    AppendTurnsResponse,
    SessionConfigUpdate,
    SessionCounts,
    SessionOut,
    SessionPage,
    SessionSummary,
    TurnIn,
    TurnOut,
    TurnPage,
    Usage,
    Watermark,
)
from app.store import memories as memories_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session
from app.store.sessions import (
    Counters,
    require_session,
    session_budget,
    session_cache_key,
    write_session,
)
from app.store.turns import ToolCallTally

CONFIG_FIELDS = frozenset(BudgetConfig.model_fields)
logger = logging.getLogger("contextd.sessions")


async def observe_watermark(db: AsyncSession, budget: Budget, session: Session) -> Observation:
    """After a change of the session's usage: enqueue an offload when the budget fires.
    The returned `armed` is stored by the caller with its update of the session row."""
    observation = budget.observe(session.offload_armed)
    if observation.fired:
        await enqueue_offload(db, session.id, trigger="watermark")
    return observation


def check_metadata_size(metadata: dict[str, Any] | None, field: str, settings: Settings) -> int:
    """The metadata's size as JSON; 413 above `limits.max_metadata_bytes`."""
    size = json_size(metadata) if metadata else 0
    if size > settings.limits.max_metadata_bytes:
        raise PayloadTooLarge(
            f"metadata is {size} bytes as JSON; the limit is {settings.limits.max_metadata_bytes}",
            field=field,
        )
    return size


def _check_turn_size(turn: TurnIn, field: str, settings: Settings) -> None:
    """Content, tool calls and metadata together within `limits.max_turn_bytes`, a tool result
    within `limits.max_tool_result_bytes` (413)."""
    parts = {
        "content": len((turn.content or "").encode()),
        "tool_calls": json_size([c.model_dump(mode="json") for c in turn.tool_calls])
        if turn.tool_calls
        else 0,
        "metadata": check_metadata_size(turn.metadata, f"{field}.metadata", settings),
    }
    limits = settings.limits
    size = sum(parts.values())
    limit, name = (
        (limits.max_tool_result_bytes, "limits.max_tool_result_bytes")
        if turn.role == "tool"
        else (limits.max_turn_bytes, "limits.max_turn_bytes")
    )
    if size > limit:
        largest = max(parts, key=lambda part: parts[part])
        raise PayloadTooLarge(
            f"turn is {size} bytes ({', '.join(f'{k} {v}' for k, v in parts.items() if v)}); "
            f"the limit ({name}) is {limit}",
            field=f"{field}.{largest}",
        )


def _unanswered_results(
    turns: Sequence[TurnIn], stored: Mapping[str, ToolCallTally]
) -> Iterator[tuple[int, str]]:
    """The tool results of `turns` (index, call id) that no call waiting for a result answers,
    after the session's stored calls and results (`stored`, by call id).

    A result answers the latest call with its id that has no result yet (`app.domain.tool_calls`):
    agents reuse ids such as `call_0`, so what counts is how many calls of an id still wait."""
    waiting = {i: max(0, tally.calls - tally.results) for i, tally in stored.items()}
    for index, turn in enumerate(turns):
        for call in turn.tool_calls or []:
            waiting[call.id] = waiting.get(call.id, 0) + 1
        call_id = turn.tool_call_id
        if turn.role != "tool" or call_id is None:
            continue
        if waiting.get(call_id, 0):
            waiting[call_id] -= 1
        else:
            yield index, call_id


def _check_tool_results(turns: Sequence[TurnIn], stored: Mapping[str, ToolCallTally]) -> None:
    """422 for the first tool result that answers no call waiting for one: a duplicate when
    every call of its id has its result, else an unknown call."""
    first = next(_unanswered_results(turns, stored), None)
    if first is None:
        return
    index, call_id = first
    field = f"turns[{index}].tool_call_id"
    issued = call_id in stored and stored[call_id].calls > 0
    if issued or any(c.id == call_id for turn in turns[:index] for c in turn.tool_calls or []):
        raise DuplicateToolResult(
            f"every tool call {call_id!r} already has its result (one result per call)",
            field=field,
        )
    raise UnknownToolCall(f"no assistant turn issued tool call {call_id!r}", field=field)


def _validate_batch(request: AppendTurnsRequest, settings: Settings) -> list[str]:
    """Checks that need no database. Returns the call ids of tool results that the request's
    own calls do not answer: those the session's stored calls must."""
    if len(request.turns) > settings.limits.max_turns_per_request:
        raise PayloadTooLarge(
            f"at most {settings.limits.max_turns_per_request} turns per request",
            field="turns",
        )
    for i, turn in enumerate(request.turns):
        _check_turn_size(turn, f"turns[{i}]", settings)
        if turn.role == "tool":
            if not turn.tool_call_id:
                raise MissingToolCallId(
                    "a tool turn needs the tool_call_id it answers",
                    field=f"turns[{i}].tool_call_id",
                )
        elif turn.tool_call_id:
            raise InvalidInput(
                "only tool turns carry a tool_call_id", field=f"turns[{i}].tool_call_id"
            )
        if turn.tool_calls:
            if turn.role != "assistant":
                raise InvalidInput(
                    "only assistant turns carry tool_calls", field=f"turns[{i}].tool_calls"
                )
            seen: set[str] = set()
            for j, call in enumerate(turn.tool_calls):
                if call.id in seen:
                    raise DuplicateToolCallId(
                        f"tool call id {call.id!r} is already used by another call of this "
                        "turn (ids are unique within one assistant turn)",
                        field=f"turns[{i}].tool_calls[{j}].id",
                    )
                seen.add(call.id)
        if turn.content is None and not turn.tool_calls:
            raise InvalidInput("content is required", field=f"turns[{i}].content")
    return sorted({call_id for _, call_id in _unanswered_results(request.turns, {})})


@dataclass(frozen=True)
class PreparedTurns:
    rows: list[dict[str, Any]]  # the turn columns that do not depend on the session
    request_hash: str  # "" unless asked for (Idempotency-Key)
    layered: dict[int, LayeredResult]  # huge tool results, by their place in `rows`


def _prepare_turns(
    request: AppendTurnsRequest, settings: Settings, *, hashed: bool
) -> PreparedTurns:
    rows: list[dict[str, Any]] = []
    layered: dict[int, LayeredResult] = {}
    for turn in request.turns:
        tool_calls = (
            [c.model_dump(mode="json") for c in turn.tool_calls] if turn.tool_calls else None
        )
        content = turn.content or ""
        # A long tool result is tokenised once: for its count and, if it is layered, its chunks.
        ids = content_ids(settings, content) if turn.role == "tool" else None
        rows.append(
            {
                "role": turn.role,
                "content": content,
                "name": turn.name,
                "tool_calls": tool_calls,
                "tool_call_id": turn.tool_call_id,
                "metadata_": turn.metadata or {},
                "token_count": message_tokens(
                    turn.role,
                    content if ids is None else "",
                    turn.name,
                    tool_calls,
                    turn.tool_call_id,
                )
                + (len(ids) if ids is not None else 0),
                "trusted": turn.role != "tool",
            }
        )
        row = rows[-1]
        if ids is not None and row["token_count"] > settings.limits.layer_tool_result_tokens:
            result = layer(settings, row, ids)
            layered[len(rows) - 1] = result
            row.update(content=result.view, token_count=result.token_count)
    if not hashed:
        return PreparedTurns(rows, "", layered)
    payload = json.dumps(request.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
    return PreparedTurns(rows, hashlib.sha256(payload.encode()).hexdigest(), layered)


@dataclass
class AppendOutcome:
    response: AppendTurnsResponse
    replayed: bool
    session_pk: uuid.UUID  # the session's primary key


async def append_turns(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    session_id: str,
    request: AppendTurnsRequest,
    idempotency_key: str | None,
) -> AppendOutcome:
    answered_earlier = _validate_batch(request, settings)
    # Tokenising and hashing long turns is CPU work: done before the session lock is taken, and
    # off the event loop when the turns are long.
    prepared = await off_loop(
        lambda: _prepare_turns(request, settings, hashed=idempotency_key is not None),
        chars=sum(len(turn.content or "") for turn in request.turns),
    )
    session = await sessions_store.lock_or_create_session(db, caller.tenant_id, session_id)

    if idempotency_key is not None:
        earlier = await turns_store.claim_idempotency_key(
            db, caller.tenant_id, session.id, idempotency_key, prepared.request_hash
        )
        if earlier is not None:
            if earlier.request_hash != prepared.request_hash or earlier.response is None:
                raise Conflict(
                    "this Idempotency-Key was used for a different request",
                    field="Idempotency-Key",
                )
            return AppendOutcome(
                AppendTurnsResponse.model_validate(earlier.response), True, session.id
            )

    if answered_earlier:
        # Under the session lock: concurrent appends to the session see each other's results.
        tallies = await turns_store.tool_call_tallies(db, session.id, answered_earlier)
        _check_tool_results(request.turns, tallies)

    rows = [
        {
            **values,
            "tenant_id": caller.tenant_id,
            "session_id": session.id,
            "seq": session.last_seq + offset,
        }
        for offset, values in enumerate(prepared.rows, start=1)
    ]
    stored = await turns_store.insert_turns(db, rows)
    # Huge results' whole texts go to C3 with their turns, in this transaction.
    chunks_written = await layering.store(
        db, session, [(rows[i]["seq"], result) for i, result in prepared.layered.items()]
    )
    added_tokens = sum(r["token_count"] for r in rows)
    session.last_seq += len(rows)
    session.c1_tokens += added_tokens
    session.c1_turns += len(rows)
    session.turn_count += len(rows)

    chunks: dict[str, Any] = {}
    if chunks_written:
        # The per-process lexical indexes are keyed by `chunks_version`.
        session.chunk_count += chunks_written
        chunks = {"chunk_count": session.chunk_count, "chunks_version": Session.chunks_version + 1}

    budget = session_budget(settings, session)
    observation = await observe_watermark(db, budget, session)
    await write_session(
        db,
        cache,
        session,
        last_seq=session.last_seq,
        c1_tokens=session.c1_tokens,
        c1_turns=session.c1_turns,
        turn_count=session.turn_count,
        offload_armed=observation.armed,
        **chunks,
    )
    response = AppendTurnsResponse(
        turns=[
            AppendedTurn(seq=t.seq, role=t.role, token_count=t.token_count, created_at=t.created_at)
            for t in sorted(stored, key=lambda t: t.seq)
        ],
        usage=Usage.of(budget),
        watermark=Watermark.of(budget),
        offload_enqueued=observation.fired,
    )
    if idempotency_key is not None:
        await turns_store.store_idempotent_response(
            db, caller.tenant_id, session.id, idempotency_key, 201, response.model_dump(mode="json")
        )
    return AppendOutcome(response, False, session.id)


async def list_turns(
    db: AsyncSession,
    caller: Caller,
    session_id: str,
    page: Page,
    *,
    since_seq: int | None,
    role: str | None,
) -> TurnPage:
    session = await require_session(db, caller, session_id)
    keys = page.after()
    after = keys[0] if keys is not None else (since_seq or 0)
    turns = await turns_store.list_turns(
        db, session.id, after_seq=after, limit=page.fetch, role=role
    )
    shown, next_cursor = page_of(turns, page, lambda t: encode_cursor(t.seq))
    return TurnPage(turns=[TurnOut.of(t) for t in shown], next_cursor=next_cursor)


async def list_sessions(
    db: AsyncSession, caller: Caller, settings: Settings, page: Page, user_id: str | None
) -> SessionPage:
    sessions = await sessions_store.sessions_page(
        db, caller.tenant_id, user_id=user_id, after=created_after(page), limit=page.fetch
    )
    shown, next_cursor = page_of(sessions, page, lambda s: created_cursor(s.created_at, s.id))
    return SessionPage(
        sessions=[SessionSummary.of(s, session_budget(settings, s)) for s in shown],
        next_cursor=next_cursor,
    )


async def session_view(
    db: AsyncSession, caller: Caller, settings: Settings, cache: Cache, session_id: str
) -> SessionOut:
    key = session_cache_key(cache, caller.tenant_id, session_id)
    cached = await cache.get_json(key)
    if cached is not None:
        view = SessionOut.model_validate(cached)
    else:
        session = await require_session(db, caller, session_id)
        view = _build_view(settings, session, memories=0)
        await cache.set_versioned(key, view.model_dump(mode="json"), session.version)
    # Remembered items of the user's other sessions change without touching this row: count live.
    memories = await memories_store.count_memories(
        db, caller.tenant_id, view.session_id, view.user_id
    )
    return view.model_copy(update={"counts": view.counts.model_copy(update={"memories": memories})})


def _build_view(settings: Settings, session: Session, memories: int) -> SessionOut:
    budget = session_budget(settings, session)
    return SessionOut(
        **budget.config.model_dump(),
        session_id=session.external_id,
        user_id=session.user_id,
        metadata=session.metadata_,
        usage=Usage.of(budget),
        watermark=Watermark.of(budget),
        counts=SessionCounts(
            turns=session.turn_count, chunks=session.chunk_count, memories=memories
        ),
        last_offload_at=session.last_offload_at,
        created_at=session.created_at,
    )


async def update_session(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    session_id: str,
    update: SessionConfigUpdate,
) -> SessionOut:
    session = await sessions_store.lock_or_create_session(db, caller.tenant_id, session_id)
    changes = update.model_dump(exclude_none=True)
    config = {**session.config, **{k: v for k, v in changes.items() if k in CONFIG_FIELDS}}
    try:
        settings.session_defaults.overlay(config)
    except ValidationError as exc:
        field, message = config_error_field(exc)
        if field is not None and field not in config:
            message += f" ({field} is the deployment default: set it in the same request)"
        raise InvalidInput(message, field=field) from exc
    session.config = config
    values: dict[str, Any] = {"config": config}
    if "user_id" in changes:
        values["user_id"] = session.user_id = changes["user_id"]
    if "metadata" in changes:
        check_metadata_size(changes["metadata"], "metadata", settings)
        values["metadata_"] = session.metadata_ = changes["metadata"]
    await write_session(db, cache, session, **values)
    await db.refresh(session)
    memories = await memories_store.count_memories(
        db, caller.tenant_id, session_id, session.user_id
    )
    return _build_view(settings, session, memories)


@dataclass(frozen=True)
class CounterRepair:
    session_pk: uuid.UUID
    stored: Counters
    counted: Counters


async def repair_counters(
    db: AsyncSession, settings: Settings, cache: Cache, session_pk: uuid.UUID
) -> CounterRepair | None:
    """Recount the session's counters from its rows under the session lock; when they drifted,
    store the recount (and the watermark state it implies) and log the drift."""
    session = await sessions_store.lock_session_by_pk(db, session_pk)
    if session is None or sessions_store.erasing(session):  # tombstoned since it was read
        return None
    counted = await sessions_store.recount(db, session_pk, active_chunk_count)
    stored = Counters(session.c1_tokens, session.c1_turns, session.turn_count, session.chunk_count)
    if counted == stored:
        return None
    session.c1_tokens, session.c1_turns = counted.c1_tokens, counted.c1_turns
    session.turn_count, session.chunk_count = counted.turn_count, counted.chunk_count
    observation = await observe_watermark(db, session_budget(settings, session), session)
    await write_session(db, cache, session, **asdict(counted), offload_armed=observation.armed)
    logger.warning(
        "session counters drifted from the rows; repaired",
        extra={
            "session": session.external_id,
            "stored": asdict(stored),
            "counted": asdict(counted),
        },
    )
    return CounterRepair(session_pk, stored, counted)
