"""A user's remembered items (scope user) reach build-prompt from a new session's first turn."""

import json
from typing import Any

import httpx

SYSTEM = "You are a helpful assistant."
ITEMS = [
    "My daughter is allergic to peanuts.",
    "Seat preference: aisle, never the middle.",
    "Invoices go to finance@example.com, no paper copies.",
    "我住在上海，周末一般不工作。",
    "Favourite airline: KLM.",
    "Allergic to cats as well.",
    "Prefers answers in bullet points.",
]


async def remember_all(client: httpx.AsyncClient, session: str, user: str) -> None:
    assert (await client.put(f"/v1/sessions/{session}", json={"user_id": user})).status_code == 200
    for text in ITEMS:
        body = {"type": "remember", "text": text, "scope": "user"}
        resp = await client.post(f"/v1/sessions/{session}/memory", json=body)
        assert resp.status_code == 200 and resp.json()["data"]["outcome"] == "stored", resp.text


async def test_a_new_session_of_the_user_gets_the_relevant_items_in_its_first_build(
    client: httpx.AsyncClient,
) -> None:
    await remember_all(client, "earlier-session", "u-7")
    assert (await client.put("/v1/sessions/fresh", json={"user_id": "u-7"})).status_code == 200
    query = "Can you suggest a snack for my daughter? Mind her allergy."
    resp = await client.post(
        "/v1/sessions/fresh/build-prompt", json={"system": SYSTEM, "query": query}
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    blocks = [m["content"] for m in body["messages"] if m["role"] == "system"]
    assert len(blocks) == 2 and blocks[1].startswith("<about_user>"), blocks
    lines = blocks[1].splitlines()
    assert lines[2].startswith("- My daughter is allergic to peanuts.")  # ranked first
    entries = [m for m in body["manifest"] if m["source"] == "user_memory"]
    assert len(entries) == len(ITEMS)  # every candidate is accounted for
    included = [m for m in entries if m["included"]]
    assert len(included) == 5 and all(m["layer"] == "c2" for m in entries)
    assert {m["reason"] for m in entries if not m["included"]} == {"below_k"}
    assert body["usage"]["c2"] == sum(m["tokens"] for m in included) > 0
    assert body["usage"]["total"] <= body["usage"]["limit"]
    assert body["recall"]["skipped_reason"] == "no_history"  # no history search ran


async def test_a_session_without_user_id_keeps_the_exact_baseline(
    client: httpx.AsyncClient,
) -> None:
    await remember_all(client, "someone", "u-8")
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "Plan a snack for my daughter."},
        {"role": "assistant", "content": "Sure, any allergies?"},
    ]
    assert (await client.post("/v1/sessions/plain/turns", json={"turns": turns})).status_code == 201
    query = "Yes, peanuts. 花生过敏。"
    resp = await client.post(
        "/v1/sessions/plain/build-prompt", json={"system": SYSTEM, "query": query}
    )
    assert resp.status_code == 200, resp.text
    expected = [{"role": "system", "content": SYSTEM}, *turns, {"role": "user", "content": query}]
    assert json.dumps(resp.json()["messages"]) == json.dumps(expected)
    assert {m["layer"] for m in resp.json()["manifest"]} == {"c0", "c1", "query"}
