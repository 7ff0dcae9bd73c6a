"""Notes (C2) against the real database: compare-and-set under races, the rule generator through
offloaded turns, the LLM generator's failure path, and the versioned notes cache."""

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.domain.callers import Caller
from app.notes.policy import DROP_ORDER
from app.notes.schemas import Notes
from app.notes.service import (
    compute_notes,
    current_notes,
    notes_cache_key,
    notes_message_tokens,
    refresh_notes,
    write_notes,
)
from app.offload.service import offload_session
from app.store import sessions as sessions_store
from app.store.models import Session
from tests.offload.test_offload_service import session_pk
from tests.support.factories import append, configure, new_caller, tenant_of, transaction
from tests.support.loopback import loopback_server

# Everything but a two-turn floor can be offloaded; `until_tokens=0` asks for exactly that.
TINY_FLOOR = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 2,
    "min_recent_tokens": 10,
}
FILLER = [
    {"role": "user", "content": "Let me look at the weather forecast for those days later on."},
    {"role": "assistant", "content": "I will check the forecast when you are ready."},
]

# (role, content); the expectations below name turns by their 1-based seq.
ENGLISH = [
    ("user", "I want to plan a two-day offsite in Lisbon for the platform team."),
    ("assistant", "Sure. I will look at venues and travel options."),
    ("user", "The budget must not exceed 8000 EUR."),
    ("assistant", "Noted. I found three venues in Alfama and Belém."),
    ("user", "Don't book any flights before 9 am."),
    ("assistant", "Understood, I will only look at later departures."),
    ("user", "We decided to use the Alfama loft for the workshop."),
    ("assistant", "Booked the Alfama loft for both days."),
    ("user", "My booking reference is LX-40917 and the deposit is 1200 EUR."),
    ("assistant", "Thanks, I have saved the reference."),
    ("user", "Everyone must be back home by Friday evening."),
    ("assistant", "Then the return flights should leave Friday afternoon."),
    ("user", "Actually, the budget must not exceed 9500 EUR."),
    ("assistant", "Updated the budget."),
]
CHINESE = [
    ("user", "我想在杭州办一次两天的团队建设活动。"),
    ("assistant", "好的，我先看看场地和交通。"),
    ("user", "预算不超过5万元。"),
    ("assistant", "明白，我找到了三个场地。"),
    ("user", "不要安排在周末。"),
    ("assistant", "好的，只看工作日。"),
    ("user", "住宿就用西湖国宾馆。"),
    ("assistant", "已经预订西湖国宾馆两晚。"),
    ("user", "订单号是HZ-20240518，定金3000元。"),
    ("assistant", "收到，已记录订单号。"),
    ("user", "必须有无障碍通道。"),
    ("assistant", "我会确认场地的无障碍设施。"),
    ("user", "其实预算不超过6万元。"),
    ("assistant", "好的，预算已更新。"),
]
SCRIPTS: dict[str, dict[str, Any]] = {
    "en": {
        "turns": ENGLISH,
        "expected": [
            ("goal", 1, "offsite in Lisbon"),
            ("constraints", 5, "Don't book any flights before 9 am"),  # negation
            ("constraints", 11, "must be back home by Friday"),  # hard constraint
            ("constraints", 13, "must not exceed 9500 EUR"),  # the correction
            ("decisions", 7, "decided to use the Alfama loft"),
            ("facts", 9, "LX-40917"),
            ("facts", 9, "1200 EUR"),
        ],
        "superseded": "8000 EUR",
    },
    "zh": {
        "turns": CHINESE,
        "expected": [
            ("goal", 1, "杭州办一次两天的团队建设活动"),
            ("constraints", 5, "不要安排在周末"),  # negation
            ("constraints", 11, "必须有无障碍通道"),  # hard constraint
            ("constraints", 13, "预算不超过6万元"),  # the correction
            ("decisions", 7, "住宿就用西湖国宾馆"),
            ("facts", 9, "HZ-20240518"),
            ("facts", 9, "3000元"),
        ],
        "superseded": "5万元",
    },
}


def as_turns(script: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in script]


async def scratchpad(engine: AsyncEngine, pk: uuid.UUID) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT p.version, p.covers_until_seq, p.notes, p.token_count, "
                    "p.rebuild_pending, p.stale_writes, p.generator, p.dropped_items, "
                    "s.notes_version, s.c2_tokens, s.offloaded_until_seq "
                    "FROM sessions s LEFT JOIN scratchpads p ON p.session_id = s.id "
                    "WHERE s.id = :s"
                ),
                {"s": pk},
            )
        ).one()
    return dict(row._mapping)


