"""The OpenAI Agents SDK integration (integrations/openai_agents), installed as a package and run
with the real SDK: `Runner.run` turns against a live contextd with a worker and a deterministic
OpenAI-compatible model on loopback, past the watermark, then a question answered from offloaded
history through the memory tool; recall keyed on the question being answered (the prompt is built
at the model call, `session.run_config()`); pop_item and clear_session on the server."""

import importlib
import json
import site
import subprocess
import sys
import sysconfig
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
from openai import AsyncOpenAI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.errors import InvalidSessionId
from tests.examples.fake_model import FILLER, MODEL, chat_model
from tests.examples.test_agent_loops import CHATTER, FIRST, QUESTION, SMALL_WINDOW
from tests.prompt.test_recall_needles import recalled_block
from tests.sessions.test_bad_input import tenant_rows
from tests.support.hostile import HOSTILE_STRINGS
from tests.support.loopback import LoopbackServer, serving
from tests.support.server import RunningServer
from tests.support.waiting import wait_for

OWN_DATABASE = True  # runs a worker

PACKAGE = Path(__file__).resolve().parents[2] / "integrations" / "openai_agents"
NO_TRACES = {"tracing_disabled": True}  # offline: the SDK exports no traces


@pytest.fixture(scope="module")
def contextd_agents() -> Any:
    """The integration as users get it: `pip install integrations/openai_agents` (editable, so
    the installed package is this checkout's)."""
    found = importlib.util.find_spec("contextd_agents")
    if found is None or not str(found.origin).startswith(str(PACKAGE)):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(PACKAGE)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        site.addsitedir(sysconfig.get_paths()["purelib"])  # load the new install's .pth hook
        importlib.invalidate_caches()
    return importlib.import_module("contextd_agents")


@pytest.fixture
async def http(contextd: RunningServer, admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    ) as client:
        yield client


