"""build-prompt under faults: an inline offload that cannot get the session lock, nothing left to
move, read-only keys, and an embedder that hangs, drips or answers garbage."""

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.conftest import new_key
from tests.support.factories import session_of_key
from tests.support.faults import DIM, Mode, faulty_server
from tests.support.loopback import loopback_server
from tests.support.server import RunningServer, run_server

SMALL = {
    "context_limit": 2000,
    "reserve_tokens": 200,
    "min_recent_turns": 2,
    "min_recent_tokens": 50,
}
LARGE = {**SMALL, "context_limit": 100_000}
SYSTEM = "You are a careful travel agent."


def filler(n: int) -> list[dict[str, Any]]:
    """Turns of about 60 tokens, with words recall can find."""
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Turn {i}: order AB-{10000 + i} goes to Lyon by train, window seat, "
            "budget at most 120 EUR, invoice to finance@example.com. " * 2,
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def fault_server(settings: Settings) -> Iterator[RunningServer]:
    own = settings.model_copy(
        update={
            "recall": settings.recall.model_copy(update={"emergency_offload_timeout_seconds": 1.0})
        }
    )
    with run_server(own) as server:
        yield server


@pytest.fixture
async def http(fault_server: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=fault_server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
    ) as client:
        yield client


async def build(http: httpx.AsyncClient, sid: str, **extra: Any) -> httpx.Response:
    body = {"system": SYSTEM, "query": "Which order goes to Lyon by train?", **extra}
    return await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)


async def shrink_to_emergency(http: httpx.AsyncClient, sid: str) -> None:
    """Make the window small (`SMALL`) under turns already stored: the window alone is past the
    emergency ratio (no worker runs). An append that took it there would have offloaded."""
    assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    assert (await http.get(f"/v1/sessions/{sid}")).json()["watermark"]["level"] == "emergency"


async def emergency_session(http: httpx.AsyncClient, sid: str) -> None:
    """A small-window session whose window alone is past the emergency ratio."""
    assert (await http.put(f"/v1/sessions/{sid}", json=LARGE)).status_code == 200
    resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": filler(30)})
    assert resp.status_code == 201
    await shrink_to_emergency(http, sid)


async def test_an_inline_offload_kept_from_the_session_lock_is_the_documented_fallback(
    http: httpx.AsyncClient, engine: AsyncEngine, api_key: str
) -> None:
    assert (await http.put("/v1/sessions/locked", json=LARGE)).status_code == 200
    assert (await http.post("/v1/sessions/locked/turns", json={"turns": filler(30)})).is_success
    assert (await build(http, "locked")).status_code == 200  # c0 stored: no write below
    await shrink_to_emergency(http, "locked")
    pk = await session_of_key(engine, api_key, "locked")

    async with engine.connect() as holder:  # another transaction holds the session row
        await holder.execute(text("SELECT 1 FROM sessions WHERE id = :pk FOR UPDATE"), {"pk": pk})
        blocked = await build(http, "locked")
        await holder.rollback()
    assert blocked.status_code == 200, blocked.text
    assert "emergency_offload_failed" in blocked.json()["fallbacks"]
    assert "window_truncated" in blocked.json()["fallbacks"]  # the oldest turns are left out
    assert (await http.get("/v1/sessions/locked")).json()["counts"]["chunks"] == 0

    freed = await build(http, "locked")  # the lock is gone: the offload runs
    assert freed.status_code == 200
    assert "emergency_offload_failed" not in freed.json()["fallbacks"]
    assert (await http.get("/v1/sessions/locked")).json()["counts"]["chunks"] > 0


async def test_nothing_left_to_move_is_not_an_offload_failure(http: httpx.AsyncClient) -> None:
    """The newest turn always stays in the window: with only it there, nothing can move."""
    assert (await http.put("/v1/sessions/one-turn", json=SMALL)).status_code == 200
    huge = {"role": "user", "content": "word " * 1900}
    assert (await http.post("/v1/sessions/one-turn/turns", json={"turns": [huge]})).is_success
    resp = await build(http, "one-turn")
    assert resp.status_code == 200, resp.text
    assert resp.json()["watermark"]["level"] == "emergency"
    assert "emergency_offload_failed" not in resp.json()["fallbacks"]
    assert "window_truncated" in resp.json()["fallbacks"]


