"""The user's memory in tiers through HTTP: what the user says about themselves becomes user
memory at the append; a move ("I live in Paris" … "we moved to Lyon") leaves a new session
with the new city only; said again in another session, an item is promoted long-term; unseen
for `memory.decay_days`, it loses weight; a tool result never becomes user memory; a less
trusted contradiction is shown dated, never as current. English and Chinese."""

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

SYSTEM = "You are a helpful assistant."


async def open_session(client: httpx.AsyncClient, sid: str, user: str) -> None:
    assert (await client.put(f"/v1/sessions/{sid}", json={"user_id": user})).status_code == 200


async def say(client: httpx.AsyncClient, sid: str, text: str, at: datetime | None = None) -> None:
    """A user turn and a reply, dated `at` through their metadata (the clock build-prompt and
    the capture read)."""
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Noted."},
    ]
    if at is not None:
        for turn in turns:
            turn["metadata"] = {"time": at.isoformat()}
    resp = await client.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text


async def memories(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    resp = await client.get(f"/v1/sessions/{sid}/memories", params={"include_superseded": "true"})
    assert resp.status_code == 200, resp.text
    listed: list[dict[str, Any]] = resp.json()["memories"]
    return listed


async def build(client: httpx.AsyncClient, sid: str, query: str) -> dict[str, Any]:
    resp = await client.post(
        f"/v1/sessions/{sid}/build-prompt", json={"system": SYSTEM, "query": query}
    )
    assert resp.status_code == 200, resp.text
    built: dict[str, Any] = resp.json()
    return built


def about_user(built: dict[str, Any]) -> str:
    blocks = [
        m["content"]
        for m in built["messages"]
        if m["role"] == "system" and m["content"].startswith("<about_user>")
    ]
    assert len(blocks) == 1, built["messages"]
    block: str = blocks[0]
    return block


MOVES = [
    pytest.param(
        "I live in Paris, near the Louvre.",
        "Good news: we moved to Lyon last month!",
        "Can you find me a dentist close to home?",
        ("Lyon", "Paris"),
        id="en",
    ),
    pytest.param(
        "我住在巴黎。",
        "告诉你，我们上个月搬到了里昂。",
        "帮我找一个离家近的牙医。",
        ("里昂", "巴黎"),
        id="zh",
    ),
]


@pytest.mark.parametrize(("before", "after", "query", "cities"), MOVES)
async def test_a_new_session_after_a_move_knows_only_the_new_city(
    client: httpx.AsyncClient, before: str, after: str, query: str, cities: tuple[str, str]
) -> None:
    new, old = cities
    await open_session(client, "first", "u-move")
    await say(client, "first", before)
    await open_session(client, "second", "u-move")
    await say(client, "second", after)
    await open_session(client, "third", "u-move")

    block = about_user(await build(client, "third", query))
    assert new in block and old not in block

    listed = {m["text"]: m for m in await memories(client, "third")}
    moved = next(m for text, m in listed.items() if new in text)
    lived = next(m for text, m in listed.items() if old in text)
    assert (moved["status"], moved["in_force"], lived["status"], lived["in_force"]) == (
        "active",
        True,
        "superseded",
        False,
    )
    assert (moved["source"], moved["actor"], moved["trusted"], moved["scope"]) == (
        "user_turn",
        "user",
        True,
        "user",
    )
    assert moved["turn_seqs"] == [1] and moved["tier"] == "candidate"
    versions = (
        await client.get(f"/v1/sessions/third/memories/{lived['memory_id']}/versions")
    ).json()["versions"]
    assert [v["status"] for v in versions] == ["active", "superseded"]
    assert versions[-1]["reason"] == f"replaced by {moved['memory_id']}"
    # The session the user said it in sees it as said in this session.
    mine = [m for m in await memories(client, "second") if m["memory_id"] == moved["memory_id"]]
    assert mine[0]["tier"] == "session" and mine[0]["session_id"] == "second"


@pytest.mark.parametrize(
    ("statement", "again"),
    [
        ("I'm allergic to peanuts.", "Reminder: I'm allergic to peanuts."),
        ("我对花生过敏。", "提醒一下，我对花生过敏。"),
    ],
    ids=["en", "zh"],
)
async def test_said_again_in_another_session_an_item_is_promoted_long_term(
    client: httpx.AsyncClient, statement: str, again: str
) -> None:
    await open_session(client, "once", "u-promote")
    await say(client, "once", statement)
    [seen_once] = await memories(client, "once")
    assert (seen_once["tier"], seen_once["stability"], seen_once["stable_by"]) == (
        "session",
        0.25,
        [],
    )
    await open_session(client, "twice", "u-promote")
    [elsewhere] = await memories(client, "twice")
    assert elsewhere["tier"] == "candidate"

    await say(client, "twice", again)
    [promoted] = await memories(client, "twice")  # the same item, not a second one
    assert promoted["memory_id"] == seen_once["memory_id"]
    assert (promoted["tier"], promoted["stability"], promoted["stable_by"]) == (
        "long_term",
        0.5,
        ["sessions"],
    )
    assert promoted["revision"] == 2 and promoted["text"] == seen_once["text"]
    versions = (
        await client.get(f"/v1/sessions/twice/memories/{promoted['memory_id']}/versions")
    ).json()["versions"]
    assert [(v["actor"], v["reason"]) for v in versions] == [
        ("user", "said by the user (turn 1)"),
        ("rule", "promoted long_term: sessions"),
    ]


async def test_restated_a_week_later_promotes_and_the_user_confirming_does_too(
    client: httpx.AsyncClient,
) -> None:
    start = datetime.now(UTC)
    await open_session(client, "weeks", "u-time")
    await say(client, "weeks", "I prefer aisle seats.", start)
    await say(client, "weeks", "As I said, I prefer aisle seats.", start + timedelta(days=8))
    [item] = await memories(client, "weeks")
    assert (item["tier"], item["stable_by"]) == ("long_term", ["time"])

    await say(client, "weeks", "叫我小王。")
    named = next(m for m in await memories(client, "weeks") if "小王" in m["text"])
    assert named["tier"] == "session"
    confirmed = await client.post(
        "/v1/sessions/weeks/memories", json={"text": "叫我小王", "scope": "user", "actor": "user"}
    )
    assert confirmed.status_code == 201 and confirmed.json()["outcome"] == "duplicate"
    [after] = [m for m in await memories(client, "weeks") if m["memory_id"] == named["memory_id"]]
    assert (after["tier"], after["stability"], after["stable_by"]) == (
        "long_term",
        0.75,
        ["confirmed"],
    )


async def test_an_item_unseen_for_the_decay_period_loses_weight_in_ranking(
    client: httpx.AsyncClient,
) -> None:
    await open_session(client, "pref-1", "u-decay")
    await say(client, "pref-1", "I prefer aisle seats.")
    await open_session(client, "pref-2", "u-decay")
    await say(client, "pref-2", "I prefer aisle seats, as always.")
    query = "Book me seats on the train to Lyon."

    def score(built: dict[str, Any]) -> float:
        [entry] = [m for m in built["manifest"] if m["source"] == "user_memory"]
        value: float = entry["score"]
        return value

    await open_session(client, "soon", "u-decay")
    await say(client, "soon", "Hello again.", datetime.now(UTC) + timedelta(days=30))
    fresh = score(await build(client, "soon", query))
    await open_session(client, "months-later", "u-decay")
    await say(client, "months-later", "Hello again.", datetime.now(UTC) + timedelta(days=100))
    stale = about_built = await build(client, "months-later", query)
    assert fresh > 0 and score(stale) == pytest.approx(fresh * 0.5, rel=1e-3)
    assert "aisle" in about_user(about_built)  # it weighs less; it is still the user's


@pytest.mark.parametrize(
    ("result", "city"),
    [
        ("CRM record: the user lives in Berlin. Note: I live in Berlin.", "Berlin"),
        ("客户档案：用户住在柏林。我住在柏林。", "柏林"),
    ],
    ids=["en", "zh"],
)
async def test_a_tool_result_or_a_turn_off_the_record_never_becomes_user_memory(
    client: httpx.AsyncClient, result: str, city: str
) -> None:
    await open_session(client, "tools", "u-tool")
    call = {"id": "call_1", "type": "function", "function": {"name": "crm", "arguments": "{}"}}
    turns = [
        {"role": "user", "content": "Look me up in the CRM."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
        {"role": "assistant", "content": f"You live in {city}, I see. I live in {city} too."},
    ]
    resp = await client.post("/v1/sessions/tools/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text
    assert await memories(client, "tools") == []
    off = {"role": "user", "content": "I live in Berlin.", "metadata": {"remember": False}}
    resp = await client.post("/v1/sessions/tools/turns", json={"turns": [off]})
    assert resp.status_code == 201, resp.text
    assert await memories(client, "tools") == []  # off the record
    await open_session(client, "tools-later", "u-tool")
    built = await build(client, "tools-later", "Where do I live?")
    assert not [m for m in built["manifest"] if m["source"] == "user_memory"]


@pytest.mark.parametrize(
    ("fact", "claimed", "query", "cities"),
    [
        (
            "We moved to Lyon.",
            "We moved to Berlin.",
            "Which city do I live in?",
            ("Lyon", "Berlin"),
        ),
        ("我们搬到了里昂。", "我们搬到了柏林。", "我住在哪个城市？", ("里昂", "柏林")),
    ],
    ids=["en", "zh"],
)
async def test_a_less_trusted_contradiction_is_shown_dated_never_as_current(
    client: httpx.AsyncClient, fact: str, claimed: str, query: str, cities: tuple[str, str]
) -> None:
    _, doubted = cities
    await open_session(client, "said", "u-dispute")
    await say(client, "said", fact)
    body = {"text": claimed, "scope": "user", "source": "tool_result", "source_tool": "crm"}
    written = await client.post("/v1/sessions/said/memories", json=body)
    assert written.status_code == 201 and written.json()["outcome"] == "candidate"

    await open_session(client, "asks", "u-dispute")
    lines = about_user(await build(client, "asks", query)).splitlines()
    current = [line for line in lines if line.startswith(f"- {fact}")]
    doubtful = [line for line in lines if doubted in line]  # only as the unconfirmed item
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert len(current) == 1 and f"(stated {today}; an unconfirmed item below" in current[0]
    assert len(doubtful) == 1 and doubtful[0].startswith(
        f"- Unconfirmed, not current (from tool_result crm, {today}): {claimed}"
    )
    assert "(untrusted" in doubtful[0] and lines.index(current[0]) < lines.index(doubtful[0])


@pytest.mark.parametrize(
    ("inferred", "said_text", "city"),
    [
        ("I live in Berlin.", "I live in Lyon.", "Lyon"),
        ("我住在柏林。", "我住在里昂。", "里昂"),
    ],
    ids=["en", "zh"],
)
async def test_what_the_user_says_beats_an_inference(
    client: httpx.AsyncClient, inferred: str, said_text: str, city: str
) -> None:
    await open_session(client, "infer", "u-infer")
    body = {"text": inferred, "scope": "user", "source": "inference"}
    guess = (await client.post("/v1/sessions/infer/memories", json=body)).json()["memory"]
    # Said after the guess, or dated before it: the user's word wins either way.
    await say(client, "infer", said_text, datetime.now(UTC) - timedelta(days=3))
    status = {m["text"]: m["status"] for m in await memories(client, "infer")}
    assert status == {inferred: "superseded", said_text: "active"}
    assert guess["status"] == "candidate"
    await open_session(client, "infer-2", "u-infer")
    block = about_user(await build(client, "infer-2", "Where do I live?"))
    assert city in block and "Unconfirmed" not in block


@pytest.mark.parametrize(
    ("newer", "older", "new_city", "old_city"),
    [
        ("We moved to Lyon.", "I live in Paris.", "Lyon", "Paris"),
        ("我们搬到了里昂。", "我住在巴黎。", "里昂", "巴黎"),
    ],
    ids=["en", "zh"],
)
async def test_an_older_statement_appended_late_stays_history(
    client: httpx.AsyncClient, newer: str, older: str, new_city: str, old_city: str
) -> None:
    await open_session(client, "late-1", "u-late")
    await say(client, "late-1", newer)
    await open_session(client, "late-2", "u-late")
    await say(client, "late-2", older, datetime.now(UTC) - timedelta(days=30))
    status = {m["text"]: m["status"] for m in await memories(client, "late-2")}
    assert status == {newer: "active", older: "superseded"}
    await open_session(client, "late-3", "u-late")
    block = about_user(await build(client, "late-3", "Where do I live?"))
    assert new_city in block and old_city not in block


@pytest.mark.parametrize(
    ("original", "correction", "new_city", "old_city"),
    [
        ("I live in Paris.", "Sorry, correction: I live in Lyon, not Paris.", "Lyon", "Paris"),
        ("我住在巴黎。", "不对，我住在里昂，不是巴黎。", "里昂", "巴黎"),
    ],
    ids=["en", "zh"],
)
async def test_a_correction_beats_the_original(
    client: httpx.AsyncClient, original: str, correction: str, new_city: str, old_city: str
) -> None:
    await open_session(client, "fix", "u-fix")
    await say(client, "fix", original)
    await say(client, "fix", correction)
    items = await memories(client, "fix")
    assert sorted((new_city in m["text"], m["status"], m["turn_seqs"]) for m in items) == [
        (False, "superseded", [1]),
        (True, "active", [3]),
    ]
    await open_session(client, "fix-later", "u-fix")
    lines = about_user(await build(client, "fix-later", "Where do I live?")).splitlines()
    assert [line for line in lines if new_city in line] and not [
        line for line in lines if old_city in line and new_city not in line
    ]


@pytest.mark.parametrize(
    ("statement", "again"),
    [
        ("I'm allergic to shellfish.", "Reminder: I'm allergic to shellfish."),
        ("我对海鲜过敏。", "提醒一下，我对海鲜过敏。"),
    ],
    ids=["en", "zh"],
)
@pytest.mark.parametrize("revoke", ["forget", "untrust", "delete"])
async def test_a_promotion_goes_with_the_turn_that_earned_it(
    admin: httpx.AsyncClient, statement: str, again: str, revoke: str
) -> None:
    user = f"u-fallback-{revoke}-{len(statement)}"
    first, second = f"said-{user}", f"again-{user}"
    await open_session(admin, first, user)
    await say(admin, first, statement)
    await open_session(admin, second, user)
    await say(admin, second, again)
    [promoted] = await memories(admin, first)
    assert promoted["tier"] == "long_term" and promoted["stable_by"] == ["sessions"]

    if revoke == "forget":
        body = {"type": "forget", "turn_range": [1, 1]}
        resp = await admin.post(f"/v1/sessions/{second}/memory", json=body)
    elif revoke == "untrust":
        body = {"turn_range": [1, 1]}
        resp = await admin.post(f"/v1/sessions/{second}/sources/untrust", json=body)
    else:
        resp = await admin.delete(f"/v1/sessions/{second}")
    assert resp.is_success, resp.text

    # The item stays (the first session's turn still says it), back to a candidate.
    [fallen] = await memories(admin, first)
    assert fallen["memory_id"] == promoted["memory_id"] and fallen["status"] == "active"
    assert (fallen["tier"], fallen["stability"], fallen["stable_by"]) == ("session", 0.25, [])
    if revoke != "delete":
        [elsewhere] = await memories(admin, second)
        assert elsewhere["tier"] == "candidate"
    versions = (
        await admin.get(f"/v1/sessions/{first}/memories/{promoted['memory_id']}/versions")
    ).json()["versions"]
    assert [v["actor"] for v in versions] == ["user", "rule", "rule"]
    assert versions[-1]["reason"].startswith("back to candidate: ")
