"""Confident or silent by meaning, over HTTP with e5 (and USE for the floor): a fact told in
English is quoted for a question asked in Chinese, and the reverse, and a question about the
user asked in other words than the fact's ("What is my job?" for "I work as a pharmacist"), with
the relevance floor on; a question nothing stored answers, asked in the other script or about
the user in the same one, still gets no confident match. Before the floor judged items by
meaning, every such question got "no confident match" (the question and the fact share no
word, and e5 puts them no closer than small talk): docs/BENCHMARKS.md, "Confident or silent".
A remembered item beside the chunks is a match only for a question it answers."""

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from tests.support.server import RunningServer, run_server
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 500,
    "min_recent_turns": 4,
    "min_recent_tokens": 200,
}
FLOOR = 0.25
# Four facts of the cross-language set, each told in English and in Chinese, with a question
# for it in each language.
FACTS = [
    fact
    for fact in json.loads(
        (Path(__file__).resolve().parent / "crosslang_set.json").read_text(encoding="utf-8")
    )
    if fact["fact_en"].startswith(("My cat", "I wear size", "My blood", "Our wedding"))
]
# Facts asked for in their own language in other words: no word of the question in the fact.
PARAPHRASED = {
    "en": ("I work as a pharmacist at a hospital in Leeds.", "What is my job?"),
    "zh": ("我西班牙语说得很流利，也会一点日语。", "我会说哪些语言？"),
}
SMALL_TALK = {
    "en": ("It's raining again here.", "Sorry to hear that; a good day for indoor plans then."),
    "zh": ("这边又下雨了。", "那今天适合在家里安排点事情。"),
}
TAIL_EXCHANGES = 12
ACK = {"en": "Noted, I'll keep that in mind.", "zh": "好的，我记下了。"}
NO_ANSWER = {
    "en": "水银的沸点是多少开尔文？",
    "zh": "What is the boiling point of mercury in kelvin?",
}
# About the user, in the facts' own language, and nothing stored answers it.
NO_ANSWER_ABOUT_THE_USER = {
    "en": "What is my company's quarterly revenue target?",
    "zh": "我们公司这个季度的营收目标是多少？",
}


@pytest.fixture(scope="module", params=[True, False], ids=["vectors-kept", "vectors-read"])
def e5_floor_server(settings: Settings, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The API and its worker with e5 embeddings and the relevance floor on; the chunks'
    vectors kept in process for the vector arm's scan, or not (the floor then reads them)."""
    recall = {"relevance_floor": FLOOR}
    if not request.param:
        recall["vector_scan_in_process_mb"] = 0
    own = settings.model_copy(
        update={
            "embedding": settings.embedding.model_copy(update={"kind": "e5"}),
            "recall": settings.recall.model_copy(update=recall),
        }
    )
    with run_server(own, with_worker=True) as server:
        yield server


@pytest.fixture
async def admin(e5_floor_server: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=e5_floor_server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60
    ) as http:
        yield http


async def facts_session(http: httpx.AsyncClient, sid: str, lang: str) -> None:
    """The facts in `lang`, each with an acknowledgement and small talk, offloaded and embedded."""
    turns: list[dict[str, str]] = []
    for fact in [*(f[f"fact_{lang}"] for f in FACTS), PARAPHRASED[lang][0]]:
        user, assistant = SMALL_TALK[lang]
        for role, text in (
            ("user", fact),
            ("assistant", ACK[lang]),
            ("user", user),
            ("assistant", assistant),
        ):
            turns.append({"role": role, "content": text})
    # Small talk after the last fact: the window's floors hold it, not a fact.
    turns += [
        {"role": role, "content": text}
        for _ in range(TAIL_EXCHANGES)
        for role, text in zip(("user", "assistant"), SMALL_TALK[lang], strict=True)
    ]
    assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})
    assert resp.status_code == 201, resp.text
    resp = await http.post(
        f"/v1/sessions/{sid}/memory", json={"type": "offload", "until_tokens": 0}
    )
    assert resp.status_code == 200, resp.text

    async def chunks() -> list[dict[str, Any]]:
        resp = await http.get(f"/v1/sessions/{sid}/chunks", params={"limit": 500})
        found: list[dict[str, Any]] = resp.json()["chunks"]
        return found

    await wait_for(
        chunks,
        lambda found: bool(found) and all(c["embedded"] for c in found),
        timeout=300,
        what="the facts' chunks embedded",
    )


async def recall(http: httpx.AsyncClient, sid: str, query: str) -> dict[str, Any]:
    body = {"type": "recall", "query": query, "top_k": 5}
    resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()["data"]
    return data


@pytest.mark.parametrize("fact_lang", ["en", "zh"])
async def test_a_fact_in_other_words_is_quoted_above_the_floor(
    admin: httpx.AsyncClient, fact_lang: str
) -> None:
    sid = f"cross-script-{fact_lang}-{uuid.uuid4().hex[:8]}"  # one database for both servers
    await facts_session(admin, sid, fact_lang)
    assert len(FACTS) == 4
    for fact in FACTS:
        question = fact["question_zh" if fact_lang == "en" else "question_en"]
        data = await recall(admin, sid, question)
        assert "no_match" not in data, (question, data.get("nearest"))
        assert data["floor"] == FLOOR
        holding = [m for m in data["matches"] if fact[f"fact_{fact_lang}"] in m["text"]]
        assert holding, (question, data["matches"])
        assert holding[0]["relevance"] >= FLOOR, (question, holding[0])
    fact, question = PARAPHRASED[fact_lang]
    data = await recall(admin, sid, question)
    assert "no_match" not in data, (question, {k: v for k, v in data.items() if k != "matches"})
    holding = [m for m in data["matches"] if fact in m["text"]]
    assert holding and holding[0]["relevance"] >= FLOOR, (question, data["matches"])
    for question in (NO_ANSWER[fact_lang], NO_ANSWER_ABOUT_THE_USER[fact_lang]):
        data = await recall(admin, sid, question)
        assert data["matches"] == [], (question, data["matches"])
        assert data["no_match"] == "nothing_relevant", (
            question,
            {k: v for k, v in data.items() if k != "matches"},
        )
        assert data["nearest"]["relevance"] < FLOOR


async def test_a_remembered_item_beside_chunks_is_a_match_only_for_what_it_says(
    admin: httpx.AsyncClient,
) -> None:
    """The remembered items' vector arm searches with the question's own vector, the chunks'
    with the query adapter's, whose cosines run lower: measured from the median of both arms
    together, a remembered item stood out for every question and was quoted as its match."""
    sid = f"remembered-beside-chunks-{uuid.uuid4().hex[:8]}"
    await facts_session(admin, sid, "en")
    kept = "Invoices by email only, never paper"
    resp = await admin.post(f"/v1/sessions/{sid}/memory", json={"type": "remember", "text": kept})
    assert resp.status_code == 200, resp.text

    async def memories() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await admin.get(f"/v1/sessions/{sid}/memories")).json()[
            "memories"
        ]
        return found

    await wait_for(
        memories, lambda found: all(m["embedded"] for m in found), what="the item embedded"
    )
    for question in ("When does my passport expire?", NO_ANSWER_ABOUT_THE_USER["en"]):
        data = await recall(admin, sid, question)
        assert [m["text"] for m in data["matches"] if kept in m["text"]] == [], question
    data = await recall(admin, sid, "How should the invoices be sent?")
    assert [m["text"] for m in data["matches"] if "memory_id" in m] == [kept]
