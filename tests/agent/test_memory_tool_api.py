"""The memory tool end to end against the real API and a real worker."""

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.domain.text import term_set
from tests.conftest import new_key
from tests.support.server import RunningServer, run_server
from tests.support.traces import all_text, redis_hits
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}


@pytest.fixture(scope="module")
def module_settings(settings: Settings) -> Settings:
    """This module's own Redis key prefix: its checks scan keys, and must see only its own."""
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    return settings.model_copy(
        update={"cache": settings.cache.model_copy(update={"key_prefix": prefix})}
    )


@pytest.fixture(scope="module")
def worker_server(module_settings: Settings) -> Iterator[RunningServer]:
    with run_server(module_settings, with_worker=True) as running:
        yield running


@pytest.fixture(scope="module")
async def cache(module_settings: Settings) -> AsyncIterator[Cache]:
    """The cache as this module's server sees it (same key prefix)."""
    own = Cache(module_settings.redis_url, module_settings.cache)
    yield own
    await own.aclose()


def http(server: RunningServer, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.fixture
async def agent(worker_server: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with http(worker_server, api_key) as client:
        yield client


@pytest.fixture
async def admin(worker_server: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with http(worker_server, admin_key) as client:
        yield client


class FunctionCallingClient:
    """What an agent framework does with a tool definition: register it, then send the model's
    arguments after checking them against the declared JSON schema."""

    def __init__(self, client: httpx.AsyncClient, definition: dict[str, Any], session: str):
        assert definition["type"] == "function"
        self.function = definition["function"]
        assert self.function["name"] == "memory"
        self.schema = self.function["parameters"]
        self.client, self.session = client, session

    @property
    def types(self) -> list[str]:
        return list(self.schema["properties"]["type"]["enum"])

    def _check(self, arguments: dict[str, Any]) -> None:
        kinds = {"string": str, "integer": int, "array": list, "object": dict}
        for name in self.schema["required"]:
            assert name in arguments, name
        for name, value in arguments.items():
            spec = self.schema["properties"][name]  # additionalProperties is false
            assert isinstance(value, kinds[spec["type"]]), (name, value)
            if "enum" in spec:
                assert value in spec["enum"], (name, value)

    async def call(self, **arguments: Any) -> dict[str, Any]:
        self._check(arguments)
        # The model's arguments arrive as a JSON string in the tool call.
        raw = json.dumps(arguments)
        resp = await self.client.post(
            f"/v1/sessions/{self.session}/memory",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["type"] == arguments["type"] and answer["text"]
        return answer


def filler(i: int) -> dict[str, str]:
    role = "user" if i % 2 == 0 else "assistant"
    return {
        "role": role,
        "content": f"turn {i}: we compare trains, hotels and flights for the "
        f"trip, option {i} looks fine but let us keep looking at alternatives. " * 5,
    }


async def offloaded_session(admin: httpx.AsyncClient, sid: str, planted: str) -> list[dict]:
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    turns = [filler(i) for i in range(30)]
    turns[3] = {"role": "user", "content": planted}
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201
    resp = await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
    assert resp.status_code == 200, resp.text
    assert (
        resp.json()["data"]["turns_moved"] > 0
        or (await admin.get(f"/v1/sessions/{sid}")).json()["counts"]["chunks"] > 0
    )
    return (await admin.get(f"/v1/sessions/{sid}/chunks")).json()["chunks"]


async def test_scripted_agent_loop_through_the_tool_definition(
    agent: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    sid = "loop"
    definition = (await agent.get("/v1/memory/tool", params={"format": "openai"})).json()
    tool = FunctionCallingClient(agent, definition, sid)
    assert tool.types == ["help", "recall", "remember", "status", "verify"]  # none privileged
    desc = tool.function["description"]
    assert "Use:" in desc and "Do not use:" in desc and "No match" in desc
    anthropic = (await agent.get("/v1/memory/tool", params={"format": "anthropic"})).json()
    assert anthropic["name"] == "memory" and anthropic["input_schema"] == tool.schema
    admin_def = (await admin.get("/v1/memory/tool")).json()
    assert admin_def["function"]["parameters"]["properties"]["type"]["enum"][-2:] == [
        "offload",
        "forget",
    ]

    await offloaded_session(
        admin, sid, "The budget for the Lyon trip is at most 120 EUR, ticket LY-40917."
    )
    helped = await tool.call(type="help")
    assert (
        "recall" in helped["text"]
        and "Not available to this key: offload, forget" in (helped["text"])
    )
    assert helped["data"]["allowed_types"] == tool.types

    stored = await tool.call(
        type="remember", text="User wants invoices by email only", tags=["constraint"]
    )
    assert stored["data"]["outcome"] == "stored"

    found = await tool.call(type="recall", query="what budget did we set for Lyon?")
    matches = found["data"]["matches"]
    assert matches and "120 EUR" in matches[0]["text"] and matches[0]["chunk_id"]
    first = matches[0]
    assert (
        f"| turn {first['turn_first']}-{first['turn_last']} | {first['chunk_id'][:8]}]"
        in (found["text"])
    )
    config = (await agent.get(f"/v1/sessions/{sid}")).json()
    assert sum(m["tokens"] for m in matches) <= config["recall_budget_tokens"]
    by_id = await tool.call(type="recall", query="LY-40917", top_k=1)
    assert len(by_id["data"]["matches"]) == 1 and "LY-40917" in by_id["text"]

    remembered = await tool.call(type="recall", query="how should invoices be sent")
    assert remembered["data"]["matches"][0]["memory_id"] == stored["data"]["memory_id"]

    nothing = await tool.call(type="recall", query="zebra quantum saxophone")
    assert nothing["data"]["matches"] == [] and nothing["text"].startswith("No match")
    assert nothing["data"]["no_match"] == "nothing_relevant"

    status = await tool.call(type="status")
    data = status["data"]
    assert data["counts"]["chunks"] > 0 and data["counts"]["remembered"] == 1
    assert data["watermark"]["level"] in ("normal", "offload", "emergency")
    assert set(data["usage"]) >= {"c0", "c1", "c2", "total", "limit"}
    assert {"version", "stale"} <= set(data["notes"]) and "pending_jobs" in data
    assert data["last_offload_at"] is not None

    # The remembered item reaches the notes (a notes refresh job was enqueued).
    pad = await wait_for(
        lambda: agent.get(f"/v1/sessions/{sid}/scratchpad"),
        lambda r: any("invoices by email" in i["text"] for i in r.json()["notes"]["remembered"]),
        what="the remembered item in the notes",
    )
    assert pad.status_code == 200


async def test_forget_hides_at_once_and_the_erase_job_leaves_no_copy(
    admin: httpx.AsyncClient, agent: httpx.AsyncClient, engine: AsyncEngine, cache: Cache
) -> None:
    sid, marker = "forget", f"zq{uuid.uuid4().hex[:10]}"
    await offloaded_session(admin, sid, f"My locker code is {marker}, keep it secret. 9 9 9")
    found = (
        await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": marker})
    ).json()
    chunk_id = found["data"]["matches"][0]["chunk_id"]
    await admin.post(f"/v1/sessions/{sid}/build-prompt", json={"query": f"code {marker}?"})
    await cache.set_json(cache.key("probe", sid), {"copy": f"locker {marker}"})  # a cached copy
    assert await all_text(engine, marker)

    # Without the scope: 403 and nothing tombstoned.
    refused = await agent.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "chunk_id": chunk_id}
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert "memory:forget" in refused.json()["error"]["message"]
    assert refused.json()["error"]["field"] == "type"
    chunk = (await agent.get(f"/v1/sessions/{sid}/chunks/{chunk_id}")).json()
    assert chunk["status"] == "active"

    chunks_before = (await agent.get(f"/v1/sessions/{sid}")).json()["counts"]["chunks"]
    forgot = await admin.post(
        f"/v1/sessions/{sid}/memory",
        json={"type": "forget", "chunk_id": chunk_id[:8]},  # the short id prompts show
    )
    assert forgot.status_code == 200, forgot.text
    receipt_id = forgot.json()["data"]["erase_receipt_id"]
    # Immediately: recall finds nothing, the turns are gone from the list, counts moved.
    again = (
        await agent.post(f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": marker})
    ).json()
    assert again["data"]["matches"] == [] and again["text"].startswith("No match")
    turns = (await agent.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()["turns"]
    assert not any(marker in t["content"] for t in turns)
    view = (await agent.get(f"/v1/sessions/{sid}")).json()
    assert view["counts"]["chunks"] <= chunks_before

    receipt = await wait_for(
        lambda: agent.get(f"/v1/erase-receipts/{receipt_id}"),
        lambda r: r.json().get("status") == "completed",
        what="the erase job",
    )
    stores = receipt.json()["stores"]
    assert {"turns", "chunks", "embeddings", "lexical", "notes", "redis", "prompt_builds"} <= set(
        stores
    )
    assert stores["chunks"]["erased"] >= 1 and receipt.json()["attempts"] >= 1
    assert await all_text(engine, marker) == []
    assert await redis_hits(cache, marker) == []
    # Turns not forgotten stay covered by an active chunk (the partly covered chunk re-chunked).
    turns = (await agent.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()["turns"]
    live_chunks = {
        c["chunk_id"]
        for c in (await agent.get(f"/v1/sessions/{sid}/chunks")).json()["chunks"]
        if c["status"] == "active"
    }
    assert all(t["chunk_id"] is None or t["chunk_id"] in live_chunks for t in turns)


async def test_forget_turn_range_and_memory(admin: httpx.AsyncClient) -> None:
    sid = "forget-range"
    await offloaded_session(admin, sid, "Planted: the meeting room is Saturn-7.")
    resp = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [3, 5]}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["forgotten_turns"] == [3, 4, 5]
    turns = (await admin.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()["turns"]
    assert [t["seq"] for t in turns][:3] == [1, 2, 6]
    recall = (
        await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": "Saturn-7"})
    ).json()
    assert recall["data"]["matches"] == []
    mem = (
        await admin.post(
            f"/v1/sessions/{sid}/memory", json={"type": "remember", "text": "Call me Captain"}
        )
    ).json()
    gone = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "memory_id": mem["data"]["memory_id"]}
    )
    assert gone.status_code == 200
    listed = (await admin.get(f"/v1/sessions/{sid}/memories")).json()["memories"]
    assert listed == []


async def test_remember_dedup_supersede_and_user_scope(
    worker_server: RunningServer, agent: httpx.AsyncClient, engine: AsyncEngine, api_key: str
) -> None:
    async def remember(client: httpx.AsyncClient, sid: str, **body: Any) -> httpx.Response:
        return await client.post(f"/v1/sessions/{sid}/memory", json={"type": "remember", **body})

    await agent.put("/v1/sessions/s1", json={"user_id": "alice"})
    first = (await remember(agent, "s1", text="Prefers window seats on trains")).json()["data"]
    dup = (await remember(agent, "s1", text="prefers WINDOW seats on trains.")).json()["data"]
    assert dup["outcome"] == "duplicate" and dup["memory_id"] == first["memory_id"]
    zh = (await remember(agent, "s1", text="发票只要电子版，不要纸质版")).json()["data"]
    zh_dup = (await remember(agent, "s1", text="发票只要电子版,不要纸质版。")).json()["data"]
    assert zh_dup["memory_id"] == zh["memory_id"]

    v1 = (await remember(agent, "s1", text="Budget 120 EUR", key="budget")).json()["data"]
    v2 = (await remember(agent, "s1", text="Budget 150 EUR", key="budget")).json()["data"]
    assert v2["outcome"] == "superseded" and v2["supersedes"] == v1["memory_id"]
    assert v2["version"] == 2
    live = (await agent.get("/v1/sessions/s1/memories")).json()["memories"]
    assert [m["text"] for m in live if m["key"] == "budget"] == ["Budget 150 EUR"]
    history = (
        await agent.get("/v1/sessions/s1/memories", params={"include_superseded": "true"})
    ).json()["memories"]
    assert {m["status"] for m in history if m["key"] == "budget"} == {"active", "superseded"}
    recall = (
        await agent.post("/v1/sessions/s1/memory", json={"type": "recall", "query": "budget EUR"})
    ).json()
    assert "150 EUR" in recall["text"] and "120 EUR" not in recall["text"]
    # Remembered items are matched by stem, like chunks ("preferring" finds "Prefers").
    stemmed = (
        await agent.post(
            "/v1/sessions/s1/memory", json={"type": "recall", "query": "preferring which seat"}
        )
    ).json()
    assert [m["memory_id"] for m in stemmed["data"]["matches"]] == [first["memory_id"]]
    await wait_for(
        lambda: agent.get("/v1/sessions/s1/scratchpad"),
        lambda r: (
            [i["text"] for i in r.json()["notes"]["remembered"] if "Budget" in i["text"]]
            == ["Budget 150 EUR"]
        ),
        what="the superseding value in the notes",
    )

    no_user = await remember(agent, "s-anon", text="x y z", scope="user")
    assert no_user.status_code in (404, 422)  # unknown session, or one without user_id
    await agent.put("/v1/sessions/s-anon", json={})
    no_user = await remember(agent, "s-anon", text="x y z", scope="user")
    assert no_user.status_code == 422 and no_user.json()["error"]["field"] == "scope"

    shared = (await remember(agent, "s1", text="Speaks French", scope="user")).json()["data"]
    await agent.put("/v1/sessions/s2", json={"user_id": "alice"})
    await agent.put("/v1/sessions/s3", json={"user_id": "bob"})
    seen = lambda sid: agent.get(f"/v1/sessions/{sid}/memories")  # noqa: E731
    assert shared["memory_id"] in [m["memory_id"] for m in (await seen("s2")).json()["memories"]]
    assert (await seen("s3")).json()["memories"] == []
    recall2 = (
        await agent.post("/v1/sessions/s2/memory", json={"type": "recall", "query": "French"})
    ).json()
    assert recall2["data"]["matches"][0]["memory_id"] == shared["memory_id"]
    other_tenant = await new_key(
        engine, f"t-{uuid.uuid4().hex[:8]}", ["sessions:read", "sessions:write"]
    )
    async with http(worker_server, other_tenant) as stranger:
        await stranger.put("/v1/sessions/s2", json={"user_id": "alice"})
        assert (await stranger.get("/v1/sessions/s2/memories")).json()["memories"] == []
        assert (await stranger.get(f"/v1/erase-receipts/{uuid.uuid4()}")).status_code == 404


async def test_bad_calls_get_4xx_and_write_nothing(
    agent: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    sid = "bad"
    await agent.post(f"/v1/sessions/{sid}/turns", json={"turns": [filler(1)]})

    async def call(body: dict) -> httpx.Response:
        return await agent.post(f"/v1/sessions/{sid}/memory", json=body)

    for body, status, code, field in [
        ({"type": "teleport"}, 422, "invalid_value", "type"),
        ({"type": "recall"}, 422, "missing_field", "query"),
        ({"type": "remember"}, 422, "missing_field", "text"),
        ({"type": "remember", "text": "x" * 5000}, 422, "too_long", "text"),
        ({"type": "recall", "query": "a", "top_k": "many"}, 422, "wrong_type", "top_k"),
        ({"type": "offload"}, 403, "forbidden", "type"),
        ({"type": "forget", "turn_range": [1, 1]}, 403, "forbidden", "type"),
    ]:
        resp = await call(body)
        assert resp.status_code == status, (body, resp.text)
        assert resp.json()["error"]["code"] == code and resp.json()["error"]["field"] == field
    assert (await agent.get(f"/v1/sessions/{sid}/memories")).json()["memories"] == []
    turns = (await agent.get(f"/v1/sessions/{sid}/turns")).json()["turns"]
    assert len(turns) == 1 and turns[0]["chunk_id"] is None

    limit = 20
    for i in range(limit):
        resp = await call({"type": "remember", "text": f"distinct fact number {i} about {i * 7}"})
        assert resp.status_code == 200, resp.text
    over = await call({"type": "remember", "text": "one fact too many"})
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
    memories = (await agent.get(f"/v1/sessions/{sid}/memories")).json()["memories"]
    assert len(memories) == limit and "one fact too many" not in {m["text"] for m in memories}


async def test_tenant_isolation_of_chunk_and_memory_ids(
    admin: httpx.AsyncClient, worker_server: RunningServer, engine: AsyncEngine
) -> None:
    chunks = await offloaded_session(admin, "iso", "Planted fact for isolation: code 4711.")
    mem = (
        await admin.post(
            "/v1/sessions/iso/memory", json={"type": "remember", "text": "isolated point"}
        )
    ).json()
    outsider = await new_key(
        engine, f"t-{uuid.uuid4().hex[:8]}", ["sessions:read", "sessions:write", "memory:forget"]
    )
    async with http(worker_server, outsider) as other:
        await other.post("/v1/sessions/iso/turns", json={"turns": [filler(0)]})
        for body in (
            {"type": "forget", "chunk_id": chunks[0]["chunk_id"]},
            {"type": "forget", "memory_id": mem["data"]["memory_id"]},
            {"type": "forget", "chunk_id": "not-a-uuid"},
        ):
            resp = await other.post("/v1/sessions/iso/memory", json=body)
            assert resp.status_code == 404, resp.text
    assert (await admin.get(f"/v1/sessions/iso/chunks/{chunks[0]['chunk_id']}")).json()[
        "status"
    ] == "active"


async def test_delete_session_tombstones_then_erases(
    admin: httpx.AsyncClient, engine: AsyncEngine, cache: Cache
) -> None:
    sid, marker = "gone", f"zd{uuid.uuid4().hex[:10]}"
    await offloaded_session(admin, sid, f"Secret number {marker} for the vault.")
    await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "remember", "text": f"vault hint {marker}"}
    )
    await admin.get(f"/v1/sessions/{sid}")  # cached view
    resp = await admin.delete(f"/v1/sessions/{sid}")
    assert resp.status_code == 202
    receipt_id = resp.json()["erase_receipt_id"]
    assert resp.headers["Location"] == f"/v1/erase-receipts/{receipt_id}"
    assert (await admin.get(f"/v1/sessions/{sid}")).status_code == 404
    receipt = await wait_for(
        lambda: admin.get(f"/v1/erase-receipts/{receipt_id}"),
        lambda r: r.json().get("status") == "completed",
        what="the session erase",
    )
    body = receipt.json()
    assert body["session_id"] == sid and body["target"]["kind"] == "session"
    assert {"session", "turns", "chunks", "memories", "redis"} <= set(body["stores"])
    assert await all_text(engine, marker) == []
    assert await redis_hits(cache, marker) == []


async def remembered_in_notes(admin: httpx.AsyncClient, sid: str) -> list[str]:
    pad = (await admin.get(f"/v1/sessions/{sid}/scratchpad")).json()
    return [item["text"] for item in pad["notes"]["remembered"]]


async def test_deleting_a_session_takes_its_user_items_out_of_the_users_other_notes(
    admin: httpx.AsyncClient, engine: AsyncEngine, cache: Cache
) -> None:
    """A user-scope item is quoted in the notes of the user's other sessions (their `remembered`
    section): deleting the session that wrote it takes it out of them at once, and the erase job
    out of any other notes still quoting it (here a session since moved to another user)."""
    marker, user = f"zu{uuid.uuid4().hex[:10]}", f"user-{uuid.uuid4().hex[:6]}"
    origin, other, moved = (f"{name}-{user}" for name in ("origin", "other", "moved"))
    for sid in (origin, other, moved):
        assert (await admin.put(f"/v1/sessions/{sid}", json={"user_id": user})).status_code == 200
    item = f"My locker code is {marker}."
    remembered = await admin.post(
        f"/v1/sessions/{origin}/memory", json={"type": "remember", "text": item, "scope": "user"}
    )
    assert remembered.status_code == 200, remembered.text
    for sid in (other, moved):
        turn = {"role": "user", "content": "Plan the Oslo trip in May."}
        assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": [turn]})).is_success
        assert (await admin.post(f"/v1/sessions/{sid}/scratchpad/rebuild")).status_code == 202
        await wait_for(
            lambda sid=sid: remembered_in_notes(admin, sid),
            lambda texts: item in texts,
            what=f"the notes of {sid} to quote the item",
        )
    assert (await admin.put(f"/v1/sessions/{moved}", json={"user_id": "someone-else"})).is_success
    query = {"query": "Where is my locker?"}
    before = await admin.post(f"/v1/sessions/{other}/build-prompt", json=query)
    assert marker in json.dumps(before.json()["messages"])  # and the notes are cached

    resp = await admin.delete(f"/v1/sessions/{origin}")
    assert resp.status_code == 202
    # At once: the user's other session neither keeps nor shows it.
    assert item not in await remembered_in_notes(admin, other)
    after = await admin.post(f"/v1/sessions/{other}/build-prompt", json=query)
    assert marker not in json.dumps(after.json()["messages"])
    receipt = await wait_for(
        lambda: admin.get(f"/v1/erase-receipts/{resp.json()['erase_receipt_id']}"),
        lambda r: r.json().get("status") == "completed",
        what="the session erase",
    )
    assert receipt.json()["stores"]["other_notes"]["sessions_updated"] >= 1
    assert item not in await remembered_in_notes(admin, moved)
    assert await all_text(engine, marker) == []
    assert await redis_hits(cache, marker) == []


async def test_deleting_a_user_erases_their_sessions_and_items_held_elsewhere(
    admin: httpx.AsyncClient, engine: AsyncEngine, cache: Cache
) -> None:
    """`DELETE /v1/users/{id}`: the user's sessions go as a session delete takes one, and an item
    remembered for them in a session since given another user is forgotten there; the other
    user's own item and session stay."""
    marker, kept = f"zv{uuid.uuid4().hex[:10]}", f"zk{uuid.uuid4().hex[:10]}"
    user, other_user = f"dora-{uuid.uuid4().hex[:6]}", f"eli-{uuid.uuid4().hex[:6]}"
    chat, passed_on = f"chat-{user}", f"passed-{user}"
    await offloaded_session(admin, chat, f"My bank PIN hint is {marker}.")
    for sid in (chat, passed_on):
        assert (await admin.put(f"/v1/sessions/{sid}", json={"user_id": user})).status_code == 200
    remember = {"type": "remember", "text": f"Locker {marker}", "scope": "user"}
    assert (await admin.post(f"/v1/sessions/{passed_on}/memory", json=remember)).is_success
    assert (await admin.put(f"/v1/sessions/{passed_on}", json={"user_id": other_user})).is_success
    own = {"type": "remember", "text": f"Gym locker {kept}", "scope": "user"}
    assert (await admin.post(f"/v1/sessions/{passed_on}/memory", json=own)).is_success

    resp = await admin.delete(f"/v1/users/{user}")
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert [s["session_id"] for s in body["sessions"]] == [chat]
    assert [m["session_id"] for m in body["memories"]] == [passed_on]
    assert body["remaining_sessions"] == 0
    assert (await admin.get(f"/v1/sessions/{chat}")).status_code == 404
    items = (await admin.get(f"/v1/sessions/{passed_on}/memories")).json()["memories"]
    assert [m["text"] for m in items] == [f"Gym locker {kept}"]
    for receipt_id in {r["erase_receipt_id"] for r in [*body["sessions"], *body["memories"]]}:
        await wait_for(
            lambda receipt_id=receipt_id: admin.get(f"/v1/erase-receipts/{receipt_id}"),
            lambda r: r.json().get("status") == "completed",
            what="the user's erase jobs",
        )
    assert await all_text(engine, marker) == []
    assert await redis_hits(cache, marker) == []
    assert "memories.text" in await all_text(engine, kept)
    assert (await admin.delete(f"/v1/users/{user}")).status_code == 404


async def test_recall_leaves_out_what_a_match_already_says(admin: httpx.AsyncClient) -> None:
    """Repetitive small talk offloaded as several chunks comes back once, not once per chunk."""
    sid = "small-talk"
    asks = ["Haha, that is funny. Anyway, how was your day?", "Lol. So how was your day?"]
    answers = ["Pretty good, thanks for asking! Nothing special today.", "Good, nothing special."]
    turns = [{"role": "user", "content": "I signed up for a pottery class last weekend."}]
    for i in range(40):
        turns.append({"role": "user", "content": asks[i % 2]})
        turns.append({"role": "assistant", "content": answers[(i // 2) % 2]})
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201
    offload = {"type": "offload", "until_tokens": 300}
    resp = await admin.post(f"/v1/sessions/{sid}/memory", json=offload)
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"]["chunks_written"] >= 4  # several chunks of the same small talk

    found = await admin.post(
        f"/v1/sessions/{sid}/memory",
        json={"type": "recall", "query": "how was your day, nothing special?", "top_k": 8},
    )
    assert found.status_code == 200, found.text
    texts = [m["text"] for m in found.json()["data"]["matches"]]
    assert texts
    words = [term_set(t) for t in texts]
    for later, mine in enumerate(words):
        for earlier in words[:later]:
            assert len(mine - earlier) >= 0.1 * len(mine), (texts[later], texts)
