"""The per-process BM25 index follows the session's active chunks, also when a forget re-chunks
them without changing their count (the index is keyed by `sessions.chunks_version`)."""

from typing import Any

import httpx

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
KEPT_WORD = "quokkaferry"


def short_turn(i: int) -> dict[str, str]:
    # Short turns sharing most words, so one chunk (60-160 tokens) holds several of them.
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"turn {i}: the ferry timetable for the island trip, option {i}.",
    }


async def build(admin: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    resp = await admin.post(
        f"/v1/sessions/{sid}/build-prompt",
        json={"query": f"which {KEPT_WORD} did we pick?", "recall": {"mode": "always"}},
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def recalled(body: dict[str, Any]) -> set[str]:
    return {i["chunk_id"] for i in body["recall"]["items"] if i["source"] == "chunk"}


def in_manifest(body: dict[str, Any]) -> set[str]:
    return {m["id"] for m in body["manifest"] if m["layer"] == "c3"}


async def active_chunks(admin: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    chunks = (await admin.get(f"/v1/sessions/{sid}/chunks")).json()["chunks"]
    return [c for c in chunks if c["status"] == "active"]


async def test_same_count_rechunk_is_seen_by_the_cached_lexical_index(
    admin: httpx.AsyncClient,
) -> None:
    sid = "lexical-cache"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    turns = [short_turn(i) for i in range(60)]
    turns[7] = {"role": "assistant", "content": f"We picked the {KEPT_WORD} at 9:40, platform 2."}
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).status_code == 201
    assert (
        await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "offload", "until_tokens": 1})
    ).status_code == 200
    listed = (await admin.get(f"/v1/sessions/{sid}/turns", params={"limit": 200})).json()["turns"]
    kept_turn = next(t for t in listed if t["seq"] == 8)
    old_id = kept_turn["chunk_id"]
    assert old_id is not None, "the planted turn was not offloaded"
    old = next(c for c in await active_chunks(admin, sid) if c["chunk_id"] == old_id)
    assert old["turn_first"] < old["turn_last"], old  # the chunk holds more than the planted turn

    warm = await build(admin, sid)  # builds and caches this process's BM25 index
    assert old_id in recalled(warm) and old_id in in_manifest(warm)

    count_before = len(await active_chunks(admin, sid))
    # An edge turn of the chunk other than the planted one: what remains is one run, one chunk.
    edge = old["turn_first"] if old["turn_first"] < 8 else old["turn_last"]
    forgot = await admin.post(
        f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [edge, edge]}
    )
    assert forgot.status_code == 200, forgot.text
    data = forgot.json()["data"]
    assert data["tombstoned_chunks"] == [old_id] and len(data["rechunked_into"]) == 1
    after = await active_chunks(admin, sid)
    assert len(after) == count_before  # re-chunked with the same count
    new_id = data["rechunked_into"][0]
    new = next(c for c in after if c["chunk_id"] == new_id)
    assert new["turn_first"] <= 8 <= new["turn_last"]

    again = await build(admin, sid)

    assert old_id not in recalled(again) and old_id not in in_manifest(again)
    assert new_id in recalled(again) and new_id in in_manifest(again)
    assert recalled(again) <= {c["chunk_id"] for c in after}


async def test_chunks_added_by_a_later_offload_are_found_after_the_index_was_cached(
    admin: httpx.AsyncClient,
) -> None:
    sid = "lexical-cache-grows"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    first = [short_turn(i) for i in range(40)]
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": first})).status_code == 201
    offload = {"type": "offload", "until_tokens": 1}
    assert (await admin.post(f"/v1/sessions/{sid}/memory", json=offload)).status_code == 200
    warm = await build(admin, sid)  # caches the BM25 index of the first chunks
    assert recalled(warm) == set()  # nothing holds the word yet
    before = {c["chunk_id"] for c in await active_chunks(admin, sid)}

    more = [short_turn(i) for i in range(40, 80)]
    more[5] = {"role": "assistant", "content": f"We picked the {KEPT_WORD} at 9:40, platform 2."}
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": more})).status_code == 201
    assert (await admin.post(f"/v1/sessions/{sid}/memory", json=offload)).status_code == 200
    after = await active_chunks(admin, sid)
    planted = next(c["chunk_id"] for c in after if c["turn_first"] <= 46 <= c["turn_last"])
    assert before < {c["chunk_id"] for c in after} and planted not in before

    again = await build(admin, sid)

    assert planted in recalled(again) and planted in in_manifest(again)
    assert again["recall"]["items"][0]["chunk_id"] == planted
