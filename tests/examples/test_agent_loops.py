"""The example agent loops (examples/python, examples/typescript) run against a live contextd with a
worker and a deterministic OpenAI-compatible model on loopback: a conversation crosses the
watermark, the worker offloads, and a later question is answered through the memory tool."""

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.clients.toolchain import NODE_DIR, REPO, compile_ts, run_node
from tests.examples.fake_model import FILLER, MODEL, chat_model
from tests.support.loopback import LoopbackServer, closed_port_url, loopback_server
from tests.support.server import RunningServer
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

SMALL_WINDOW = {
    "context_limit": 3000,
    "reserve_tokens": 300,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
FIRST = "My booking reference is LY-40917 and the budget is at most 120 EUR."
CHATTER = [f"Step {i}: list the options for day {i} of the trip to Lyon." for i in range(1, 15)]
QUESTION = "Recall: booking reference"

Runner = Callable[[list[str], dict[str, str]], subprocess.CompletedProcess[str]]


def agent_env(
    contextd: RunningServer, api_key: str, model: LoopbackServer, sid: str
) -> dict[str, str]:
    return {
        "CONTEXTD_URL": contextd.url,
        "CONTEXTD_API_KEY": api_key,
        "OPENAI_BASE_URL": f"{model.url}/v1",
        "OPENAI_API_KEY": "sk-fake",
        "MODEL": MODEL,
        "SESSION_ID": sid,
    }


def python_runner(messages: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "python" / "agent_loop.py")],
        input="\n".join(messages) + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def typescript_runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    source = REPO / "examples" / "typescript"
    # the example's own package.json pins what the tests compile it with
    example = json.loads((source / "package.json").read_text())["devDependencies"]
    toolchain = json.loads((NODE_DIR / "package.json").read_text())["devDependencies"]
    assert example == {name: toolchain[name] for name in example}
    work = tmp_path_factory.mktemp("agent-ts")
    for name in ("agent_loop.ts", "tsconfig.json"):
        shutil.copy(source / name, work)
    script = compile_ts(work) / "agent_loop.js"

    def run(messages: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return run_node(script, env=env, stdin="\n".join(messages) + "\n")

    return run


@pytest.fixture(params=["python", "typescript"])
def agent(request: pytest.FixtureRequest) -> Runner:
    if request.param == "python":
        return python_runner
    return request.getfixturevalue("typescript_runner")


async def test_agent_loop_crosses_the_watermark_and_recalls_through_the_memory_tool(
    agent: Runner, contextd: RunningServer, model: LoopbackServer, api_key: str
) -> None:
    sid = "agent-loop"
    env = agent_env(contextd, api_key, model, sid)
    seen = len(model.requests)
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        assert (await http.put(f"/v1/sessions/{sid}", json=SMALL_WINDOW)).status_code == 200

        first = agent([FIRST, *CHATTER], env)
        assert first.returncode == 0, first.stderr
        answers = first.stdout.splitlines()
        assert answers == [f"Noted: {text} {FILLER}" for text in [FIRST, *CHATTER]]

        async def session() -> dict:
            return (await http.get(f"/v1/sessions/{sid}")).json()

        view = await wait_for(
            session,
            lambda v: v["counts"]["chunks"] > 0 and v["last_offload_at"] is not None,
            timeout=30,
            what="the worker to offload the oldest turns",
        )
        assert view["counts"]["turns"] == 2 * (1 + len(CHATTER))
        assert view["watermark"]["ratio"] < 0.8
        turns = (await http.get(f"/v1/sessions/{sid}/turns", params={"limit": 100})).json()
        assert turns["turns"][0]["content"] == FIRST and turns["turns"][0]["chunk_id"] is not None

        second = agent([QUESTION], env)
        assert second.returncode == 0, second.stderr
        [answer] = second.stdout.splitlines()
        assert answer.startswith("From memory: ") and "LY-40917" in answer
        assert "memory recall:" in second.stderr

        since = {"since_seq": 2 * (1 + len(CHATTER))}
        tail = (await http.get(f"/v1/sessions/{sid}/turns", params=since)).json()["turns"]
        assert [t["role"] for t in tail] == ["user", "assistant", "tool", "assistant"]
        user, call, result, final = tail
        assert call["content"] == ""  # a tool-calling turn without text is stored as ""
        assert user["content"] == QUESTION
        [tool_call] = call["tool_calls"]
        assert tool_call["function"]["name"] == "memory"
        assert json.loads(tool_call["function"]["arguments"]) == {
            "type": "recall",
            "query": "booking reference",
        }
        assert result["tool_call_id"] == tool_call["id"] and FIRST in result["content"]
        assert final["content"] == answer

    requests = [body for _, _, body in model.requests[seen:]]
    assert len(requests) == len(CHATTER) + 1 + 2  # one call per message, two for the tool round
    assert all([t["function"]["name"] for t in body["tools"]] == ["memory"] for body in requests)
    assert all(body["messages"][0]["role"] == "system" for body in requests)
    assert requests[0]["messages"][-1] == {"role": "user", "content": FIRST}
    # after the offload the first message is no longer sent verbatim as a turn of the window
    assert {"role": "user", "content": FIRST} not in requests[-2]["messages"]
    # The step after the tool result: the result is the latest turn, what the step's search
    # found (if anything) after it.
    turns = [m for m in requests[-1]["messages"] if m["role"] != "system"]
    assert turns[-1]["role"] == "tool"


async def test_unreachable_servers_are_named(
    agent: Runner, contextd: RunningServer, api_key: str
) -> None:
    nowhere = closed_port_url()
    base = {
        "CONTEXTD_API_KEY": api_key,
        "OPENAI_API_KEY": "sk-fake",
        "MODEL": MODEL,
        "MAX_RETRIES": "1",
        "SESSION_ID": "lost",
    }
    no_contextd = agent(["Hello"], {**base, "CONTEXTD_URL": nowhere, "OPENAI_BASE_URL": nowhere})
    assert no_contextd.returncode == 1
    assert f"cannot reach contextd (CONTEXTD_URL) at {nowhere}" in no_contextd.stderr

    no_model = agent(
        ["Hello"], {**base, "CONTEXTD_URL": contextd.url, "OPENAI_BASE_URL": f"{nowhere}/v1"}
    )
    assert no_model.returncode == 1
    assert f"cannot reach the chat API (OPENAI_BASE_URL) at {nowhere}/v1" in no_model.stderr


async def test_a_model_failure_is_retried_and_the_user_turn_stored_once(
    agent: Runner, contextd: RunningServer, api_key: str
) -> None:
    answer = chat_model(MODEL)
    calls: list[int] = []

    def flaky(method: str, path: str, body: Any) -> tuple[int, Any]:
        calls.append(1)
        if len(calls) == 1:
            return 503, {"error": {"message": "overloaded"}}
        return answer(method, path, body)

    sid = "flaky-model"
    with loopback_server(flaky) as model:
        done = agent(["Hello once"], agent_env(contextd, api_key, model, sid))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"Noted: Hello once {FILLER}"] and len(calls) == 2
    async with httpx.AsyncClient(
        base_url=contextd.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        turns = (await http.get(f"/v1/sessions/{sid}/turns")).json()["turns"]
    assert [(t["role"], t["content"]) for t in turns] == [
        ("user", "Hello once"),
        ("assistant", f"Noted: Hello once {FILLER}"),
    ]