async def test_a_read_only_key_builds_without_side_effects(
    fault_server: RunningServer,
    http: httpx.AsyncClient,
    engine: AsyncEngine,
    api_key: str,
    tenant_name: str,
) -> None:
    reader_key = await new_key(engine, tenant_name, ["sessions:read"])
    async with httpx.AsyncClient(
        base_url=fault_server.url, headers={"Authorization": f"Bearer {reader_key}"}, timeout=60
    ) as reader:
        # A session that does not exist: a baseline prompt, and still no session.
        ghost = await build(reader, "ghost", persist_manifest=True)
        assert ghost.status_code == 200, ghost.text
        assert [m["role"] for m in ghost.json()["messages"]] == ["system", "user"]
        assert (await reader.get("/v1/sessions/ghost")).status_code == 404

        # A session past the emergency ratio: no offload, no c0, no stored manifest.
        await emergency_session(http, "read-only")
        resp = await build(reader, "read-only", persist_manifest=True)
        assert resp.status_code == 200, resp.text
        assert "emergency_offload_skipped" in resp.json()["fallbacks"]
        assert "emergency_offload_failed" not in resp.json()["fallbacks"]
        assert (
            await reader.get(f"/v1/sessions/read-only/builds/{resp.json()['build_id']}")
        ).status_code == 404
    pk = await session_of_key(engine, api_key, "read-only")
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT c0_tokens, chunk_count, (SELECT count(*) FROM chunks WHERE "
                    "session_id = :pk), (SELECT count(*) FROM prompt_builds WHERE "
                    "session_id = :pk) FROM sessions WHERE id = :pk"
                ),
                {"pk": pk},
            )
        ).one()
        ghosts = await conn.scalar(
            text(
                "SELECT count(*) FROM sessions s JOIN tenants t ON t.id = s.tenant_id "
                "WHERE t.name = :t AND s.external_id = 'ghost'"
            ),
            {"t": tenant_name},
        )
    assert tuple(row) == (None, 0, 0, 0)
    assert ghosts == 0


async def test_the_system_prompt_size_is_written_only_when_it_changes_the_budget(
    http: httpx.AsyncClient, engine: AsyncEngine, api_key: str
) -> None:
    """Until a build reports it, a session is budgeted with `session_defaults.c0_tokens` (0): a
    build without system prompt or tools leaves the row as it is; a system prompt is stored,
    and a later build without one stores 0."""
    assert (await http.put("/v1/sessions/c0-store", json=SMALL)).status_code == 200
    assert (await http.post("/v1/sessions/c0-store/turns", json={"turns": filler(2)})).is_success
    pk = await session_of_key(engine, api_key, "c0-store")

    async def stored() -> tuple[Any, str]:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text("SELECT c0_tokens, xmin::text FROM sessions WHERE id = :pk"), {"pk": pk}
                )
            ).one()
        return row[0], row[1]

    before = await stored()
    bare = await http.post("/v1/sessions/c0-store/build-prompt", json={"query": "Which order?"})
    assert bare.status_code == 200, bare.text
    assert bare.json()["usage"]["c0"] == 0
    assert await stored() == before == (None, before[1])  # not even rewritten as it was

    with_system = await build(http, "c0-store")
    assert with_system.status_code == 200, with_system.text
    c0 = with_system.json()["usage"]["c0"]
    assert c0 > 0
    assert (await stored())[0] == c0

    again = await http.post("/v1/sessions/c0-store/build-prompt", json={"query": "And now?"})
    assert again.status_code == 200, again.text
    assert (await stored())[0] == 0


