"""Tool results found through their calls: a fused chunk whose last turn calls tools brings the
chunks holding the results, which then rank with the call."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.turn_text import TOOL_CALLS_MARK
from app.recall.fusion import FusedCandidate
from app.recall.hits import MEMORY_PREFIX
from app.store import chunks as chunks_store
from app.store.models import Session

# The first this many fused candidates that call tools bring the chunks of their results.
CALLS_FOLLOWED = 5


@dataclass(frozen=True)
class CallChunk:
    """A fused candidate whose last turn calls tools, and its text."""

    fused: FusedCandidate
    text: str


@dataclass(frozen=True)
class ResultOfCall:
    """A chunk holding a tool result, and the candidate holding the call it answers."""

    chunk: chunks_store.ShownChunk
    call: CallChunk


def calls_at_end(text: str) -> int:
    """How many tool calls the last turn of a chunk's `text` makes (0: its last turn calls no
    tool). A call line cut by a split turn counts as one call."""
    if TOOL_CALLS_MARK not in text:  # a conversation's chunks: no copy of the text
        return 0
    lines = text.rstrip().rsplit("\n", 1)
    last = lines[-1]
    at = last.find(TOOL_CALLS_MARK)
    if at < 0:
        return 0
    try:
        calls = json.loads(last[at + len(TOOL_CALLS_MARK) :])
    except ValueError:
        return 1
    return len(calls) if isinstance(calls, list) and calls else 1


async def results_of_calls(
    db: AsyncSession,
    session: Session,
    fused: Sequence[FusedCandidate],
    fields: Mapping[str, Mapping[str, Any]],
) -> dict[str, ResultOfCall]:
    """The chunks holding the results of the tool calls that end one of the first
    `CALLS_FOLLOWED` fused chunks, by chunk id. A tool result is data the call asked for, and
    a long one is chunked apart from its call (`app.offload.chunking`): the piece holding
    `SECRET_CONST_3 = ...` does not name `billing/mod3.py`, the call that read it does. Found by
    its call, a result ranks with it (`with_results_of_calls`) and is matched against the
    query's keys with the call's text (`RerankCandidate.call_text`)."""
    calls: list[tuple[CallChunk, int, int]] = []
    for f in fused:
        if len(calls) >= CALLS_FOLLOWED:
            break
        if f.id.startswith(MEMORY_PREFIX) or f.id not in fields:
            continue
        text = fields[f.id]["text"]
        count = calls_at_end(text)
        if count:
            last = fields[f.id]["turn_last"]
            calls.append((CallChunk(f, text), last + 1, last + count))
    found: dict[str, ResultOfCall] = {}
    for call, first, last in calls:
        for chunk in await chunks_store.chunks_overlapping(
            db, session.tenant_id, session.id, first, last
        ):
            if chunk.raw_text.startswith("tool") and str(chunk.id) not in found:
                shown = chunks_store.ShownChunk.of(chunk)
                found[shown.id] = ResultOfCall(shown, call)
    return found


def with_results_of_calls(
    fused: Sequence[FusedCandidate], answered: Mapping[str, ResultOfCall]
) -> list[FusedCandidate]:
    """`fused` with each result of a call (`answered`) scored as its call when that is better
    than its own score, the results no arm returned placed right after their call."""
    out: list[FusedCandidate] = []
    known = {f.id for f in fused}
    for f in fused:
        result = answered.get(f.id)
        if result is not None and result.call.fused.score > f.score:
            f = replace(f, score=result.call.fused.score, rank=result.call.fused.rank)
        out.append(f)
        out.extend(
            FusedCandidate(id=cid, score=f.score, rank=f.rank)
            for cid, r in answered.items()
            if r.call.fused.id == f.id and cid not in known
        )
    return out
