"""The offload against the real database: trigger, target, floors, hysteresis, coverage."""

import uuid
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import driver_connection
from app.offload.service import offload_session
from app.store import chunks as chunks_store
from tests.support.factories import append, configure, new_caller, tenant_of, transaction

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
WORDS = ["budget", "train", "Lyon", "order", "AB-12345", "hotel", "price", "window", "seat"]
HANZI = ["预算", "火车", "里昂", "订单", "酒店", "价格", "靠窗", "座位", "不要", "必须"]


@st.composite
def turn_batches(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    batches: list[list[dict[str, Any]]] = []
    for i in range(draw(st.integers(20, 60))):
        words = draw(st.lists(st.sampled_from(WORDS + HANZI), min_size=1, max_size=60))
        content = " ".join(words) + f" #{i}"
        if draw(st.integers(0, 6)) == 0:
            call_id = f"call_{i}"
            call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            batches.append(
                [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call_id, "content": content},
                ]
            )
        else:
            role = draw(st.sampled_from(["user", "assistant"]))
            batches.append([{"role": role, "content": content}])
    return batches


async def session_pk(engine: AsyncEngine, tenant_id: uuid.UUID, sid: str) -> uuid.UUID:
    async with engine.connect() as conn:
        return await conn.scalar(
            text("SELECT id FROM sessions WHERE tenant_id = :t AND external_id = :s"),
            {"t": tenant_id, "s": sid},
        )


async def check_coverage(engine: AsyncEngine, pk: uuid.UUID) -> tuple[int, int]:
    """Every turn is in C1 or in exactly one chunk whose raw text holds it verbatim."""
    async with engine.connect() as conn:
        turns = (
            await conn.execute(
                text(
                    "SELECT seq, content, chunk_id, role, tool_call_id, tool_calls FROM turns "
                    "WHERE session_id = :s ORDER BY seq"
                ),
                {"s": pk},
            )
        ).all()
        chunks = (
            await conn.execute(
                text(
                    "SELECT id, turn_first, turn_last, part, parts, raw_text FROM chunks "
                    "WHERE session_id = :s"
                ),
                {"s": pk},
            )
        ).all()
    by_id = {c.id: c for c in chunks}
    covering_seq: dict[int, list[Any]] = {}
    for c in chunks:
        if c.part <= 1:
            for seq in range(c.turn_first, c.turn_last + 1):
                covering_seq.setdefault(seq, []).append(c)
    in_window = 0
    call_home: dict[str, Any] = {}
    for turn in turns:
        covering = covering_seq.get(turn.seq, [])
        if turn.chunk_id is None:
            in_window += 1
            assert covering == [], f"turn {turn.seq} in C1 and in a chunk"
        else:
            assert [c.id for c in covering] == [turn.chunk_id]
            chunk = by_id[turn.chunk_id]
            if chunk.parts == 1:
                assert turn.content in chunk.raw_text
        for call in turn.tool_calls or []:
            call_home[call["id"]] = turn.chunk_id
        if turn.role == "tool":
            assert call_home[turn.tool_call_id] == turn.chunk_id, "tool pair split"
    # C1 is a suffix: once a turn is in the window, every later turn is too.
    window_flags = [t.chunk_id is None for t in turns]
    assert window_flags == sorted(window_flags)
    return in_window, len(chunks)


@hyp_settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=turn_batches())
async def test_offload_triggers_reaches_target_keeps_floors_and_covers_every_turn(
    engine: AsyncEngine, settings: Settings, cache: Cache, batches: list[list[dict[str, Any]]]
) -> None:
    caller = await new_caller(engine)
    sid = "prop"
    await configure(engine, caller, settings, cache, sid, **SMALL)
    pk = None
    offloads = 0
    ratio = 0.0
    for batch in batches:
        before = ratio
        resp = await append(engine, caller, settings, cache, sid, batch)
        ratio = resp["watermark"]["ratio"]
        pk = pk or await session_pk(engine, caller.tenant_id, sid)
        if resp["offload_enqueued"]:
            # fires only on a crossing of θ (or in the emergency band), never while disarmed
            assert ratio >= 0.80
            assert before < 0.80 or ratio >= 0.95
            async with transaction(engine) as db:
                result = await offload_session(
                    db, settings, cache, await tenant_of(db, pk), pk, trigger="test"
                )
            assert result is not None
            offloads += 1
            ratio = result.ratio_after
            if not result.floor_limited:
                assert result.ratio_after <= 0.65
        else:
            assert ratio < 0.80 or before >= 0.80
    assert pk is not None
    in_window, _ = await check_coverage(engine, pk)
    if offloads:
        async with engine.connect() as conn:
            window_tokens = await conn.scalar(
                text(
                    "SELECT sum(token_count) FROM turns WHERE session_id = :s AND chunk_id IS NULL"
                ),
                {"s": pk},
            )
            events = await conn.scalar(
                text("SELECT count(*) FROM offload_events WHERE session_id = :s"), {"s": pk}
            )
        assert in_window >= SMALL["min_recent_turns"]
        assert window_tokens >= SMALL["min_recent_tokens"]
        assert events == offloads


