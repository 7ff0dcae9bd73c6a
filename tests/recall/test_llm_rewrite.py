"""The optional LLM query rewrite against a real loopback chat server (no monkeypatching), and
through the API: its query is what recall searches with, and its failure never fails a build."""

import json
import threading
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from app.recall.llm_rewrite import QueryRewriteUnavailable, llm_rewrite
from tests.prompt.test_recall_needles import offloaded_session, recalled_block
from tests.support.loopback import closed_port_url, loopback_server

QUERY = "what was that order number again?"
RECENT = ["My order number is ORD-58213.", "Noted, I will keep it."]
STANDALONE = "what is the order number ORD-58213"


def reply(content: str | None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def first_recalled(body: dict[str, Any]) -> str:
    """The text of the best recalled item (items are separated by a blank line)."""
    items = recalled_block(body).split("\n\n[")[1:]
    return items[0] if items else ""


async def run(url: str, timeout_s: float = 5.0, query: str = QUERY) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        return await llm_rewrite(client, url, "rewrite-model", "k", query, RECENT, timeout_s)


async def test_good_answer_is_the_rewritten_query() -> None:
    answer = reply(json.dumps({"query": f"  {STANDALONE} "}))
    with loopback_server(lambda m, p, b: (200, answer)) as srv:
        rewritten = await run(srv.url)
    assert rewritten == STANDALONE
    [(method, path, body)] = srv.requests
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert body["model"] == "rewrite-model"
    assert body["temperature"] == 0
    assert body["response_format"] == {"type": "json_object"}
    system, user = body["messages"]
    for rule in ("这个", "刚才", "the one", "exactly as written", "language of the query"):
        assert rule in system["content"]
    assert QUERY in user["content"]
    assert all(turn in user["content"] for turn in RECENT)


@pytest.mark.parametrize(
    ("status", "payload", "message"),
    [
        (200, reply("not json {"), "not valid JSON"),
        (200, reply('["a list"]'), 'string "query"'),
        (200, reply('{"query": 42}'), 'string "query"'),
        (200, reply('{"query": "   "}'), "empty"),
        (200, reply(json.dumps({"query": "x" * (4 * len(QUERY) + 201)})), "more than"),
        (200, {"choices": []}, "has no choices"),
        (200, reply(None), "not a string"),
        (500, {"error": {"message": "boom"}}, "HTTP 500"),
    ],
)
async def test_bad_answers_raise_unavailable(status: int, payload: Any, message: str) -> None:
    with (
        loopback_server(lambda m, p, b: (status, payload)) as srv,
        pytest.raises(QueryRewriteUnavailable, match=message),
    ):
        await run(srv.url)


async def test_closed_port_raises_unavailable() -> None:
    with pytest.raises(QueryRewriteUnavailable, match="failed: ConnectError"):
        await run(closed_port_url())


async def test_slow_server_times_out() -> None:
    release = threading.Event()

    def slow(method: str, path: str, body: Any) -> tuple[int, Any]:
        release.wait(timeout=5)
        return 200, reply(json.dumps({"query": STANDALONE}))

    with loopback_server(slow) as srv:
        # Without a working timeout the server answers a good rewrite after 5 s and this fails.
        with pytest.raises(QueryRewriteUnavailable, match=r"timed out after 0\.2s"):
            await run(srv.url, timeout_s=0.2)
        release.set()


async def test_build_prompt_uses_the_llm_query_and_survives_its_failure(
    settings: Settings, api_key: str
) -> None:
    # The query names nothing and the last turns are small talk: only the LLM knows what it means.
    question = "and what about the thing from way back?"
    standalone = "which colleague will join the trip"
    state = {"status": 200}

    def chat(method: str, path: str, body: Any) -> tuple[int, Any]:
        if state["status"] != 200:
            return state["status"], {"error": "down"}
        return 200, reply(json.dumps({"query": standalone}))

    with loopback_server(chat) as llm:
        own = settings.model_copy(
            update={
                "recall": settings.recall.model_copy(
                    update={"rewrite_llm_base_url": llm.url, "rewrite_llm_timeout_seconds": 5.0}
                )
            }
        )
        async with offloaded_session(own, api_key, "llmrw", seed=6) as http:
            build = {"query": question}
            good = await http.post("/v1/sessions/llmrw/build-prompt", json=build)
            state["status"] = 500
            down = await http.post("/v1/sessions/llmrw/build-prompt", json=build)

    assert good.status_code == 200, good.text
    body = good.json()
    assert body["recall"]["query_rewritten"] == standalone
    assert "Ingrid Halvorsen" in first_recalled(body)
    assert "rewrite_unavailable" not in body["fallbacks"]
    assert "recall_rewrite_llm" in body["timings_ms"]
    chat_bodies = [b for m, p, b in llm.requests if p == "/v1/chat/completions"]
    assert chat_bodies and question in chat_bodies[0]["messages"][1]["content"]

    assert down.status_code == 200, down.text
    degraded = down.json()
    assert "rewrite_unavailable" in degraded["fallbacks"]
    assert "recall_unavailable" not in degraded["fallbacks"]
    assert degraded["recall"]["query_rewritten"] != standalone
    assert "Ingrid Halvorsen" not in first_recalled(degraded)  # the rules alone rank it lower
