"""An agent reads forty files through a `read_file` tool, far past its window; then the user asks
for one constant of one file, or the agent's loop builds again with no query right after a call
for it. The turn that holds the constant must come back in the recalled block, in English and in
Chinese, through the HTTP API with a worker offloading the oldest turns."""

import json
import random
from typing import Any

import httpx
import pytest

from tests.prompt.test_recall_needles import recalled_block
from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py

SMALL = {
    "context_limit": 3000,
    "reserve_tokens": 300,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
FILES = 40
ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"


def secret(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(6))


def module_source(i: int, rng: random.Random, language: str) -> str:
    """A plausible module of the billing package: a few constants (SECRET_CONST_1 to 4 in every
    module, each with its own values) and a function using them; comments in `language`."""
    comment = {
        "en": ("# Settings of the billing step {i}.", "# Retry the charge before giving up."),
        "zh": ("# 第{i}个计费步骤的配置。", "# 扣款失败时先重试，再放弃。"),
    }[language]
    return "\n".join(
        [
            comment[0].format(i=i),
            "from decimal import Decimal",
            "",
            *(f'SECRET_CONST_{j} = "{secret(rng)}"' for j in range(1, 5)),
            f"RETRY_LIMIT = {rng.randint(2, 9)}",
            f'CURRENCY = "{rng.choice(["EUR", "USD", "CNY"])}"',
            f'FEE_RATE = Decimal("0.0{rng.randint(10, 99)}")',
            "",
            "",
            f"def charge_step_{i}(amount: Decimal, client: BillingClient) -> Receipt:",
            f"    {comment[1]}",
            "    for attempt in range(RETRY_LIMIT):",
            "        receipt = client.charge(amount * (1 + FEE_RATE), CURRENCY, SECRET_CONST_3)",
            "        if receipt.ok:",
            "            return receipt",
            '    raise ChargeFailed(f"gave up after {RETRY_LIMIT} attempts")',
        ]
    )


def tool_session(language: str, seed: int) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The turns of the agent's session and each file's secret value."""
    rng = random.Random(seed)
    ask = {
        "en": "Please review the billing package for hard-coded secrets, file by file.",
        "zh": "请逐个文件检查 billing 包里有没有硬编码的密钥。",
    }[language]
    turns: list[dict[str, Any]] = [{"role": "user", "content": ask}]
    secrets: dict[int, str] = {}
    for i in range(1, FILES + 1):
        source = module_source(i, rng, language)
        secrets[i] = source.split('SECRET_CONST_3 = "', 1)[1].split('"')[0]
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": path(i)})},
        }
        turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        turns.append({"role": "tool", "tool_call_id": f"call_{i}", "content": source})
    return turns, secrets


def path(i: int) -> str:
    return f"billing/mod{i}.py"


async def load(http: httpx.AsyncClient, sid: str, turns: list[dict[str, Any]]) -> None:
    assert (await http.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    for start in range(0, len(turns), 6):
        batch = {"turns": turns[start : start + 6]}
        resp = await http.post(f"/v1/sessions/{sid}/turns", json=batch)
        assert resp.status_code == 201, resp.text


async def offloaded(http: httpx.AsyncClient, sid: str) -> None:
    """Wait until the file of SECRET_CONST_3 is in a chunk and every chunk is embedded."""

    async def probe() -> dict[str, Any]:
        turns = (await http.get(f"/v1/sessions/{sid}/turns", params={"limit": 10})).json()
        chunks = (await http.get(f"/v1/sessions/{sid}/chunks", params={"limit": 500})).json()
        return {"turns": turns["turns"], "chunks": chunks["chunks"]}

    def ready(state: dict[str, Any]) -> bool:
        return bool(
            all(t["chunk_id"] for t in state["turns"][:8])
            and state["chunks"]
            and all(c["embedded"] for c in state["chunks"])
        )

    await wait_for(probe, ready, timeout=180, interval=0.2, what=f"{sid} to be offloaded")


QUESTIONS = {
    "en": "What is the value of SECRET_CONST_3 in billing/mod3.py?",
    "zh": "billing/mod3.py 里 SECRET_CONST_3 的值是多少？",
}


@pytest.mark.parametrize("language", ["en", "zh"])
async def test_a_constant_read_forty_tool_calls_ago_comes_back(
    e5_client: httpx.AsyncClient, language: str
) -> None:
    sid = f"tool-loop-{language}"
    turns, secrets = tool_session(language, seed=len(language))
    await load(e5_client, sid, turns)
    await offloaded(e5_client, sid)
    question = QUESTIONS[language]
    resp = await e5_client.post(f"/v1/sessions/{sid}/build-prompt", json={"query": question})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    block = recalled_block(body)
    assert f'SECRET_CONST_3 = "{secrets[3]}"' in block, block
    assert body["usage"]["total"] <= body["usage"]["limit"]


@pytest.mark.parametrize("language", ["en", "zh"])
async def test_the_agent_loop_recalls_what_its_latest_call_asks_for(
    e5_client: httpx.AsyncClient, language: str
) -> None:
    """No query: the user's last turn asks about a constant, the agent calls a tool with the
    file's path, the result names the constant; the build before the next model call recalls
    the file read long ago."""
    sid = f"tool-loop-noquery-{language}"
    turns, secrets = tool_session(language, seed=10 + len(language))
    ask = {
        "en": "Which value does the charge step use as its key?",
        "zh": "扣款步骤用的密钥值是什么？",
    }[language]
    grep = {
        "id": "call_grep",
        "type": "function",
        "function": {
            "name": "grep",
            "arguments": json.dumps({"pattern": "SECRET_CONST_3", "path": "billing/mod3.py"}),
        },
    }
    turns += [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": None, "tool_calls": [grep]},
        {
            "role": "tool",
            "tool_call_id": "call_grep",
            "content": "billing/mod3.py:13: receipt = client.charge(..., SECRET_CONST_3)",
        },
    ]
    await load(e5_client, sid, turns)
    await offloaded(e5_client, sid)
    resp = await e5_client.post(f"/v1/sessions/{sid}/build-prompt", json={})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    block = recalled_block(body)
    assert f'SECRET_CONST_3 = "{secrets[3]}"' in block, block
