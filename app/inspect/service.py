"""What the inspector pages show, gathered from the domains' own services and repositories."""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.domain.budget import REPLY_PRIMING_TOKENS, Budget
from app.domain.callers import Caller
from app.domain.records import TurnRecord
from app.erasure.lineage import receipt_out
from app.erasure.schemas import EraseReceiptOut
from app.http.pagination import BIGINT_KEY, UUID_KEY, Page, cut
from app.inspect.builds import Anchors, BuildView, build_view
from app.inspect.charts import (
    LineChart,
    OffloadMark,
    Segment,
    layer_bar,
    line_chart,
    thin,
    watermark_series,
)
from app.memories.schemas import MemoryOut
from app.memories.service import list_memories
from app.notes.schemas import Notes
from app.prompt.clearing import History, ToolClearing
from app.sessions.schemas import SessionOut
from app.sessions.service import session_view
from app.store import builds as builds_store
from app.store import chunks as chunks_store
from app.store import offload_events as offload_events_store
from app.store import receipts as receipts_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Chunk, OffloadEvent, PromptBuild, Session, SessionKey
from app.store.scratchpads import get_scratchpad
from app.store.sessions import effective_config, require_session, session_budget
from app.store.turns import to_record

SESSIONS_PER_PAGE = 50
CHART_TURN_POINTS = 600
OFFLOADS_SHOWN = 500
CHUNKS_SHOWN = 200
WINDOW_TURNS_SHOWN = 200
BUILDS_SHOWN = 10
MEMORIES_SHOWN = 200
RECEIPTS_SHOWN = 20
# A cleared result's stub names its call: the turns read before the first stub to find it.
STUB_CALL_LOOKBACK = 20


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    user_id: str | None
    turns: int
    chunks: int
    ratio: float
    level: str
    last_offload_at: datetime | None
    updated_at: datetime

    @classmethod
    def of(cls, session: Session, budget: Budget) -> "SessionRow":
        """`session` in the list, its ratio and level those of `budget` (the session's own)."""
        return cls(
            session_id=session.external_id,
            user_id=session.user_id,
            turns=session.turn_count,
            chunks=session.chunk_count,
            ratio=round(budget.ratio(), 4),
            level=budget.level(),
            last_offload_at=session.last_offload_at,
            updated_at=session.updated_at,
        )


async def sessions_list(
    db: AsyncSession, context: AppContext, caller: Caller, page: int
) -> tuple[list[SessionRow], bool]:
    """One page of the tenant's sessions, and whether another page follows."""
    rows = await sessions_store.list_sessions(
        db, caller.tenant_id, limit=SESSIONS_PER_PAGE + 1, offset=(page - 1) * SESSIONS_PER_PAGE
    )
    shown, more = cut(rows, SESSIONS_PER_PAGE)
    return [SessionRow.of(s, session_budget(context.settings, s)) for s in shown], more


@dataclass(frozen=True)
class SessionPage:
    view: SessionOut
    chart: LineChart
    offloads: list[OffloadEvent]
    layers: list[Segment]
    notes: Notes
    notes_meta: dict[str, Any]
    chunks: list[Chunk]
    more_chunks: bool
    window: list[TurnRecord]
    memories: list[MemoryOut]
    builds: list[BuildView]
    build: BuildView | None  # the one shown in full: the chosen one, else the newest
    stubs: dict[int, str]  # the shown build's cleared tool results as their stubs, by turn
    receipts: list[EraseReceiptOut]


