"""The turns of shown chunks are kept per process (`app.recall.session_chunks.SessionChunks`):
a build that shows a chunk again builds what a first read builds, and a forgotten turn never
comes back through them, in English and Chinese."""

from typing import Any

import httpx
import pytest

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}


def filler(i: int, lang: str) -> dict[str, str]:
    # Short turns sharing most words, so one chunk holds several of them.
    content = (
        f"turn {i}: the ferry timetable for the island trip, option {i}."
        if lang == "en"
        else f"第{i}轮：去海岛的渡轮时刻表，方案{i}。"
    )
    return {"role": "user" if i % 2 == 0 else "assistant", "content": content}


async def build(admin: httpx.AsyncClient, sid: str, query: str, budget: int) -> dict[str, Any]:
    resp = await admin.post(
        f"/v1/sessions/{sid}/build-prompt",
        json={"query": query, "recall": {"mode": "always", "budget_tokens": budget}},
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def prompt_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m["content"]) for m in body["messages"][:-1])


def same_build(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k not in ("build_id", "timings_ms")} == {
        k: v for k, v in b.items() if k not in ("build_id", "timings_ms")
    }


@pytest.mark.parametrize(
    ("lang", "planted", "secret", "query", "budget"),
    [
        (
            "en",
            "We picked the quokkaferry at 9:40, platform 2.",
            "The locker code is vexmarlin 4471.",
            "which quokkaferry did we pick?",
            90,
        ),
        (
            "zh",
            "我们选了袋鼠渡轮，九点四十分，二号站台。",
            "储物柜密码是雪貂四四七一。",
            "我们选了哪班袋鼠渡轮？",
            150,
        ),
    ],
)
async def test_a_chunk_shown_again_builds_the_same_and_a_forgotten_turn_stays_out(
    admin: httpx.AsyncClient, lang: str, planted: str, secret: str, query: str, budget: int
) -> None:
    # `budget`: recall tokens below the planted chunk's whole size and above its best turns', so
    # the chunk is shown cut down (through its turns).
    sid = f"shown-lines-{lang}"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    turns = [filler(i, lang) for i in range(60)]
    turns[7] = {"role": "assistant", "content": planted}
    turns[8] = {"role": "user", "content": secret}
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201
    offload = {"type": "offload", "until_tokens": 1}
    assert (await admin.post(f"/v1/sessions/{sid}/memory", json=offload)).status_code == 200
    listed = (await admin.get(f"/v1/sessions/{sid}/turns", params={"limit": 200})).json()["turns"]
    chunk_of = {t["seq"]: t["chunk_id"] for t in listed}
    assert chunk_of[8] is not None and chunk_of[8] == chunk_of[9], "planted and secret not together"

    first = await build(admin, sid, query, budget)  # reads the chunk's turns
    shown = [i for i in first["recall"]["items"] if i["chunk_id"] == chunk_of[8]]
    assert shown and shown[0]["turns"] is not None and 8 in shown[0]["turns"], first["recall"]
    again = await build(admin, sid, query, budget)  # the same chunk, from the kept turns
    assert same_build(first, again)

    forgot = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [9, 9]}
    )
    assert forgot.status_code == 200, forgot.text
    assert forgot.json()["data"]["tombstoned_chunks"] == [chunk_of[8]]

    after = await build(admin, sid, query, budget)

    ids = {i["chunk_id"] for i in after["recall"]["items"]}
    assert chunk_of[8] not in ids and ids
    assert planted in prompt_text(after)
    assert secret not in prompt_text(after) and secret not in str(after)
