"""The benchmarks' wait for a session's offload fails at once for a session that cannot offload."""

import httpx
import pytest

from benchmarks.build_prompt_latency import wait_offloaded


async def test_a_session_under_its_trigger_fails_at_once_instead_of_waiting(
    client: httpx.AsyncClient,
) -> None:
    turns = [{"role": "user", "content": f"turn {i}: a short note"} for i in range(30)]
    resp = await client.post("/v1/sessions/too-small/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text
    assert resp.json()["watermark"]["level"] == "normal"
    with pytest.raises(SystemExit, match=r"too-small: 30 turns fill 0% of the window") as raised:
        await wait_offloaded(client, "too-small", True, timeout=5)
    # Not the deadline's message ("not ready after 5s"): the first reading decides.
    assert "nothing will be offloaded" in str(raised.value)