async def test_runner_across_the_watermark_answers_from_offloaded_history(
    contextd_agents: Any,
    contextd: RunningServer,
    model: LoopbackServer,
    admin_key: str,
    http: httpx.AsyncClient,
) -> None:
    sid = "agents-sdk"
    assert (await http.put(f"/v1/sessions/{sid}", json=SMALL_WINDOW)).status_code == 200
    session = contextd_agents.ContextdSession(sid, contextd.url, admin_key, system="Be brief.")
    chat = AsyncOpenAI(base_url=f"{model.url}/v1", api_key="sk-fake", max_retries=0)
    agent = Agent(
        name="travel",
        instructions="Be brief.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=chat),
        tools=[await contextd_agents.memory_tool(session)],
    )
    seen = len(model.requests)
    runs = session.run_config(**NO_TRACES)
    state = await run_past_the_watermark(agent, session, runs, http)
    assert state["counts"]["turns"] == 2 * (1 + len(CHATTER))
    await assert_first_offloaded(http, sid)

    answer = await Runner.run(agent, QUESTION, session=session, run_config=runs)
    assert answer.final_output.startswith("From memory: ") and "LY-40917" in answer.final_output

    requests = [body for _, _, body in model.requests[seen:]]
    assert len(requests) == len(CHATTER) + 1 + 2  # one call per message, two for the tool round
    assert all([t["function"]["name"] for t in body["tools"]] == ["memory"] for body in requests)
    # each model call got the budgeted context: after the offload the first message is no longer
    # sent as a turn of the window, and the recalled history arrives as quoted data
    assert {"role": "user", "content": FIRST} not in requests[-2]["messages"]
    assert requests[-2]["messages"][-1] == {"role": "user", "content": QUESTION}
    tool_round = requests[-1]["messages"]
    assert tool_round[-1]["role"] == "tool" and FIRST in tool_round[-1]["content"]

    stored = (
        await http.get(f"/v1/sessions/{sid}/turns", params={"since_seq": state["counts"]["turns"]})
    ).json()["turns"]
    assert [t["role"] for t in stored] == ["user", "assistant", "tool", "assistant"]
    call = stored[1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {
        "type": "recall",
        "query": "booking reference",
    }
    assert stored[2]["tool_call_id"] == call["id"]
    assert stored[3]["content"] == answer.final_output

    tail = await session.get_items(limit=2)
    assert tail[0]["type"] == "function_call_output" and tail[1]["role"] == "assistant"
    popped = await session.pop_item()
    assert popped == tail[1]
    assert (await session.get_items(limit=1)) == [tail[0]]

    await session.clear_session()
    assert (await http.get(f"/v1/sessions/{sid}")).status_code == 404
    assert await session.get_items() == []
    await session.aclose()


async def run_past_the_watermark(
    agent: Agent[Any], session: Any, runs: RunConfig, http: httpx.AsyncClient
) -> dict[str, Any]:
    """FIRST then the chatter, one run each, until the worker has offloaded the oldest turns."""
    for text in [FIRST, *CHATTER]:
        result = await Runner.run(agent, text, session=session, run_config=runs)
        assert result.final_output == f"Noted: {text} {FILLER}"

    async def view() -> dict[str, Any]:
        return (await http.get(f"/v1/sessions/{session.session_id}")).json()

    return await wait_for(
        view,
        lambda v: v["counts"]["chunks"] > 0 and v["last_offload_at"] is not None,
        timeout=60,
        what="the worker to offload the oldest turns",
    )


async def assert_first_offloaded(http: httpx.AsyncClient, sid: str) -> None:
    first = (await http.get(f"/v1/sessions/{sid}/turns", params={"limit": 1})).json()["turns"][0]
    assert first["content"] == FIRST and first["chunk_id"] is not None


@pytest.fixture
def streaming_model() -> Iterator[LoopbackServer]:
    """The deterministic model of `tests/examples/fake_model.py`, which also answers a request
    with `"stream": true` as server-sent events (its text reply in one delta)."""
    record = LoopbackServer(url="")
    answer = chat_model(MODEL)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            record.requests.append(("POST", self.path, body))
            status, payload = answer("POST", self.path, body)
            if status == 200 and body.get("stream"):
                message = payload["choices"][0]["message"]
                deltas = [
                    ({"role": "assistant", "content": message["content"]}, None),
                    ({}, payload["choices"][0]["finish_reason"]),
                ]
                events = [
                    {
                        "id": payload["id"],
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": payload["model"],
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    }
                    for delta, finish in deltas
                ]
                data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                self._send(status, "text/event-stream", data.encode())
            else:
                self._send(status, "application/json", json.dumps(payload).encode())

        def _send(self, status: int, kind: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        record.url = url
        yield record


async def test_recall_is_keyed_on_the_question_being_answered(
    contextd_agents: Any,
    contextd: RunningServer,
    streaming_model: LoopbackServer,
    admin_key: str,
    http: httpx.AsyncClient,
) -> None:
    """The SDK reads a session before it stores the new input; built at the model call, the
    prompt recalls for the question itself: a fact only this question names (the booking
    reference, said in the first turn and offloaded since) is in the recalled block. One recalled
    item, so the chatter turn before each question cannot bring it back by chance. A streamed run
    stores its input after its first model call's filter: the question is the build's query then,
    and it is stored once."""
    sid = "agents-sdk-recall"
    config = {**SMALL_WINDOW, "recall_top_k": 1}
    assert (await http.put(f"/v1/sessions/{sid}", json=config)).status_code == 200
    session = contextd_agents.ContextdSession(sid, contextd.url, admin_key, system="Be brief.")
    chat = AsyncOpenAI(base_url=f"{streaming_model.url}/v1", api_key="sk-fake", max_retries=0)
    agent = Agent(
        name="travel",
        instructions="Be brief.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=chat),
    )
    runs = session.run_config(**NO_TRACES)
    await run_past_the_watermark(agent, session, runs, http)
    await assert_first_offloaded(http, sid)

    async def ask(question: str, streamed: bool) -> dict[str, Any]:
        seen = len(streaming_model.requests)
        if streamed:
            result = Runner.run_streamed(agent, question, session=session, run_config=runs)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, question, session=session, run_config=runs)
        assert result.final_output == f"Noted: {question} {FILLER}"
        [(_, _, body)] = streaming_model.requests[seen:]
        assert body.get("stream", False) is streamed
        assert body["messages"][-1] == {"role": "user", "content": question}
        stored = (await http.get(f"/v1/sessions/{sid}/turns", params={"limit": 500})).json()
        assert [t["content"] for t in stored["turns"]][-2:] == [question, result.final_output]
        return dict(body)

    for question, streamed in [
        ("What was the budget for booking LY-40917?", False),
        ("Remind me: which budget goes with LY-40917?", True),
    ]:
        chatter = "Step 15: list the options for day 15 of the trip to Lyon."
        await Runner.run(agent, chatter, session=session, run_config=runs)
        block = recalled_block(await ask(question, streamed))
        assert "LY-40917" in block and "at most 120 EUR" in block, (streamed, block)
    await session.aclose()


async def test_add_items_retried_after_a_lost_answer_stores_once(
    contextd_agents: Any, contextd: RunningServer, admin_key: str, http: httpx.AsyncClient
) -> None:
    """The first attempt reaches contextd but its answer is lost (a 502 from a proxy, say): the
    retry carries the same Idempotency-Key and stores nothing twice."""
    calls: list[str] = []

    async def lossy(request: httpx.Request) -> httpx.Response:
        async with httpx.AsyncClient(base_url=contextd.url, timeout=30) as real:
            forwarded = await real.send(
                real.build_request(
                    request.method,
                    request.url.raw_path.decode(),
                    headers=request.headers,
                    content=request.content,
                )
            )
        calls.append(request.headers.get("Idempotency-Key", ""))
        if len(calls) == 1:
            return httpx.Response(502, text="bad gateway")
        return forwarded

    client = httpx.AsyncClient(
        base_url=contextd.url,
        headers={"Authorization": f"Bearer {admin_key}"},
        transport=httpx.MockTransport(lossy),
    )
    session = contextd_agents.ContextdSession("agents-retry", client=client)
    await session.add_items([{"role": "user", "content": "Only once, please."}])
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0].startswith("agents-")
    turns = (await http.get("/v1/sessions/agents-retry/turns")).json()["turns"]
    assert [t["content"] for t in turns] == ["Only once, please."]
    await session.aclose()


async def test_hostile_session_ids_are_refused_by_the_server_rule(
    contextd_agents: Any, http: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    for label, session_id in HOSTILE_STRINGS.items():
        session = contextd_agents.ContextdSession(session_id, client=http)
        for call in (
            session.add_items([{"role": "user", "content": "hi"}]),
            session.get_items(),
            session.clear_session(),
        ):
            with pytest.raises(contextd_agents.ContextdError) as refused:
                await call
            # an id with "/" too: the client sends it encoded as one segment
            assert "HTTP 422" in str(refused.value), label
            assert InvalidSessionId.RULE in str(refused.value), label
    assert await tenant_rows(engine, tenant_name) == (0, 0)
