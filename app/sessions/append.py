"""The append, whole: validate, prepare the rows off the loop, lock the session, replay an
idempotent request, store the turns (and huge results' chunks), move the counters and the
watermark; and, when the turns took the window to the emergency ratio, the inline offload.
The append route and build-prompt's `append: true` both come here."""

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.cache import Cache
from app.core.config import Settings
from app.core.cpu import off_loop
from app.core.db import after_commit, release
from app.core.errors import Conflict
from app.core.observability import Metrics
from app.domain.budget import Budget, Observation
from app.domain.callers import Caller
from app.domain.tokens import message_tokens
from app.memories.capture import capture_user_statements
from app.offload.service import inline_offload
from app.offload.watermark import observe_watermark
from app.sessions import layering
from app.sessions.layering import LayeredResult, content_ids, layer
from app.sessions.schemas import (
    AppendedTurn,
    AppendTurnsRequest,
    AppendTurnsResponse,
    Usage,
    Watermark,
)
from app.sessions.validation import check_tool_results, validate_batch
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session, Turn
from app.store.sessions import session_budget, write_session


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


async def _store_turns(
    db: AsyncSession, caller: Caller, session: Session, prepared: PreparedTurns
) -> tuple[list[dict[str, Any]], list[Turn], int]:
    """The turns' rows after the session's last seq, and huge results' chunks. Returns the
    rows, the stored turns and the number of chunks written."""
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
    return rows, stored, chunks_written


async def _count_turns(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    session: Session,
    rows: list[dict[str, Any]],
    chunks_written: int,
) -> tuple[Budget, Observation]:
    """The session's counters and watermark after the stored rows, written with its row."""
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
    return budget, observation


async def append_turns(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    session_id: str,
    request: AppendTurnsRequest,
    idempotency_key: str | None,
) -> AppendOutcome:
    answered_earlier = validate_batch(request, settings)
    # Tokenising and hashing long turns is CPU work: done before the session lock is taken, and
    # off the event loop when the turns are long.
    prepared = await off_loop(
        lambda: _prepare_turns(request, settings, hashed=idempotency_key is not None),
        chars=sum(len(turn.content or "") for turn in request.turns),
    )
    session = await sessions_store.lock_or_create_session(db, caller.tenant_id, session_id)

    if idempotency_key is not None:
        earlier = await turns_store.claim_idempotency_key(
            db,
            caller.tenant_id,
            session.id,
            idempotency_key,
            prepared.request_hash,
            timedelta(hours=settings.db.idempotency_ttl_hours),
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
        tallies = await turns_store.tool_call_tallies(
            db, session.tenant_id, session.id, answered_earlier
        )
        check_tool_results(request.turns, tallies)

    rows, stored, chunks_written = await _store_turns(db, caller, session, prepared)
    await capture_user_statements(db, settings, session, stored)
    budget, observation = await _count_turns(db, settings, cache, session, rows, chunks_written)
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


async def append_turns_and_offload(
    db: AsyncSession,
    caller: Caller,
    settings: Settings,
    cache: Cache,
    metrics: Metrics,
    session_id: str,
    request: AppendTurnsRequest,
    idempotency_key: str | None,
) -> AppendOutcome:
    """An append (`append_turns`) and, when its turns took the window to
    the emergency ratio, the offload too, before the answer: the worker's job, enqueued with the
    turns, would come after the build that usually follows at once, and that build would
    offload inline itself. The turns commit first, on their own: an offload that fails or times
    out loses none of them (the job moves them later), and the answer, stored for a replay of
    its `Idempotency-Key` with the turns, says what the turns did to the window."""
    outcome = await append_turns(db, caller, settings, cache, session_id, request, idempotency_key)
    if outcome.replayed or outcome.response.watermark.level != "emergency":
        return outcome
    await release(db)
    freed = await inline_offload(
        db, settings, cache, caller.tenant_id, outcome.session_pk, trigger="append"
    )
    if freed:

        async def count() -> None:
            metrics.observe_offload("append", freed)

        after_commit(db, count)
    return outcome