async def test_offload_is_idempotent_and_records_its_event(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller = await new_caller(engine)
    await configure(engine, caller, settings, cache, "idem", **SMALL)
    resp: dict[str, Any] = {}
    i = 0
    while not resp.get("offload_enqueued"):
        resp = await append(
            engine,
            caller,
            settings,
            cache,
            "idem",
            [{"role": "user", "content": f"message {i}: " + "hotel price budget " * 20}],
        )
        i += 1
    pk = await session_pk(engine, caller.tenant_id, "idem")
    async with transaction(engine) as db:
        first = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test"
        )
    async with transaction(engine) as db:
        again = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test"
        )
    assert first is not None and first.turns_moved > 0
    assert again is None  # already under target: nothing moves twice
    in_window, chunks = await check_coverage(engine, pk)
    assert chunks == first.chunks_written
    assert in_window == i - first.turns_moved
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT trigger_ratio, ratio_after, tokens_freed, chunks_offloaded, turns "
                    "FROM offload_events WHERE session_id = :s"
                ),
                {"s": pk},
            )
        ).one()
        jobs = (
            (
                await conn.execute(
                    text(
                        "SELECT task_name FROM procrastinate_jobs WHERE args->>'session_pk' = :s "
                        "OR args->'chunk_ids' ? :c ORDER BY id"
                    ),
                    {"s": str(pk), "c": str(first.chunk_ids[0])},
                )
            )
            .scalars()
            .all()
        )
        offloaded_until, last_offloaded = (
            await conn.execute(
                text(
                    "SELECT offloaded_until_seq, (SELECT max(seq) FROM turns WHERE session_id = :s "
                    "AND chunk_id IS NOT NULL) FROM sessions WHERE id = :s"
                ),
                {"s": pk},
            )
        ).one()
    assert row.trigger_ratio >= 0.80 and row.ratio_after <= 0.65
    assert (row.tokens_freed, row.chunks_offloaded, row.turns) == (
        first.tokens_freed,
        first.chunks_written,
        first.turns_moved,
    )
    assert jobs == ["offload:run", "offload:embed_chunks", "notes:refresh"]
    assert offloaded_until == last_offloaded == first.turns_moved  # notes now stale


