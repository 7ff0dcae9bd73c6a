"""The in-process cross-encoder over HTTP (`recall.cross_encoder=minilm`): a question whose
words the small talk around the fact repeats more often than the fact does. The features put
that small talk first; the cross-encoder reads question and turns together and brings the fact
up, in the memory tool's recall and in build-prompt alike. A Chinese question is left to the
features (the model reads English only). These servers search without vectors."""

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack

import httpx
import pytest

from app.core.config import Settings
from tests.support.server import RunningServer, run_server
from tests.support.sessions_http import offloaded_session

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 500,
    "min_recent_turns": 2,
    "min_recent_tokens": 100,
}
FACT = "user: Before we book dinner: I am allergic to peanuts, so no satay for me."
SMALL_TALK = (
    (
        "I keep reading about allergic reactions. Are allergic people more allergic in spring?",
        "Seasonal allergic rhinitis peaks in spring for many allergic people.",
    ),
    (
        "What do allergic travellers pack? My allergic friend always asks.",
        "Allergic travellers often pack antihistamines and an allergy card for allergic "
        "emergencies.",
    ),
    (
        "Are hotels good with allergic guests? Allergic guests worry about pillows.",
        "Many hotels offer hypoallergenic pillows for allergic guests on request.",
    ),
)
QUESTION = "What am I allergic to?"


def conversation() -> list[dict[str, str]]:
    turns = [
        {"role": "user", "content": FACT.removeprefix("user: ")},
        {"role": "assistant", "content": "Noted: no peanuts anywhere."},
    ]
    for n in range(4):
        for user, assistant in SMALL_TALK:
            turns += [
                {"role": "user", "content": f"{user} (question {n + 1})"},
                {"role": "assistant", "content": assistant},
            ]
    turns += [
        {"role": "user", "content": "Thanks, that is all for now."},
        {"role": "assistant", "content": "Enjoy your trip!"},
    ]
    return turns


@pytest.fixture(scope="module")
def servers(settings: Settings) -> Iterator[dict[str, RunningServer]]:
    """The API as configured by default (`off`) and with the cross-encoder on (`minilm`)."""
    running: dict[str, RunningServer] = {}
    with ExitStack() as stack:
        for kind in ("off", "minilm"):
            recall = settings.recall.model_copy(update={"cross_encoder": kind})
            own = settings.model_copy(update={"recall": recall})
            running[kind] = stack.enter_context(run_server(own))
        yield running


@pytest.fixture
async def clients(
    servers: dict[str, RunningServer], admin_key: str
) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    headers = {"Authorization": f"Bearer {admin_key}"}
    async with (
        httpx.AsyncClient(base_url=servers["off"].url, headers=headers, timeout=60) as off,
        httpx.AsyncClient(base_url=servers["minilm"].url, headers=headers, timeout=60) as on,
    ):
        yield {"off": off, "minilm": on}


async def places(http: httpx.AsyncClient, sid: str, question: str) -> tuple[int, int]:
    """Where the chunk of the first turns (the fact's) stands in the memory tool's recall and
    in build-prompt's recalled items (0: first)."""
    body = {"type": "recall", "query": question, "top_k": 6}
    resp = await http.post(f"/v1/sessions/{sid}/memory", json=body)
    assert resp.status_code == 200, resp.text
    tool = [m["turn_first"] == 1 for m in resp.json()["data"]["matches"]]
    built = await http.post(
        f"/v1/sessions/{sid}/build-prompt",
        json={"query": question, "recall": {"mode": "always", "top_k": 6}},
    )
    assert built.status_code == 200, built.text
    assert "cross_encoder_unavailable" not in built.json()["fallbacks"]
    prompt = [i["turn_range"][0] == 1 for i in built.json()["recall"]["items"]]
    return tool.index(True), prompt.index(True)


async def test_the_cross_encoder_brings_the_fact_up_in_both_paths(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    for kind, http in clients.items():
        await offloaded_session(http, f"allergy-{kind}", SMALL, conversation())
    off = await places(clients["off"], "allergy-off", QUESTION)
    on = await places(clients["minilm"], "allergy-minilm", QUESTION)
    # The features rank the fact's chunk last of six (the small talk says "allergic" more
    # often); the cross-encoder reads it first and lifts it (its order fused with the
    # features', `cross_encoded`), in both paths.
    assert off == (5, 5)
    assert on[0] < off[0] and on[1] < off[1], on


async def test_a_chinese_question_is_left_to_the_features(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    orders = {}
    for kind, http in clients.items():
        sid = f"allergy-zh-{kind}"
        await offloaded_session(http, sid, SMALL, conversation())
        body = {"query": "我对什么过敏？ allergic", "recall": {"mode": "always", "top_k": 6}}
        resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
        assert resp.status_code == 200, resp.text
        orders[kind] = [(i["turn_range"], i["score"]) for i in resp.json()["recall"]["items"]]
    assert len(orders["off"]) >= 3
    assert orders["minilm"] == orders["off"]