def embedder_settings(settings: Settings, url: str, budget: float) -> Settings:
    return settings.model_copy(
        update={
            "embedding": settings.embedding.model_copy(
                update={
                    "kind": "openai",
                    "openai_base_url": url,
                    "openai_dim": DIM,
                    "query_timeout_seconds": budget,
                }
            ),
            "recall": settings.recall.model_copy(
                update={
                    "embedder_breaker_failures": 2,
                    "embedder_breaker_cooldown_seconds": 600,
                }
            ),
        }
    )


async def remember_for_user(http: httpx.AsyncClient, sid: str, user_id: str) -> None:
    """`sid` belongs to `user_id`, who has one user-scope item (Chinese, about a train to Lyon)."""
    assert (await http.put(f"/v1/sessions/{sid}", json={"user_id": user_id})).status_code == 200
    remembered = await http.post(
        f"/v1/sessions/{sid}/memory",
        json={"type": "remember", "text": "我住在上海，坐火车去里昂。", "scope": "user"},
    )
    assert remembered.status_code == 200, remembered.text


def admin_client(server: RunningServer, admin_key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=120
    )


async def offloaded_session(http: httpx.AsyncClient, sid: str) -> None:
    await emergency_session(http, sid)
    moved = await http.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
    assert moved.status_code == 200, moved.text
    assert (await http.get(f"/v1/sessions/{sid}")).json()["counts"]["chunks"] > 0


@pytest.mark.parametrize("mode", ["hang", "drip", "garbage"])
async def test_a_failing_embedder_costs_its_budget_then_is_skipped(
    settings: Settings, admin_key: str, mode: Mode
) -> None:
    with (
        faulty_server(mode) as embedder,
        run_server(embedder_settings(settings, embedder.url, budget=0.3)) as server,
    ):
        async with admin_client(server, admin_key) as http:
            await offloaded_session(http, f"embedder-{mode}")
            flags = []
            for i in range(3):
                resp = await build(http, f"embedder-{mode}", query=f"train to Lyon {i}?")
                assert resp.status_code == 200, resp.text
                assert resp.json()["recall"]["skipped_reason"] is None
                flags.append(resp.json()["fallbacks"])
    assert all("vector_unavailable" in f for f in flags)
    assert ["embedder_circuit_open" in f for f in flags] == [False, False, True]
    assert embedder.requests == 2  # the open breaker kept the third build off the embedder


async def test_appends_are_not_delayed_by_a_build_waiting_on_the_embedder(
    settings: Settings, admin_key: str
) -> None:
    """The build that waits changed the system prompt's size (a session row write): the write
    is committed before the wait, so the session's row is free for appends meanwhile."""
    with (
        faulty_server("hang") as embedder,
        run_server(embedder_settings(settings, embedder.url, budget=60)) as server,
    ):
        async with admin_client(server, admin_key) as http:
            await offloaded_session(http, "busy")
            waiting = asyncio.create_task(
                build(http, "busy", system=f"A new system prompt {uuid.uuid4()}.")
            )
            assert await asyncio.to_thread(embedder.arrived.wait, 60)
            appended = await http.post(
                "/v1/sessions/busy/turns",
                json={"turns": [{"role": "user", "content": "One more thing."}]},
            )
            still_waiting = not waiting.done()
            embedder.release.set()
            built = await waiting
    assert appended.status_code == 201
    assert still_waiting  # the append was answered while the build waited on the embedder
    assert built.status_code == 200
    assert "vector_unavailable" not in built.json()["fallbacks"]


