"""The lifecycle's worker side: an item whose TTL passes leaves the notes too (the validity
sweep refreshes the notes of the sessions that saw it; build-prompt reads the items in force at
each build), and the erase of a forgotten item takes the text of every version it had."""

import uuid
from typing import Any

import httpx
import pytest

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


async def test_the_erase_of_a_forgotten_item_takes_every_version_s_text(
    contextd: RunningServer, admin_key: str
) -> None:
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    ) as http:
        assert (await http.put("/v1/sessions/erased", json={})).status_code == 200
        resp = await http.post(
            "/v1/sessions/erased/memories", json={"text": "我的护照号是 E12345678"}
        )
        memory_id = resp.json()["memory"]["memory_id"]
        url = f"/v1/sessions/erased/memories/{memory_id}"
        assert (await http.patch(url, json={"text": "我的护照号是 E87654321"})).status_code == 200
        forgot = await http.post(
            "/v1/sessions/erased/memory", json={"type": "forget", "memory_id": memory_id}
        )
        assert forgot.status_code == 200, forgot.text
        receipt = f"/v1/erase-receipts/{forgot.json()['data']['erase_receipt_id']}"
        await wait_for(
            lambda: http.get(receipt),
            lambda r: r.json()["status"] == "completed",
            what="the erase job",
        )
        item = (await http.get(url)).json()
        assert (item["status"], item["text"], item["in_force"]) == ("erased", "", False)
        versions = (await http.get(f"{url}/versions")).json()["versions"]
        assert [(v["status"], v["actor"]) for v in versions] == [
            ("active", "api_key"),
            ("active", "api_key"),
            ("tombstoned", "agent"),
            ("erased", "system"),
        ]
        assert {(v["text"], v["content_hash"]) for v in versions} == {(None, None)}


@pytest.mark.parametrize(
    "text", ["The build machine is reserved for the demo.", "构建服务器留给演示使用。"]
)
async def test_the_notes_read_leaves_out_an_expired_line_before_the_sweep(
    contextd: RunningServer, api_key: str, text: str
) -> None:
    sid = f"lapsed-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        assert (await http.put(f"/v1/sessions/{sid}", json={})).status_code == 200
        resp = await http.post(
            f"/v1/sessions/{sid}/memories", json={"text": text, "ttl_seconds": 3}
        )
        assert resp.status_code == 201, resp.text
        item_url = f"/v1/sessions/{sid}/memories/{resp.json()['memory']['memory_id']}"

        async def remembered() -> list[str]:
            pad: dict[str, Any] = (await http.get(f"/v1/sessions/{sid}/scratchpad")).json()
            return [item["text"] for item in pad["notes"]["remembered"]]

        async def notes_tokens() -> int:
            pad: dict[str, Any] = (await http.get(f"/v1/sessions/{sid}/scratchpad")).json()
            return int(pad["token_count"])

        assert await wait_for(remembered, lambda texts: text in texts, what="the notes") == [text]
        assert await notes_tokens() > 0
        await wait_for(
            lambda: http.get(item_url),
            lambda r: r.json()["in_force"] is False,
            timeout=30,
            what="the item's TTL to pass",
        )
        # The stored notes still hold the line until the minutely sweep; the read, like the
        # prompt, leaves it out now.
        assert await remembered() == []
        assert await notes_tokens() == 0  # what is returned is counted: no line, no tokens
        built = await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": "状态？"})
        assert built.status_code == 200 and text not in built.text
