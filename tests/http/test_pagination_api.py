"""Every list endpoint pages by `limit` (at most CONTEXTD_LIMITS__MAX_PAGE_SIZE) and an opaque
cursor: turns, chunks and remembered items."""

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.http.pagination import encode_cursor
from tests.notes.test_notes_service import TINY_FLOOR, offload_all
from tests.support.factories import session_of_key
from tests.support.server import RunningServer, run_server

PAGE = 3


@pytest.fixture(scope="module")
def small_pages(settings: Settings) -> Iterator[RunningServer]:
    limits = settings.limits.model_copy(update={"max_page_size": PAGE})
    with run_server(settings.model_copy(update={"limits": limits})) as running:
        yield running


@pytest.fixture
async def http(small_pages: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=small_pages.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    ) as client:
        yield client


async def all_pages(http: httpx.AsyncClient, path: str, key: str) -> list[list[dict[str, Any]]]:
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 100}
        if cursor:
            params["cursor"] = cursor
        resp = await http.get(path, params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        pages.append(body[key])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


async def test_turns_and_memories_page_at_the_configured_size(http: httpx.AsyncClient) -> None:
    sid = "paged"
    await http.put(f"/v1/sessions/{sid}", json={**TINY_FLOOR, "user_id": "u-paged"})
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i} about topic {i}."}
        for i in range(8)
    ]
    assert (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201

    pages = await all_pages(http, f"/v1/sessions/{sid}/turns", "turns")
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [t["seq"] for p in pages for t in p] == list(range(1, 9))

    for i in range(7):
        resp = await http.post(
            f"/v1/sessions/{sid}/memory",
            json={"type": "remember", "text": f"Preference number {i}: colour {i * 37}"},
        )
        assert resp.status_code == 200, resp.text
    pages = await all_pages(http, f"/v1/sessions/{sid}/memories", "memories")
    assert [len(p) for p in pages] == [3, 3, 1]
    texts = [m["text"] for p in pages for m in p]
    assert texts == [f"Preference number {i}: colour {i * 37}" for i in range(7)]


async def test_chunks_page_at_the_configured_size(
    http: httpx.AsyncClient, engine: AsyncEngine, settings: Settings, cache: Cache, admin_key: str
) -> None:
    sid = "paged-chunks"
    await http.put(f"/v1/sessions/{sid}", json=TINY_FLOOR)
    turns = [
        {"role": "user", "content": f"Completely separate subject number {i}: " + "word " * 60}
        for i in range(10)
    ]
    assert (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201
    await offload_all(engine, settings, cache, await session_of_key(engine, admin_key, sid))
    count = (await http.get(f"/v1/sessions/{sid}")).json()["counts"]["chunks"]
    assert count > PAGE
    pages = await all_pages(http, f"/v1/sessions/{sid}/chunks", "chunks")
    assert all(len(p) == PAGE for p in pages[:-1]) and 1 <= len(pages[-1]) <= PAGE
    assert sum(len(p) for p in pages) == count


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/sessions/paged/turns", {"cursor": encode_cursor(2**63)}),
        ("/v1/sessions/paged/turns", {"since_seq": 2**63}),
        ("/v1/sessions/paged/chunks", {"cursor": "not-a-cursor"}),
        ("/v1/sessions/paged/memories", {"cursor": encode_cursor(10**30, 1)}),
        ("/v1/sessions/paged/turns", {"limit": 0}),
    ],
)
async def test_bad_page_parameters_are_a_422_naming_the_field(
    http: httpx.AsyncClient, path: str, params: dict[str, Any]
) -> None:
    await http.post("/v1/sessions/paged/turns", json={"turns": [{"role": "user", "content": "x"}]})
    resp = await http.get(path, params=params)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["field"] == next(iter(params))
