"""The second retrieval hop through build-prompt: a turn that shares no word with the question
but a distinctive name with the first hit is recalled; with `recall.second_hop` off it is not."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from tests.support.server import RunningServer, run_server

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
FIRST = "Caroline joined the Zephyrine choir down at the harbour."
SECOND = "The Zephyrine rehearsal ran late, the conductor gave her a solo."
QUESTION = "What did Caroline join at the harbour?"


def filler(i: int) -> dict[str, str]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"turn {i}: the ferry timetable for the island trip, option {i}.",
    }


async def offloaded_session(url: str, key: str, sid: str) -> list[dict[str, Any]]:
    turns = [filler(i) for i in range(60)]
    turns[7] = {"role": "user", "content": FIRST}
    turns[30] = {"role": "assistant", "content": SECOND}
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:
        assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
        posted = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
        assert posted.status_code == 201
        offload = {"type": "offload", "until_tokens": 1}
        assert (await http.post(f"/v1/sessions/{sid}/memory", json=offload)).status_code == 200
        chunks = (await http.get(f"/v1/sessions/{sid}/chunks")).json()["chunks"]
    return [c for c in chunks if c["status"] == "active"]


async def recalled_turns(url: str, key: str, sid: str) -> set[int]:
    """The turns the recalled items of one build cover."""
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:
        resp = await http.post(
            f"/v1/sessions/{sid}/build-prompt",
            json={"query": QUESTION, "recall": {"mode": "always"}},
        )
    assert resp.status_code == 200, resp.text
    ranges = [i["turn_range"] for i in resp.json()["recall"]["items"] if i["turn_range"]]
    return {seq for first, last in ranges for seq in range(first, last + 1)}


@pytest.fixture
async def session_id(server: RunningServer, admin_key: str) -> AsyncIterator[str]:
    sid = "second-hop"
    chunks = await offloaded_session(server.url, admin_key, sid)
    holding = [c for c in chunks if c["turn_first"] <= 8 <= c["turn_last"]]
    later = [c for c in chunks if c["turn_first"] <= 31 <= c["turn_last"]]
    assert holding and later and holding != later  # the two turns sit in different chunks
    yield sid


async def test_the_second_hop_recalls_what_the_first_hit_names(
    server: RunningServer, admin_key: str, session_id: str
) -> None:
    turns = await recalled_turns(server.url, admin_key, session_id)
    assert 8 in turns
    assert 31 in turns  # found through "Zephyrine", a word of the first hit, not of the query


async def test_without_the_second_hop_only_the_first_hit_comes_back(
    shared_settings: Settings, admin_key: str, session_id: str
) -> None:
    off = shared_settings.model_copy(
        update={"recall": shared_settings.recall.model_copy(update={"second_hop": False})}
    )
    with run_server(off) as running:
        turns = await recalled_turns(running.url, admin_key, session_id)
    assert 8 in turns
    assert 31 not in turns