async def session_page(
    db: AsyncSession, context: AppContext, caller: Caller, session_id: str, build_id: str | None
) -> SessionPage:
    settings = context.settings
    view = await session_view(db, caller, settings, context.cache, session_id)
    session = await require_session(db, caller, session_id)
    config = effective_config(settings, session)
    events = await offload_events_store.offload_events(
        db, session.tenant_id, session.id, OFFLOADS_SHOWN
    )
    marks = [
        OffloadMark(
            e.created_at,
            e.trigger_ratio,
            e.ratio_after,
            e.trigger,
            e.tokens_freed,
            e.turn_first,
            e.turn_last,
        )
        for e in events
    ]
    series = watermark_series(
        await turns_store.turn_timeline(db, session.tenant_id, session.id),
        marks,
        available=view.usage.limit,
        base_tokens=view.usage.c0 + REPLY_PRIMING_TOKENS,
    )
    chart = line_chart(
        thin(series, CHART_TURN_POINTS),
        {
            f"trigger θ {config.trigger_ratio:.2f}": config.trigger_ratio,
            f"target {config.target_ratio:.2f}": config.target_ratio,
            f"emergency {config.emergency_ratio:.2f}": config.emergency_ratio,
        },
    )
    pad = await get_scratchpad(db, session.tenant_id, session.id)
    covers = pad.covers_until_seq if pad else 0
    chunks = await chunks_store.list_chunks(
        db, session.tenant_id, session.id, (0, 0), CHUNKS_SHOWN + 1
    )
    window = (await turns_store.window_turns(db, session.tenant_id, session.id))[
        -WINDOW_TURNS_SHOWN:
    ]
    chunks, more_chunks = cut(chunks, CHUNKS_SHOWN)
    builds = await _build_views(
        db,
        session.key,
        await builds_store.recent_builds(db, session.tenant_id, session.id, BUILDS_SHOWN),
        Anchors(
            frozenset(t.seq for t in window),
            [(str(c.id), c.turn_first, c.turn_last) for c in chunks],
        ),
    )
    build = next((b for b in builds if b.build_id == build_id), builds[0] if builds else None)
    return SessionPage(
        view=view,
        chart=chart,
        offloads=events,
        layers=layer_bar(
            {"c0": view.usage.c0, "c1": view.usage.c1, "c2": view.usage.c2}, view.usage.limit
        ),
        notes=Notes.model_validate(pad.notes if pad else {}),
        notes_meta={
            "version": pad.version if pad else 0,
            "covers_until_seq": covers,
            "generator": pad.generator if pad else "rules",
            "token_count": pad.token_count if pad else 0,
            "stale": session.offloaded_until_seq > covers,
            "rebuild_pending": pad.rebuild_pending if pad else False,
            "dropped_items": pad.dropped_items if pad else 0,
            "stale_writes": pad.stale_writes if pad else 0,
            "updated_at": pad.updated_at if pad else None,
        },
        chunks=chunks,
        more_chunks=more_chunks,
        window=window,
        memories=(
            await list_memories(
                db,
                caller,
                session_id,
                Page(MEMORIES_SHOWN, None, (BIGINT_KEY, UUID_KEY)),
                include_superseded=True,
            )
        ).memories,
        builds=builds,
        build=build,
        stubs=await _stub_texts(db, session.key, build) if build else {},
        receipts=[
            receipt_out(r)
            for r in await receipts_store.session_receipts(
                db, caller.tenant_id, session_id, RECEIPTS_SHOWN
            )
        ],
    )


async def _build_views(
    db: AsyncSession, session: SessionKey, builds: list[PromptBuild], anchors: Anchors
) -> list[BuildView]:
    """The stored builds with each fragment's turns: a recalled chunk's from the build's recall
    items, else from the chunk itself."""
    chunk_ids = set()
    for b in builds:
        for entry in b.record.get("manifest", []):
            if entry["layer"] == "c3" and entry["source"] == "chunk":
                try:
                    chunk_ids.add(uuid.UUID(entry["id"]))
                except ValueError:
                    continue
    spans = await chunks_store.chunk_spans(db, *session, chunk_ids)
    return [
        build_view(str(b.id), b.created_at, b.record, chunk_turns=spans, anchors=anchors)
        for b in builds
    ]


async def _stub_texts(db: AsyncSession, session: SessionKey, build: BuildView) -> dict[int, str]:
    """The build's cleared tool results as the stubs it showed, made again from the stored turns
    (with their calls) by the same rules; a result forgotten since has none."""
    stubs = {f.turns[0]: f.chunk_id for f in build.stubs if f.turns}
    if not stubs:
        return {}
    turns = [
        to_record(t)
        for t in await turns_store.live_turns(
            db, *session, min(stubs) - STUB_CALL_LOOKBACK, max(stubs)
        )
    ]
    chunk_of = {seq: chunk for seq, chunk in stubs.items() if chunk}
    history = History(turns, chunk_of, ToolClearing())
    return {t.seq: history.stub(t).content for t in turns if t.seq in stubs}