async def test_exact_hits_find_ids_and_quotes_verbatim_through_the_lexical_index(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller = await new_caller(engine)
    sid = "exact-hits"
    await configure(engine, caller, settings, cache, sid, **SMALL)
    turns = [
        {"role": "user", "content": f"note {i}: " + "the parcel was one of the boxes sent. " * 9}
        for i in range(40)
    ]
    turns[3]["content"] = "the order AB-12345 ships on Friday"
    turns[9]["content"] = "预算不超过一百二十欧元，订单号 XY-987"
    turns[15]["content"] = "keep the AB-123456 receipt"  # the ID inside a longer one
    await append(engine, caller, settings, cache, sid, turns)
    pk = await session_pk(engine, caller.tenant_id, sid)
    async with transaction(engine) as db:
        assert (
            await offload_session(db, settings, cache, await tenant_of(db, pk), pk, trigger="test")
            is not None
        )
    async with engine.connect() as conn:
        holding = dict(
            (
                await conn.execute(
                    text("SELECT raw_text, id FROM chunks WHERE session_id = :s"), {"s": pk}
                )
            ).all()
        )

    def chunk_of(fragment: str) -> str:
        return next(str(cid) for raw, cid in holding.items() if fragment in raw)

    async with engine.connect() as conn:
        driver = await driver_connection(conn)
        assert await chunks_store.exact_hits(driver, caller.tenant_id, pk, ["ab-12345"], 10) == [
            chunk_of("AB-12345 ")
        ]
        assert await chunks_store.exact_hits(
            driver, caller.tenant_id, pk, ["一百二十欧元"], 10
        ) == [chunk_of("XY-987")]
        both = await chunks_store.exact_hits(driver, caller.tenant_id, pk, ["xy-987", "Friday"], 10)
        assert sorted(both) == sorted({chunk_of("XY-987"), chunk_of("Friday")})
        assert await chunks_store.exact_hits(driver, caller.tenant_id, pk, ["AB-99999"], 10) == []
        # A needle of stopwords only has no terms: every chunk is checked, and it is still found.
        assert len(await chunks_store.exact_hits(driver, caller.tenant_id, pk, ["of the"], 3)) == 3
        # LIKE's wildcards in a needle are matched as themselves.
        assert await chunks_store.exact_hits(driver, caller.tenant_id, pk, ["%12345%"], 10) == []


async def test_embeddings_are_stored_in_the_row(engine: AsyncEngine) -> None:
    # MAIN: the vector stays in the chunk row (pgvector's own default, EXTERNAL, moves it out of
    # line once the row passes 2 kB, and every exact scan then reads it through the TOAST index).
    async with engine.connect() as conn:
        storage = await conn.scalar(
            text(
                "SELECT attstorage FROM pg_attribute "
                "WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
            )
        )
    assert storage == "m"


async def test_a_layered_result_leaves_a_small_window_with_its_arrival_pieces(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    """A 2,500-token model reads a document of 60,000 characters (layered on arrival: a view of
    ~2,000 tokens in the window, the whole text in pieces in C3). The offload moves it out so
    the window drains, and marks it covered by its arrival pieces: one set of pieces per turn,
    so the turn still joins whole byte for byte."""
    caller = await new_caller(engine)
    sid = "layered-small"
    await configure(engine, caller, settings, cache, sid, context_limit=2500, reserve_tokens=300)
    document = "\n".join(
        f"第{i}条：航班HAT{100 + i % 50:03d}于2024-05-{10 + i % 20:02d}起飞，票价{300 + i * 7}元。"
        if i % 2
        else f"line {i}: flight HAT{100 + i % 50:03d} departs 2024-05-{10 + i % 20:02d}."
        for i in range(1500)
    )
    assert len(document) > 60_000
    fetch = {"id": "call_doc", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}
    cancel = {
        "id": "call_cx",
        "type": "function",
        "function": {"name": "cancel", "arguments": "{}"},
    }
    await append(engine, caller, settings, cache, sid, [{"role": "user", "content": "Read it."}])
    await append(
        engine,
        caller,
        settings,
        cache,
        sid,
        [
            {"role": "assistant", "content": None, "tool_calls": [fetch]},
            {"role": "tool", "tool_call_id": "call_doc", "content": document},
        ],
    )
    pk = await session_pk(engine, caller.tenant_id, sid)
    async with transaction(engine) as db:
        arrival = await chunks_store.turn_pieces(db, caller.tenant_id, pk, 3)
    assert len(arrival) > 50
    resp = await append(
        engine,
        caller,
        settings,
        cache,
        sid,
        [
            {"role": "user", "content": "Cancel NO6JO3."},
            {"role": "assistant", "content": None, "tool_calls": [cancel]},
            {"role": "tool", "tool_call_id": "call_cx", "content": "Error: basic economy"},
            {"role": "assistant", "content": "NO6JO3 cannot be cancelled."},
        ],
    )
    assert resp["watermark"]["ratio"] > 0.9  # the view alone nearly fills the window
    async with transaction(engine) as db:
        moved = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test"
        )
    assert moved is not None and moved.turns_moved == 3  # the user turn, the call, the result
    assert moved.ratio_after < 0.65 and not moved.floor_limited
    async with transaction(engine) as db:
        pieces = await chunks_store.turn_pieces(db, caller.tenant_id, pk, 3)
        covering = (
            await db.execute(
                text("SELECT seq, chunk_id FROM turns WHERE session_id = :s ORDER BY seq"),
                {"s": pk},
            )
        ).all()
    assert [p.id for p in pieces] == [p.id for p in arrival]  # not chunked again as its view
    assert covering[2].chunk_id == arrival[0].id
    assert [row.chunk_id is None for row in covering] == [False] * 3 + [True] * 4
