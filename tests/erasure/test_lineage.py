"""Revocation follows the lineage, through HTTP against the real PostgreSQL, Valkey and worker:
forgetting a turn or a tool result, deleting a session, and marking a source untrusted take
every item derived from it out of build-prompt, recall, the remembered items, the notes and the
inspector — a remembered item of the user written from the turn too, in the user's other
sessions — and the receipt (or the untrust answer) lists each derived thing."""

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from tests.support.loopback import loopback_server, with_openai_embedder
from tests.support.server import RunningServer, run_server
from tests.support.waiting import wait_for

OWN_DATABASE = True  # a worker runs the notes and erase jobs: see tests/conftest.py

WINDOW = {
    "context_limit": 2000,
    "reserve_tokens": 200,
    "min_recent_turns": 1,
    "min_recent_tokens": 50,
    "target_ratio": 0.3,
}
FILLER = [
    {"role": "user", "content": "Thanks. Let's continue with the itinerary."},
    {"role": "assistant", "content": "Sure. The train leaves at 9:10 from platform 4."},
    {"role": "user", "content": "What about lunch near the station?"},
    {"role": "assistant", "content": "There are three cafés within five minutes' walk."},
]
FILLER_ZH = [
    {"role": "user", "content": "谢谢。我们继续安排行程吧。"},
    {"role": "assistant", "content": "好的。火车九点十分从四号站台出发。"},
    {"role": "user", "content": "车站附近有什么午饭的地方？"},
    {"role": "assistant", "content": "步行五分钟内有三家咖啡馆。"},
]


def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
    """An OpenAI-style embedder on loopback: the vectors' values do not matter here, that
    they exist (and are erased) does."""
    vectors = [[1.0 + i % 3, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0] for i in range(len(body["input"]))]
    return 200, {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]}


@pytest.fixture(scope="module")
def server_with_worker(settings: Settings) -> Iterator[RunningServer]:
    with loopback_server(embeddings) as provider:
        own = with_openai_embedder(settings, provider.url)
        with run_server(own, with_worker=True) as running:
            yield running


@pytest.fixture
async def http(server_with_worker: RunningServer, admin_key: str) -> Any:
    async with httpx.AsyncClient(
        base_url=server_with_worker.url,
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=60,
    ) as client:
        yield client


def ok(resp: httpx.Response) -> Any:
    assert resp.is_success, (resp.status_code, resp.text)
    return resp.json()


async def session(http: httpx.AsyncClient, user: str, turns: list[dict[str, Any]]) -> str:
    sid = f"lineage-{uuid.uuid4().hex[:8]}"
    ok(await http.put(f"/v1/sessions/{sid}", json={**WINDOW, "user_id": user}))
    if turns:
        ok(await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns}))
    return sid


async def remember(http: httpx.AsyncClient, sid: str, **body: Any) -> str:
    written = ok(await http.post(f"/v1/sessions/{sid}/memories", json={"scope": "user", **body}))
    return str(written["memory"]["memory_id"])


async def offloaded_and_noted(http: httpx.AsyncClient, sid: str, value: str) -> None:
    """Every turn above the floors offloaded, and the worker's notes holding `value`."""
    ok(await http.post(f"/v1/sessions/{sid}/memory", json={"type": "offload", "until_tokens": 0}))
    await wait_for(
        lambda: notes_text(http, sid), lambda text: value in text, timeout=90, what="notes"
    )


async def embedded(http: httpx.AsyncClient, sid: str) -> None:
    async def chunks() -> list[dict[str, Any]]:
        return list(ok(await http.get(f"/v1/sessions/{sid}/chunks"))["chunks"])

    await wait_for(chunks, lambda found: all(c["embedded"] for c in found), what="embeddings")


async def notes_text(http: httpx.AsyncClient, sid: str) -> str:
    notes = ok(await http.get(f"/v1/sessions/{sid}/scratchpad"))["notes"]
    return "\n".join(item["text"] for items in notes.values() for item in items)


async def prompt(http: httpx.AsyncClient, sid: str, query: str) -> str:
    built = ok(await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query}))
    return "\n".join(str(m.get("content") or "") for m in built["messages"])


async def recalled(http: httpx.AsyncClient, sid: str, query: str) -> str:
    found = ok(
        await http.post(f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query})
    )
    return "\n".join(m["text"] for m in found["data"].get("matches", []))