async def test_queries_queued_behind_a_working_embedder_do_not_open_the_breaker(
    settings: Settings, admin_key: str
) -> None:
    """A healthy embedder serving concurrent queries one after another (a local encoder's
    queue): the first query is answered once all have arrived, the others wait past the budget.
    They go on lexically, but the embedder answered meanwhile, so the breaker stays closed and
    the next build gets its vector."""
    queued = 4
    arrived = threading.Condition()
    seen = {"requests": 0}
    release = threading.Event()

    def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
        with arrived:
            seen["requests"] += 1
            first = seen["requests"] == 1
            arrived.notify_all()
            if first:
                assert arrived.wait_for(lambda: seen["requests"] >= queued, timeout=60)
        if not first:
            release.wait(120)
        vectors = [[1.0] * DIM for _ in body["input"]]
        return 200, {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]}

    with loopback_server(embeddings) as embedder:
        served = embedder_settings(settings, embedder.url, budget=5.0)
        # The first build's connection idles while the others wait out their 5 s budget; on a
        # loaded machine that can reach the default 10 s keep-alive, and the server could close
        # it just as the next build reuses it.
        served = served.model_copy(
            update={"server": served.server.model_copy(update={"keep_alive_seconds": 60})}
        )
        with run_server(served) as server:
            async with admin_client(server, admin_key) as http:
                await offloaded_session(http, "queued")
                answers = await asyncio.gather(
                    *(build(http, "queued", query=f"train to Lyon {i}?") for i in range(queued))
                )
                release.set()
                after = await build(http, "queued", query="train to Lyon, once more?")
    flags = [a.json()["fallbacks"] for a in answers]
    assert sorted("vector_timeout" in f for f in flags) == [False] + [True] * (queued - 1)
    assert not any("embedder_circuit_open" in f for f in flags)
    assert after.status_code == 200, after.text
    assert "embedder_circuit_open" not in after.json()["fallbacks"]
    assert "vector_unavailable" not in after.json()["fallbacks"]
    assert seen["requests"] == queued + 1


async def test_recall_and_the_users_items_share_one_query_embedding(
    settings: Settings, admin_key: str
) -> None:
    """A session with a user's remembered items and offloaded history: "about this user" and
    recall embed the same query text, once per build, so a hanging embedder costs one budget
    and one failure (before, each waited out its own, and one build opened the breaker)."""
    with (
        faulty_server("hang") as embedder,
        run_server(embedder_settings(settings, embedder.url, budget=0.3)) as server,
    ):
        async with admin_client(server, admin_key) as http:
            await offloaded_session(http, "shared-vector")
            await remember_for_user(http, "shared-vector", "u-shared")
            flags = []
            for query in ["train to Lyon tomorrow?", "去里昂的火车几点出发？"]:
                before = embedder.requests
                resp = await build(http, "shared-vector", query=query)
                assert resp.status_code == 200, resp.text
                assert embedder.requests - before == 1
                assert resp.json()["recall"]["skipped_reason"] is None
                entries = [m for m in resp.json()["manifest"] if m["source"] == "user_memory"]
                assert len(entries) == 1
                flags.append(resp.json()["fallbacks"])
    assert all("vector_timeout" in f for f in flags)
    assert not any("embedder_circuit_open" in f for f in flags)  # two failures: two builds


async def test_a_query_embedded_by_one_build_is_read_from_the_cache_by_the_next(
    settings: Settings, admin_key: str
) -> None:
    """The query's vector is stored beside the search that uses it (recall's vector search, or
    the user's items' when recall does not run), before the build answers: the next build of
    the same query embeds nothing (English and Chinese)."""
    with (
        faulty_server("hang") as embedder,
        run_server(embedder_settings(settings, embedder.url, budget=30)) as server,
    ):
        embedder.release.set()  # it answers at once
        async with admin_client(server, admin_key) as http:
            await offloaded_session(http, "stored-vector")
            await remember_for_user(http, "stored-vector-user", "u-stored")
            for sid, query in [
                ("stored-vector", "train to Lyon tomorrow?"),
                ("stored-vector", "去里昂的火车几点出发？"),
                ("stored-vector-user", "which train to Lyon did I take?"),
                ("stored-vector-user", "我坐哪班火车去里昂？"),
            ]:
                before = embedder.requests
                for _ in range(2):
                    resp = await build(http, sid, query=query)
                    assert resp.status_code == 200, resp.text
                    assert "vector_unavailable" not in resp.json()["fallbacks"]
                assert embedder.requests - before == 1, (sid, query)
                skipped = resp.json()["recall"]["skipped_reason"]
                assert skipped == (None if sid == "stored-vector" else "no_history")