async def max_offloaded_seq(engine: AsyncEngine, pk: uuid.UUID) -> int:
    async with engine.connect() as conn:
        return await conn.scalar(
            text("SELECT max(seq) FROM turns WHERE session_id = :s AND chunk_id IS NOT NULL"),
            {"s": pk},
        )


async def offload_all(engine: AsyncEngine, settings: Settings, cache: Cache, pk: uuid.UUID) -> int:
    """Offload every turn above the floor; returns the number of turns moved."""
    async with transaction(engine) as db:
        result = await offload_session(
            db, settings, cache, await tenant_of(db, pk), pk, trigger="test", until_tokens=0
        )
    assert result is not None and result.turns_moved > 0
    return result.turns_moved


async def refresh(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    pk: uuid.UUID,
    llm_client: httpx.AsyncClient | None = None,
) -> str:
    async with transaction(engine) as db:
        return await refresh_notes(
            db, settings, cache, await tenant_of(db, pk), pk, llm_client=llm_client
        )


async def offloaded_session(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    turns: list[dict[str, Any]],
    caller: Caller | None = None,
    sid: str = "notes",
) -> tuple[Caller, uuid.UUID]:
    """A session whose `turns` are all offloaded (two filler turns stay as the C1 floor)."""
    caller = caller or await new_caller(engine)
    await configure(engine, caller, settings, cache, sid, **TINY_FLOOR)
    pk = await session_pk(engine, caller.tenant_id, sid)
    await add_and_offload(engine, settings, cache, caller, pk, turns, sid)
    assert await max_offloaded_seq(engine, pk) == len(turns)
    return caller, pk


async def add_and_offload(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    caller: Caller,
    pk: uuid.UUID,
    turns: list[dict[str, Any]],
    sid: str = "notes",
) -> int:
    """Append `turns` and two filler turns, then offload all but the floor (the filler turns, and
    those appended before). Returns the newest offloaded seq."""
    await append(engine, caller, settings, cache, sid, [*turns, *FILLER])
    await offload_all(engine, settings, cache, pk)
    return await max_offloaded_seq(engine, pk)


