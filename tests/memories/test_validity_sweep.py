"""An item whose TTL passes leaves the notes too: the worker's validity sweep refreshes the
notes of the sessions that saw it (build-prompt reads the items in force at each build)."""

from typing import Any

import httpx

from tests.support.server import RunningServer
from tests.support.waiting import wait_for

OWN_DATABASE = True  # a worker takes every pending job of its database

TEXT = "The staging server is frozen for the release."


async def test_an_expired_item_leaves_the_notes_within_the_sweep(
    contextd: RunningServer, api_key: str
) -> None:
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        assert (await http.put("/v1/sessions/frozen", json={})).status_code == 200
        resp = await http.post(
            "/v1/sessions/frozen/memories", json={"text": TEXT, "ttl_seconds": 8}
        )
        assert resp.status_code == 201, resp.text

        async def remembered() -> list[str]:
            pad: dict[str, Any] = (await http.get("/v1/sessions/frozen/scratchpad")).json()
            return [item["text"] for item in pad["notes"]["remembered"]]

        assert await wait_for(remembered, lambda texts: TEXT in texts, what="the notes") == [TEXT]
        assert (
            await wait_for(
                remembered, lambda texts: not texts, timeout=150, what="the validity sweep"
            )
            == []
        )
        listed = (await http.get("/v1/sessions/frozen/memories")).json()["memories"]
        assert [(m["text"], m["in_force"]) for m in listed] == [(TEXT, False)]