async def memories(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    return list(ok(await http.get(f"/v1/sessions/{sid}/memories"))["memories"])


async def completed(http: httpx.AsyncClient, receipt_id: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        return dict(ok(await http.get(f"/v1/erase-receipts/{receipt_id}")))

    return await wait_for(read, lambda r: r["status"] == "completed", timeout=90, what="erase")


def kinds(derived: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for item in derived:
        out.setdefault(item["kind"], []).append(item)
    return out


@pytest.mark.parametrize(
    ("turn", "value", "filler", "query"),
    [
        ("My gate code is 4821, please keep it.", "4821", FILLER, "What is my gate code?"),
        ("我的门禁密码是 6093，请记住。", "6093", FILLER_ZH, "我的门禁密码是多少？"),
    ],
)
async def test_forgetting_a_turn_takes_the_users_item_written_from_it(
    http: httpx.AsyncClient, turn: str, value: str, filler: list[dict[str, str]], query: str
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = await session(http, user, [{"role": "user", "content": turn}, *filler])
    derived_id = await remember(
        http, sid, text=f"Gate code {value}", source="user_turn", turn_seqs=[1]
    )
    kept_id = await remember(http, sid, text="Prefers window seats", source="remember")
    await offloaded_and_noted(http, sid, value)
    await embedded(http, sid)
    other = await session(http, user, [])
    assert value in await prompt(http, other, query)  # the user's memory, in a new session

    answer = ok(
        await http.post(f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [1, 1]})
    )
    forgot = answer["data"]
    assert forgot["tombstoned_memories"] == [derived_id]
    assert "1 remembered item(s) written from them" in answer["text"]
    # At once: nothing derived from turn 1 is served, here or in the user's other session.
    for where in (sid, other):
        assert value not in await prompt(http, where, query)
        assert value not in await recalled(http, where, query)
        listed = await memories(http, where)
        assert [m["memory_id"] for m in listed] == [kept_id]
    assert value not in await notes_text(http, sid)

    receipt = await completed(http, forgot["erase_receipt_id"])
    found = kinds(receipt["derived"])
    assert [m["id"] for m in found["memory"]] == [derived_id]
    assert found["notes_line"][0]["count"] >= 1 and found["chunk"]
    assert found["embedding"][0]["count"] >= 1
    assert receipt["seconds_to_gone"] is not None and receipt["seconds_to_gone"] >= 0
    page = await http.get(f"/inspect/sessions/{sid}")
    assert page.status_code == 200 and value not in page.text


TOOL_TURNS = [
    {"role": "user", "content": "Find me the hotel's booking details."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "fetch_page", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "Hotel Bellevue, booking number HB-5521."},
    {"role": "assistant", "content": "Here is what I found."},
    *FILLER,
]


PASTED = [
    {
        "role": "user",
        "content": "The supplier wrote: the unit price is 940 EUR, order code SP-4410.",
    },
    *FILLER,
]
PASTED_ZH = [{"role": "user", "content": "供应商说：单价 940 欧元，订单号 SP-4410。"}, *FILLER_ZH]


@pytest.mark.parametrize(
    ("turns", "source", "memory", "seq"),
    [
        (TOOL_TURNS, {"tool": "fetch_page"}, {"source": "api", "source_tool": "fetch_page"}, 3),
        (PASTED, {"turn_range": [1, 1]}, {"source": "user_turn", "turn_seqs": [1]}, 1),
        (PASTED_ZH, {"turn_range": [1, 1]}, {"source": "user_turn", "turn_seqs": [1]}, 1),
    ],
    ids=["tool", "turn-range-en", "turn-range-zh"],
)
async def test_an_untrusted_source_quarantines_what_was_derived_from_it(
    http: httpx.AsyncClient,
    turns: list[dict[str, Any]],
    source: dict[str, Any],
    memory: dict[str, Any],
    seq: int,
) -> None:
    value = "HB-5521" if "tool" in source else "SP-4410"
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = await session(http, user, turns)
    derived_id = await remember(http, sid, text=f"Booked under {value}", **memory)
    await offloaded_and_noted(http, sid, value)
    other = await session(http, user, [])
    assert value in await prompt(http, other, "Which booking number?")

    page = (await http.get(f"/inspect/sessions/{sid}")).text  # the notes lines' provenance
    assert ("tool fetch_page · by rules" in page) == ("tool" in source)
    assert f"turn {seq} · {'tool' if 'tool' in source else 'user'}" in page

    answer = ok(await http.post(f"/v1/sessions/{sid}/sources/untrust", json=source))
    assert answer["turn_seqs"] == [seq] and answer["status"] == "quarantined"
    found = kinds(answer["derived"])
    assert [m["id"] for m in found["memory"]] == [derived_id]
    assert found["notes_line"][0]["count"] >= 1 and answer["seconds_to_gone"] >= 0
    # A tool result's chunk was labelled untrusted on arrival; a user turn's is now.
    assert ("chunk" in found) == ("turn_range" in source)

    assert value not in await notes_text(http, sid)
    assert value not in await prompt(http, other, "Which booking number?")
    [item] = [m for m in await memories(http, sid) if m["memory_id"] == derived_id]
    assert item["status"] == "quarantined" and not item["in_force"] and not item["trusted"]
    chunks = ok(await http.get(f"/v1/sessions/{sid}/chunks"))["chunks"]
    covering = [c["trust"] for c in chunks if c["turn_first"] <= seq <= c["turn_last"]]
    assert covering == ["untrusted"]
    # Recalled, the raw turn is untrusted data, and the manifest says so.
    ask = {"query": f"What was {value}?", "recall": {"mode": "always"}}
    built = ok(await http.post(f"/v1/sessions/{sid}/build-prompt", json=ask))
    ids = {c["chunk_id"] for c in chunks if c["turn_first"] <= seq <= c["turn_last"]}
    [recalled] = [m for m in built["manifest"] if m["id"] in ids and m["included"]]
    assert recalled["layer"] == "c3" and recalled["trusted"] is False

    # A notes rebuild from the raw turns (the erase job of a forget) derives nothing from it.
    last = ok(await http.get(f"/v1/sessions/{sid}"))["counts"]["turns"]
    forgot = ok(
        await http.post(
            f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [last, last]}
        )
    )["data"]
    await completed(http, forgot["erase_receipt_id"])
    assert value not in await notes_text(http, sid)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({}, 422, "tool"),
        ({"tool": "fetch_page", "turn_range": [1, 2]}, 422, "tool"),
        ({"turn_range": [3, 2]}, 422, "turn_range"),
        ({"turn_range": [1]}, 422, "turn_range"),
        ({"tool": "no_such_tool"}, 404, "tool"),
        ({"turn_range": [90, 99]}, 404, "turn_range"),
    ],
)
async def test_untrust_names_the_bad_field(
    http: httpx.AsyncClient, body: dict[str, Any], status: int, field: str
) -> None:
    sid = await session(http, f"u-{uuid.uuid4().hex[:8]}", TOOL_TURNS[:4])
    resp = await http.post(f"/v1/sessions/{sid}/sources/untrust", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["field"].split(".")[0].split("[")[0] == field


async def test_a_session_delete_receipt_lists_what_went_with_it(http: httpx.AsyncClient) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = await session(http, user, [{"role": "user", "content": "My PIN is 7304."}, *FILLER])
    await remember(http, sid, text="PIN 7304", source="user_turn", turn_seqs=[1])
    other = await session(http, user, [])
    assert "7304" in await prompt(http, other, "What is my PIN?")
    erased = ok(await http.delete(f"/v1/sessions/{sid}"))
    receipt = await completed(http, erased["erase_receipt_id"])
    found = kinds(receipt["derived"])
    assert found["memory"][0]["count"] == 1 and found["prompt_build"][0]["count"] == -1
    assert receipt["seconds_to_gone"] is not None
    assert "7304" not in await prompt(http, other, "What is my PIN?")
    assert all("7304" not in m["text"] for m in await memories(http, other))


async def test_forgetting_a_tool_result_takes_the_item_read_in_it(http: httpx.AsyncClient) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = await session(http, user, TOOL_TURNS)
    derived_id = await remember(
        http, sid, text="Booked at HB-5521", source="api", source_tool="fetch_page", turn_seqs=[3]
    )
    await offloaded_and_noted(http, sid, "HB-5521")
    other = await session(http, user, [])
    assert "HB-5521" in await prompt(http, other, "Which booking number?")
    forgot = ok(
        await http.post(f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [3, 3]})
    )["data"]
    assert forgot["widened_to"] == [2, 3] and forgot["tombstoned_memories"] == [derived_id]
    for where in (sid, other):
        assert "HB-5521" not in await prompt(http, where, "Which booking number?")
        assert "HB-5521" not in await recalled(http, where, "HB-5521 booking number")
        assert all(m["memory_id"] != derived_id for m in await memories(http, where))
    receipt = await completed(http, forgot["erase_receipt_id"])
    assert [m["id"] for m in kinds(receipt["derived"])["memory"]] == [derived_id]
    assert "HB-5521" not in (await http.get(f"/inspect/sessions/{sid}")).text


async def test_a_user_delete_leaves_nothing_of_the_user_in_a_new_session(
    http: httpx.AsyncClient,
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    first = await session(http, user, [{"role": "user", "content": "我的会员号是 VIP-6620。"}])
    await remember(http, first, text="会员号 VIP-6620", source="user_turn", turn_seqs=[1])
    second = await session(http, user, [{"role": "user", "content": "Hello again."}])
    assert "VIP-6620" in await prompt(http, second, "我的会员号是多少？")
    erased = ok(await http.delete(f"/v1/users/{user}"))
    assert {s["session_id"] for s in erased["sessions"]} == {first, second}
    receipts = [await completed(http, s["erase_receipt_id"]) for s in erased["sessions"]]
    assert sum(
        m["count"] for r in receipts for m in kinds(r["derived"]).get("memory", [])
    ) == 1 and all(r["seconds_to_gone"] is not None for r in receipts)
    fresh = await session(http, user, [])
    assert "VIP-6620" not in await prompt(http, fresh, "我的会员号是多少？")
    assert await memories(http, fresh) == []
    assert (await http.get(f"/inspect/sessions/{first}")).status_code == 404