async def test_racing_drafts_from_one_base_write_one_version_and_count_the_loser(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller, pk = await offloaded_session(engine, settings, cache, as_turns(ENGLISH[:8]))
    assert await refresh(engine, settings, cache, pk) == "written"
    base = await scratchpad(engine, pk)
    assert base["version"] == 1 and base["stale_writes"] == 0

    # Two jobs read the same base version, each in its own transaction.
    await add_and_offload(engine, settings, cache, caller, pk, as_turns(ENGLISH[8:]))
    drafts = []
    for _ in range(2):
        async with transaction(engine) as db:
            session = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
            assert session is not None
            drafts.append(await compute_notes(db, settings, session))
    assert [d.base_version for d in drafts] == [1, 1]
    first_cover = drafts[0].covers_until_seq

    # More turns are offloaded before either draft is written.
    newest = await add_and_offload(engine, settings, cache, caller, pk, FILLER)
    assert newest > first_cover

    outcomes = []
    for draft in drafts:
        async with transaction(engine) as db:
            outcomes.append(await write_notes(db, cache, draft))
    assert outcomes == ["written", "stale"]
    after = await scratchpad(engine, pk)
    assert after["version"] == 2  # v -> v+1 exactly once for base v
    assert after["notes_version"] == 2
    assert after["stale_writes"] == 1
    assert after["covers_until_seq"] == first_cover
    assert after["offloaded_until_seq"] == newest  # so the notes are stale

    # A further refresh picks up everything offloaded since, including what the loser dropped.
    assert await refresh(engine, settings, cache, pk) == "written"
    final = await scratchpad(engine, pk)
    assert final["version"] == 3 and final["stale_writes"] == 1
    assert final["covers_until_seq"] == newest == final["offloaded_until_seq"]
    constraints = [i["text"] for i in final["notes"]["constraints"]]
    assert "Actually, the budget must not exceed 9500 EUR." in constraints
    assert "The budget must not exceed 8000 EUR." not in constraints


async def test_concurrent_refreshes_leave_versions_and_stale_counts_consistent(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    _, pk = await offloaded_session(engine, settings, cache, as_turns(CHINESE))
    attempts = 0
    successes = 0
    for _round in range(3):
        before = await scratchpad(engine, pk)
        results = await asyncio.gather(*(refresh(engine, settings, cache, pk) for _ in range(4)))
        written = results.count("written")
        assert written + results.count("stale") == len(results)
        attempts += len(results)
        successes += written
        after = await scratchpad(engine, pk)
        version_before = before["version"] or 0
        stale_before = before["stale_writes"] or 0
        assert after["version"] - version_before == written >= 1
        assert (after["stale_writes"] - stale_before) + written == len(results)
        assert after["notes_version"] == after["version"]
    final = await scratchpad(engine, pk)
    assert final["version"] == successes
    assert final["stale_writes"] + successes == attempts
    assert final["covers_until_seq"] == await max_offloaded_seq(engine, pk)
    assert final["c2_tokens"] == notes_message_tokens(Notes.model_validate(final["notes"]))


@pytest.mark.parametrize("language", ["en", "zh"])
async def test_rule_notes_through_the_database_keep_every_constraint_with_its_turn(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    client: httpx.AsyncClient,
    tenant_name: str,
    language: str,
) -> None:
    script = SCRIPTS[language]
    caller = await new_caller(engine, tenant_name)
    sid = f"script-{language}"
    _, pk = await offloaded_session(
        engine, settings, cache, as_turns(script["turns"]), caller=caller, sid=sid
    )
    stale = (await client.get(f"/v1/sessions/{sid}/scratchpad")).json()
    assert (stale["version"], stale["stale"]) == (0, True)

    assert await refresh(engine, settings, cache, pk) == "written"
    row = await scratchpad(engine, pk)
    notes = Notes.model_validate(row["notes"])
    for section, seq, fragment in script["expected"]:
        items = [(i.seq, i.text) for i in notes.section(section)]
        assert any(s == seq and fragment in t for s, t in items), (section, seq, fragment, items)
        assert all(i.source == "user" for i in notes.section(section))
    # The correction replaced the earlier value: one budget constraint, the later one.
    assert not any(script["superseded"] in item.text for item in notes.items())
    assert row["dropped_items"] == 0
    assert row["covers_until_seq"] == len(script["turns"])
    assert row["notes_version"] == row["version"] == 1
    assert row["c2_tokens"] == notes_message_tokens(notes) > 0

    pad = (await client.get(f"/v1/sessions/{sid}/scratchpad")).json()
    assert pad["version"] == 1 and pad["stale"] is False
    assert pad["covers_until_seq"] == len(script["turns"])
    assert pad["generator"] == "rules" and pad["rebuild_pending"] is False
    assert Notes.model_validate(pad["notes"]) == notes
    view = (await client.get(f"/v1/sessions/{sid}")).json()
    assert view["usage"]["c2"] == row["c2_tokens"]

    # A new offload makes the notes stale until the next refresh.
    await add_and_offload(engine, settings, cache, caller, pk, FILLER, sid)
    pad = (await client.get(f"/v1/sessions/{sid}/scratchpad")).json()
    assert pad["version"] == 1 and pad["stale"] is True
    assert await refresh(engine, settings, cache, pk) == "written"
    pad = (await client.get(f"/v1/sessions/{sid}/scratchpad")).json()
    assert pad["version"] == 2 and pad["stale"] is False
    assert pad["covers_until_seq"] == await max_offloaded_seq(engine, pk)


def chat_reply(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


LLM_NOTES = {
    "goal": [{"text": "offsite in Lisbon", "seq": 1, "subject": None, "source": "user"}],
    "constraints": [
        {"text": "budget at most 9500 EUR", "seq": 15, "subject": "budget", "source": "user"}
    ],
    "decisions": [
        {"text": "Alfama loft for the workshop", "seq": 9, "subject": "venue", "source": "user"}
    ],
}


@pytest.mark.parametrize(
    "failure",
    [(500, {"error": "upstream down"}), (200, chat_reply("this is not JSON")), (200, {})],
    ids=["http-500", "bad-json", "no-choices"],
)
async def test_llm_failure_keeps_previous_notes_and_flags_a_rebuild(
    engine: AsyncEngine, settings: Settings, cache: Cache, failure: tuple[int, Any]
) -> None:
    caller, pk = await offloaded_session(engine, settings, cache, as_turns(ENGLISH[:6]))
    assert await refresh(engine, settings, cache, pk) == "written"  # v1 from the rule generator
    v1 = await scratchpad(engine, pk)
    # ENGLISH[6:] gets seqs 9.. (two filler turns sit at 7 and 8).
    await add_and_offload(engine, settings, cache, caller, pk, as_turns(ENGLISH[6:]))

    answer: dict[str, tuple[int, Any]] = {"now": failure}
    with loopback_server(lambda method, path, body: answer["now"]) as llm:
        llm_settings = settings.model_copy(
            update={
                "notes": settings.notes.model_copy(
                    update={"generator": "llm", "llm_base_url": llm.url, "llm_timeout_seconds": 5}
                )
            }
        )
        async with httpx.AsyncClient(trust_env=False) as http:
            assert await refresh(engine, llm_settings, cache, pk, http) == "failed"
            failed = await scratchpad(engine, pk)
            assert failed["version"] == failed["notes_version"] == 1
            assert failed["notes"] == v1["notes"] and failed["generator"] == "rules"
            assert failed["rebuild_pending"] is True
            assert failed["stale_writes"] == 0
            assert failed["c2_tokens"] == v1["c2_tokens"]
            [(method, path, sent)] = llm.requests
            assert (method, path) == ("POST", "/v1/chat/completions")
            assert "[seq 9 | user] We decided" in sent["messages"][1]["content"]
            assert "[seq 1 | user]" not in sent["messages"][1]["content"]  # incremental

            answer["now"] = (200, chat_reply(json.dumps(LLM_NOTES)))
            assert await refresh(engine, llm_settings, cache, pk, http) == "written"
    good = await scratchpad(engine, pk)
    assert good["version"] == good["notes_version"] == 2
    assert good["rebuild_pending"] is False and good["generator"] == "llm"
    # The pending rebuild regenerated from every raw turn, not from the previous notes.
    assert "[seq 1 | user]" in llm.requests[-1][2]["messages"][1]["content"]
    assert good["covers_until_seq"] == await max_offloaded_seq(engine, pk)
    notes = Notes.model_validate(good["notes"])
    assert [(i.seq, i.text) for i in notes.constraints] == [(15, "budget at most 9500 EUR")]
    assert good["c2_tokens"] == notes_message_tokens(notes)


async def test_current_notes_never_serves_an_older_version_after_a_write(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller, pk = await offloaded_session(engine, settings, cache, as_turns(CHINESE[:6]))
    assert await refresh(engine, settings, cache, pk) == "written"

    async def row() -> Session:
        async with transaction(engine) as db:
            session = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
            assert session is not None
            return session

    async def read() -> Any:
        async with transaction(engine) as db:
            session = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
            assert session is not None
            return await current_notes(db, cache, session)

    first = await read()
    assert first.version == 1
    assert await cache.get_json(notes_cache_key(cache, await row(), 1)) is not None  # warmed
    assert (await read()).notes == first.notes

    newest = await add_and_offload(engine, settings, cache, caller, pk, as_turns(CHINESE[6:]))
    assert await refresh(engine, settings, cache, pk) == "written"
    for _ in range(2):  # the first read fills the cache, the second is served from it
        snapshot = await read()
        assert snapshot.version == 2
        assert snapshot.covers_until_seq == newest
        texts = [item.text for item in snapshot.notes.constraints]
        assert "其实预算不超过6万元。" in texts and "预算不超过5万元。" not in texts
    cached = await cache.get_json(notes_cache_key(cache, await row(), 2))
    assert cached is not None and cached["version"] == 2


async def test_the_cap_drops_by_priority_and_every_build_manifest_says_what(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    client: httpx.AsyncClient,
    tenant_name: str,
) -> None:
    caller = await new_caller(engine, tenant_name)
    _, pk = await offloaded_session(
        engine, settings, cache, as_turns(ENGLISH), caller=caller, sid="capped"
    )
    tight = settings.model_copy(
        update={"notes": settings.notes.model_copy(update={"max_tokens": 60})}
    )
    assert await refresh(engine, tight, cache, pk) == "written"

    pad = (await client.get("/v1/sessions/capped/scratchpad")).json()
    assert pad["token_count"] <= 60 and pad["dropped_items"] == len(pad["dropped"]) > 0
    kept = {(name, i["seq"]) for name, items in pad["notes"].items() for i in items}
    dropped = [(d["section"], d["seq"]) for d in pad["dropped"]]
    assert not kept & set(dropped)
    # Constraints are what is left: everything else went first, the oldest constraint last.
    assert {name for name, _ in kept} == {"constraints"}
    sections = [name for name, _ in dropped]
    rank = {name: n for n, (name, tool_only) in enumerate(DROP_ORDER) if not tool_only}
    assert [rank[s] for s in sections] == sorted(rank[s] for s in sections)
    assert sections[-1] == "constraints" and "decisions" in sections

    build = await client.post("/v1/sessions/capped/build-prompt", json={"query": "budget?"})
    assert build.status_code == 200, build.text
    manifest = build.json()["manifest"]
    entries = [m for m in manifest if m["id"].startswith("notes:")]
    assert [(m["id"], m["layer"], m["included"], m["reason"]) for m in entries] == [
        (f"notes:{section}:{seq}", "c2", False, "notes_cap") for section, seq in dropped
    ]
    assert [m["tokens"] for m in entries] == [d["tokens"] for d in pad["dropped"]]
    ids = [m["id"] for m in manifest]
    assert ids.index("notes") + 1 == ids.index(entries[0]["id"])  # listed after the notes block
