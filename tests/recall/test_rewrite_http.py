"""Through the memory tool over HTTP: a self-contained question is searched as asked, after a
long stretch of small talk has been offloaded, and a dependent one gets the last turns' terms."""

import httpx

SMALL = {
    "context_limit": 3000,
    "reserve_tokens": 300,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
PASSES = (
    "Two passes fit: the Eurail Global Pass covers 33 countries for 15 days at €557, and the "
    "Interrail One Country Pass for Italy costs €233 for four travel days in one month. "
)


def small_talk(part: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Tell me about rail passes please, part {part}."},
        {
            "role": "assistant",
            "content": "Happy to! Rail passes are a relaxed way to see Europe: you hop on and "
            "off, watch the countryside roll by and meet fellow travellers in the dining car. "
            f"Many travellers love the flexibility, and part {part} is no exception.",
        },
    ]


async def recall(http: httpx.AsyncClient, sid: str, query: str) -> dict:
    resp = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query, "top_k": 3}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


async def test_name_and_allergy_questions_go_to_recall_as_asked(admin: httpx.AsyncClient):
    sid = "rewrite-name-allergy"
    assert (await admin.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    turns = [
        {"role": "user", "content": "Hi, my name is Lena Fischer."},
        {"role": "assistant", "content": "Nice to meet you, Lena!"},
        {"role": "user", "content": "I'm allergic to penicillin, please keep that in mind."},
        {"role": "assistant", "content": "Noted: you are allergic to penicillin."},
    ]
    for part in range(1, 16):
        turns += small_talk(part)
    turns += [
        {"role": "user", "content": "Which rail passes would suit two weeks in Europe?"},
        {"role": "assistant", "content": PASSES},
    ]
    resp = await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text
    offload = {"type": "offload", "until_tokens": 0}
    resp = await admin.post(f"/v1/sessions/{sid}/memory", json=offload)
    assert resp.status_code == 200, resp.text
    status = (await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "status"})).json()
    assert status["data"]["offloaded_until_seq"] >= 4  # name and allergy left the window

    for question in ("What is my name?", "What am I allergic to?", "我叫什么名字？"):
        data = await recall(admin, sid, question)
        assert data["query_rewritten"] == question

    data = await recall(admin, sid, "What is my name?")
    assert any("Lena Fischer" in m["text"] for m in data["matches"]), data["matches"]
    data = await recall(admin, sid, "What am I allergic to?")
    assert any("penicillin" in m["text"] for m in data["matches"]), data["matches"]

    data = await recall(admin, sid, "what about the second one?")
    assert data["query_rewritten"].startswith("what about the second one? ")
    assert "Interrail" in data["query_rewritten"]
