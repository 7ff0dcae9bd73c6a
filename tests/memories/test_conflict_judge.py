"""The optional LLM conflict judge: which items it is asked about (pure), and through HTTP against
a real loopback chat server — a contradiction the rules miss superseded when the judge says yes,
kept when it says no, the write unharmed when the judge fails. English and Chinese."""

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from app.memories.conflict_judge import ConflictJudgeUnavailable, parse_reply
from app.memories.conflicts import contradicts, judge_candidates, rules_silent
from tests.support.loopback import LoopbackServer, loopback_server
from tests.support.server import RunningServer, run_server

VEGETARIAN, STEAK = "I'm vegetarian.", "I had steak yesterday and loved it."
ZH_VEGETARIAN, ZH_STEAK = "我是素食者。", "我昨天吃了牛排，很好吃。"

# What the loopback judge answers: a verdict, an HTTP status, or a content that is not the JSON.
judge_answer: dict[str, Any] = {"status": 200, "content": json.dumps({"contradicts": True})}


def reply(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def answer(status: int = 200, content: str = json.dumps({"contradicts": True})) -> None:
    judge_answer.update(status=status, content=content)


# A question naming HELD_NEW is answered only once the test sets `release` (after `asked`).
HELD_NEW = "I had a burger for lunch today."
asked, release = threading.Event(), threading.Event()


def judging(method: str, path: str, body: Any) -> tuple[int, Any]:
    if f"NEW: {HELD_NEW}" in body["messages"][1]["content"]:
        asked.set()
        release.wait(60)
    if judge_answer["status"] != 200:
        return judge_answer["status"], {"error": "down"}
    return 200, reply(judge_answer["content"])


@pytest.fixture(scope="module")
def judge() -> Iterator[LoopbackServer]:
    with loopback_server(judging) as server:
        yield server


@pytest.fixture(scope="module")
def judged_server(settings: Settings, judge: LoopbackServer) -> Iterator[RunningServer]:
    memory = settings.memory.model_copy(
        update={"conflict_llm_base_url": judge.url, "conflict_llm_timeout_seconds": 5.0}
    )
    with run_server(settings.model_copy(update={"memory": memory})) as running:
        yield running


@pytest.fixture
async def judged(judged_server: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=judged_server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        yield http


async def write(http: httpx.AsyncClient, sid: str, text: str) -> dict[str, Any]:
    resp = await http.post(f"/v1/sessions/{sid}/memories", json={"text": text})
    assert resp.status_code == 201, resp.text
    written: dict[str, Any] = resp.json()
    return written


async def status_of(http: httpx.AsyncClient, sid: str, memory_id: str) -> str:
    resp = await http.get(f"/v1/sessions/{sid}/memories/{memory_id}")
    assert resp.status_code == 200, resp.text
    status: str = resp.json()["status"]
    return status


async def pair(http: httpx.AsyncClient, sid: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
    """A session with `old` remembered, then `new`: the id of `old` and the answer to `new`."""
    assert (await http.put(f"/v1/sessions/{sid}", json={})).status_code == 200
    first = await write(http, sid, old)
    return first["memory"]["memory_id"], await write(http, sid, new)


def judge_requests(judge: LoopbackServer, new: str) -> list[Any]:
    return [
        body
        for _, path, body in judge.requests
        if path == "/v1/chat/completions" and f"NEW: {new}" in body["messages"][1]["content"]
    ]


# --- which items the judge is asked about (pure) -------------------------------------------------


def test_the_rules_miss_the_pairs_the_judge_is_for() -> None:
    for old, new in ((VEGETARIAN, STEAK), (ZH_VEGETARIAN, ZH_STEAK)):
        assert not contradicts(old, new)
        assert rules_silent(old, new)
    # Same slot: the rules have answered, both ways.
    assert not rules_silent("I live in Paris.", "We moved to Lyon.")
    assert not rules_silent("I'm allergic to peanuts.", "I'm allergic to shellfish.")
    assert rules_silent("I live in Paris.", "I'm allergic to peanuts.")


def test_candidates_are_few_the_rules_silent_ones_sharing_most_words_first() -> None:
    olds = [
        "I live in Paris.",  # same slot as the new one: the rules answer
        "The meeting room is on floor 3.",
        "I'm vegetarian and never eat meat.",
        "My favourite colour is green.",
        "I drink tea every morning.",
    ]
    new = "I live in Lyon and eat meat now."
    assert judge_candidates(new, olds, 2) == [2, 4]
    assert judge_candidates(new, olds, 10) == [2, 4, 3, 1]
    assert judge_candidates("我现在吃肉了", ["我住在上海。", "我是素食者，不吃肉。"], 3) == [1, 0]


@pytest.mark.parametrize(
    ("content", "verdict"), [({"contradicts": True}, True), ({"contradicts": False}, False)]
)
def test_a_verdict_is_read(content: Any, verdict: bool) -> None:
    assert parse_reply(content) is verdict


@pytest.mark.parametrize(
    "content", [{"contradicts": "yes"}, {"verdict": True}, ["contradicts"], None, {}]
)
def test_a_malformed_verdict_is_refused(content: Any) -> None:
    with pytest.raises(ConflictJudgeUnavailable):
        parse_reply(content)


# --- through HTTP ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sid", "old", "new"),
    [("judge-yes-en", VEGETARIAN, STEAK), ("judge-yes-zh", ZH_VEGETARIAN, ZH_STEAK)],
)
async def test_a_contradiction_the_rules_miss_is_superseded_when_the_judge_says_so(
    judged: httpx.AsyncClient, judge: LoopbackServer, sid: str, old: str, new: str
) -> None:
    answer(content=json.dumps({"contradicts": True}))
    old_id, written = await pair(judged, sid, old, new)
    assert written["outcome"] == "superseded"
    assert written["memory"]["status"] == "active"
    assert await status_of(judged, sid, old_id) == "superseded"
    versions = (await judged.get(f"/v1/sessions/{sid}/memories/{old_id}/versions")).json()
    last = versions["versions"][-1]
    assert last["status"] == "superseded"
    assert "judged by the LLM" in last["reason"]
    assert written["memory"]["memory_id"] in last["reason"]
    [asked] = judge_requests(judge, new)
    assert asked["response_format"] == {"type": "json_object"}
    system, user = asked["messages"]
    assert '{"contradicts": true}' in system["content"] and "素食" in system["content"]
    assert user["content"].startswith(f"OLD: {old}\nNEW: {new}")


async def test_the_judge_saying_no_keeps_both(
    judged: httpx.AsyncClient, judge: LoopbackServer
) -> None:
    answer(content=json.dumps({"contradicts": False}))
    old_id, written = await pair(judged, "judge-no", ZH_VEGETARIAN, "我喜欢吃豆腐。")
    assert (written["outcome"], written["memory"]["status"]) == ("stored", "active")
    assert await status_of(judged, "judge-no", old_id) == "active"
    assert len(judge_requests(judge, "我喜欢吃豆腐。")) == 1


@pytest.mark.parametrize(
    ("sid", "status", "content"),
    [
        ("judge-500", 500, ""),
        ("judge-garbage", 200, "sure, they clash"),
        ("judge-wrong-json", 200, json.dumps({"contradicts": "maybe"})),
    ],
)
async def test_a_failing_judge_changes_nothing_and_never_fails_the_write(
    judged: httpx.AsyncClient, judge: LoopbackServer, sid: str, status: int, content: str
) -> None:
    answer(status, content)
    new = f"{STEAK} ({sid})"
    old_id, written = await pair(judged, sid, VEGETARIAN, new)
    assert written["outcome"] == "stored"
    assert written["memory"]["status"] == "active"
    assert await status_of(judged, sid, old_id) == "active"
    assert len(judge_requests(judge, new)) == 1


async def test_the_judge_is_asked_before_the_write_locks_the_session(
    judged: httpx.AsyncClient, judge: LoopbackServer
) -> None:
    """An append to the session goes through while the judge is still thinking: the write
    takes the session's lock only after the judge answered (a judge may take its whole
    timeout, 5 s here)."""
    answer(content=json.dumps({"contradicts": True}))
    assert (await judged.put("/v1/sessions/judge-held", json={})).status_code == 200
    old_id = (await write(judged, "judge-held", VEGETARIAN))["memory"]["memory_id"]
    writing = asyncio.create_task(write(judged, "judge-held", HELD_NEW))
    try:
        assert await asyncio.to_thread(asked.wait, 30)
        turns = [{"role": "user", "content": "Also, book me a table for two."}]
        appending = asyncio.create_task(
            judged.post("/v1/sessions/judge-held/turns", json={"turns": turns})
        )
        done, _ = await asyncio.wait({writing, appending}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {appending}  # the write still waits for its judge
        assert appending.result().status_code == 201, appending.result().text
    finally:
        release.set()
    written = await writing
    assert written["outcome"] == "superseded"
    assert await status_of(judged, "judge-held", old_id) == "superseded"


async def test_the_rules_answer_first_and_the_judge_is_not_asked(
    judged: httpx.AsyncClient, judge: LoopbackServer
) -> None:
    answer(content=json.dumps({"contradicts": False}))  # would keep both, were it asked
    old_id, written = await pair(judged, "judge-rules", "我住在巴黎。", "我们搬到了里昂。")
    assert written["outcome"] == "superseded"
    assert await status_of(judged, "judge-rules", old_id) == "superseded"
    assert judge_requests(judge, "我们搬到了里昂。") == []


async def test_without_a_judge_the_rules_alone_decide(client: httpx.AsyncClient) -> None:
    old_id, written = await pair(client, "judge-unset", VEGETARIAN, STEAK)
    assert written["memory"]["status"] == "active"
    assert await status_of(client, "judge-unset", old_id) == "active"
