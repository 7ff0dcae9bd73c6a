"""Confident or silent, over HTTP: a question nothing stored answers gets no confident match
from the memory tool (`no_match: nothing_relevant`, the nearest item marked low confidence), and
build-prompt's manifest gives each recalled item's relevance and the floor; a question the
history answers is quoted as before, with its relevance. English and
Chinese, over the scripted travel conversation of the no-history set."""

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from tests.support.server import RunningServer, run_server
from tests.support.sessions_http import offloaded_session

SET = Path(__file__).resolve().parent / "no_history_set.json"
SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 500,
    "min_recent_turns": 4,
    "min_recent_tokens": 200,
}
# Each shares a word with the conversation ("list" of its packing list, 多少; "four" and
# "season" of "cherry blossom season … four days"), so recall has a nearest item to mark low
# confidence (these servers search without vectors). A name is held only as written.
NO_ANSWER = (
    "How do I reverse a linked list in Python?",
    "一根香蕉有多少卡路里？",
    "Which composer wrote The Four Seasons?",
)
ANSWERED = (
    ("Which hotel did we pick in Kyoto?", "Sotetsu Fresa"),
    ("从京都到奈良坐什么车？", "近铁特急"),
)


FLOOR = 0.25


@pytest.fixture(scope="module")
def floor_server(settings: Settings) -> Iterator[RunningServer]:
    """The API with the relevance floor at `FLOOR` (its default, said here)."""
    own = settings.model_copy(
        update={"recall": settings.recall.model_copy(update={"relevance_floor": FLOOR})}
    )
    with run_server(own) as server:
        yield server


@pytest.fixture
async def admin(floor_server: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=floor_server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    ) as http:
        yield http


async def travel_session(http: httpx.AsyncClient, sid: str) -> None:
    """The set's travel conversation, offloaded down to the window's floors."""
    turns = json.loads(SET.read_text(encoding="utf-8"))["conversation"]
    moved = await offloaded_session(http, sid, SMALL, turns)
    assert moved["turns_moved"] >= len(turns) - 8


async def recall(http: httpx.AsyncClient, sid: str, query: str) -> dict[str, Any]:
    body = {"type": "recall", "query": query, "top_k": 3}
    resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


async def test_no_confident_match_names_its_case_and_the_nearest_item(admin: httpx.AsyncClient):
    sid = "floor-tool"
    await travel_session(admin, sid)
    for query in NO_ANSWER:
        answer = await recall(admin, sid, query)
        data = answer["data"]
        assert data["matches"] == [], (query, data["matches"])
        assert data["no_match"] == "nothing_relevant", query
        nearest = data["nearest"]
        assert nearest["confidence"] == "low"
        assert data["floor"] == FLOOR
        assert 0 <= nearest["relevance"] < data["floor"]
        assert nearest["text"]
        assert answer["text"].startswith("No match: nothing stored in this conversation's")
        assert "is a confident match for" in answer["text"]
        assert "low confidence" in answer["text"]
    for query, fact in ANSWERED:
        data = (await recall(admin, sid, query))["data"]
        assert "no_match" not in data and "nearest" not in data, query
        assert any(fact in m["text"] for m in data["matches"]), (query, data["matches"])
        assert max(m["relevance"] for m in data["matches"]) >= data["floor"]


async def test_build_prompt_gives_each_recalled_item_its_relevance_and_the_floor(
    admin: httpx.AsyncClient,
):
    """Build-prompt keeps its recalled block (leaving it out below the floor cost LoCoMo
    evidence recall, docs/BENCHMARKS.md), and its manifest says how relevant each item is."""
    sid = "floor-build"
    await travel_session(admin, sid)
    for query in NO_ANSWER:
        resp = await admin.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query})
        assert resp.status_code == 200, resp.text
        recalled = [m for m in resp.json()["manifest"] if m["layer"] == "c3"]
        assert recalled, query
        assert all(0 <= m["relevance"] < m["floor"] for m in recalled), recalled
    for query, fact in ANSWERED:
        resp = await admin.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query})
        built = resp.json()
        included = [m for m in built["manifest"] if m["layer"] == "c3" and m["included"]]
        assert included and all(m["floor"] is not None for m in included)
        assert max(m["relevance"] for m in included) >= included[0]["floor"]
        assert any(fact in msg["content"] for msg in built["messages"]), query


async def test_a_remembered_item_is_not_held_to_the_floor(admin: httpx.AsyncClient):
    """An item the agent chose to remember is quoted when it matches the question, however
    little of a long question it holds: a session of remembered items has no chunks to weigh
    the question's words by (MADial-Bench's recalls, with the dialogue so far as the query)."""
    sid = "floor-remembered"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    body = {"type": "remember", "text": "I always order the matcha latte at the corner cafe."}
    resp = await admin.post(f"/v1/sessions/{sid}/memory", json=body)
    assert resp.status_code == 200, resp.text
    question = "Which latte would suit my grandmother's ninetieth birthday surprise party tonight?"
    data = (await recall(admin, sid, question))["data"]
    assert [m["text"] for m in data["matches"]] == [body["text"]]
    assert data["matches"][0]["relevance"] < data["floor"]
