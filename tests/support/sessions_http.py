"""A session set up over HTTP as the tests of recall need it: configured, its turns appended,
then everything the window's floors allow offloaded at once through the memory tool."""

from typing import Any

import httpx


async def offloaded_session(
    http: httpx.AsyncClient, sid: str, config: dict[str, Any], turns: list[dict[str, str]]
) -> dict[str, Any]:
    """The memory tool's answer to the offload (its `data`: `turns_moved`, …)."""
    assert (await http.put(f"/v1/sessions/{sid}", json=config)).status_code == 200
    resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text
    offload = {"type": "offload", "until_tokens": 0}
    resp = await http.post(f"/v1/sessions/{sid}/memory", json=offload)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()["data"]
    return answer
