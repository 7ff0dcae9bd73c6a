"""Huge tool results through the HTTP API: a log or a JSON of megabytes, English or Chinese, is
accepted, layered on arrival (head, tail and values in the window, the whole text in C3), and
every later prompt stays within its limit with its calls and results paired; what the window
does not show is one `memory recall` away. Bad input: over the tool-result cap 413 naming the
field, malformed call arguments stored as sent, and nothing half-written."""

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from app.eval.agent import validity_problems
from app.notes.layering import LAYERED_PREFIX
from tests.support.server import RunningServer, run_server

SYSTEM = "You are an operations agent. Read logs and orders with the tools."
SMALL_CAP = 65_536  # the small server's tool-result cap, bytes
# Chunking a few MB of text takes seconds, more on a busy machine: a generous client wait.
APPEND_TIMEOUT = 180


def english_log(lines: int) -> str:
    rows = [
        f"2026-12-06T03:{i // 60 % 60:02d}:{i % 60:02d}Z INFO worker-{i % 7} handled "
        f"request_id=req{i:07d} path=/api/v1/items/{i} status=200 took {i * 37 % 900}ms"
        for i in range(lines)
    ]
    rows[lines // 2] += " order_id=ORD-7H2K9QX confirmed"
    return "\n".join(rows)


def chinese_log(lines: int) -> str:
    rows = [
        f"2026-12-06 03:{i // 60 % 60:02d}:{i % 60:02d} 信息 仓库上海 处理订单 订单号：DD{i:08d}，"
        f"状态：已发货，备注：客户要求周末送达，包装完好无损"
        for i in range(lines)
    ]
    rows[lines // 2] += "，退款单号：TK88231X"
    return "\n".join(rows)


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def append(client: httpx.AsyncClient, sid: str, turns: list[dict[str, Any]]) -> Any:
    body = json.dumps({"turns": turns}, ensure_ascii=False).encode()
    return await client.post(
        f"/v1/sessions/{sid}/turns",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=APPEND_TIMEOUT,
    )


async def build(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    built = await client.post(
        f"/v1/sessions/{sid}/build-prompt", json={"system": SYSTEM, "format": "openai"}
    )
    assert built.status_code == 200, built.text
    body: dict[str, Any] = built.json()
    assert validity_problems(body["messages"]) == []
    assert body["usage"]["total"] <= body["usage"]["limit"]
    return body


async def recall(client: httpx.AsyncClient, sid: str, query: str) -> list[dict[str, Any]]:
    answer = await client.post(
        f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query}
    )
    assert answer.status_code == 200, answer.text
    matches: list[dict[str, Any]] = answer.json()["data"]["matches"]
    return matches


async def forget(client: httpx.AsyncClient, sid: str) -> None:
    """Delete the session: its thousands of pieces are not left for later tests (a re-embed of
    the whole database) to embed."""
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 202


async def layered_round(
    client: httpx.AsyncClient, sid: str, tool: str, text: str, view_limit: int
) -> tuple[dict[str, Any], str]:
    """A user turn, a call and its huge result appended; returns the build and the view."""
    turns = [
        {"role": "user", "content": "Find what happened to the order, please."},
        call("call_0", tool, json.dumps({"path": "/var/log/app.log"})),
        result("call_0", text),
    ]
    appended = await append(client, sid, turns)
    assert appended.status_code == 201, appended.text
    stored = appended.json()["turns"]
    assert stored[2]["token_count"] <= view_limit + 20  # the view, framing included
    body = await build(client, sid)
    # Nothing is offloaded: the result's chunks belong to a turn in the window, no recall runs.
    assert body["recall"]["skipped_reason"] == "no_history"
    tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0"]
    view: str = tool_messages[0]["content"]
    assert view.startswith(LAYERED_PREFIX)
    assert f"{len(text.encode()):,} bytes" in view
    first_line, last_line = text.split("\n", 1)[0], text.rsplit("\n", 1)[1]
    assert first_line in view and last_line in view  # head and tail
    listed = await client.get(f"/v1/sessions/{sid}/turns")
    assert listed.json()["turns"][2]["content"] == view
    assert listed.json()["turns"][2]["chunk_id"] is None  # in the window, as its view
    return body, view


async def test_a_2mb_log_is_layered_and_its_middle_is_one_recall_away(
    client: httpx.AsyncClient, server: RunningServer
) -> None:
    sid = "huge-log"
    text = english_log(19_000)
    assert len(text.encode()) > 2_000_000
    body, view = await layered_round(
        client, sid, "read_log", text, server.settings.limits.layered_view_tokens
    )
    assert "order_id: ORD-7H2K9QX" in view  # a value from the middle, with its field
    assert "ORD-7H2K9QX" in "\n".join(m["content"] or "" for m in body["messages"])

    chunk_id = view.split(" chunk ", 1)[1].split(",", 1)[0]
    chunk = (await client.get(f"/v1/sessions/{sid}/chunks/{chunk_id}")).json()
    assert (chunk["turn_first"], chunk["turn_last"], chunk["part"]) == (3, 3, 1)
    assert chunk["trust"] == "untrusted"
    assert text.split("\n", 1)[0] in chunk["raw_text"]
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert session["counts"]["chunks"] == chunk["parts"] > 1000
    assert session["usage"]["c1"] < 3_000  # the view counts, not the 2 MB

    middle = "req0009123"
    assert middle not in view
    matches = await recall(client, sid, middle)
    assert matches and middle in matches[0]["text"]
    assert matches[0]["turn_first"] == 3
    await forget(client, sid)


async def test_a_1mb_json_result_shows_a_value_from_deep_inside(
    client: httpx.AsyncClient, server: RunningServer
) -> None:
    sid = "huge-json"
    items = [{"sku": f"SKU{i:06d}", "qty": i % 9, "warehouse": "LYS-2"} for i in range(9_000)]
    order = {"order": {"order_id": "ORD-DEEP-42", "total": "1234.50 EUR", "state": "held"}}
    data = {"before": items, "result": {"detail": {"inner": order}}, "after": items}
    text = json.dumps(data, indent=1)
    assert len(text.encode()) > 1_000_000
    _body, view = await layered_round(
        client, sid, "get_orders", text, server.settings.limits.layered_view_tokens
    )
    assert "order_id: ORD-DEEP-42" in view and "state: held" in view
    assert "head:\n{" in view

    matches = await recall(client, sid, "SKU004321")
    assert matches and "SKU004321" in matches[0]["text"]
    await forget(client, sid)


async def test_a_chinese_log_of_several_mb_is_layered(
    client: httpx.AsyncClient, server: RunningServer
) -> None:
    sid = "huge-chinese-log"
    text = chinese_log(14_000)
    assert len(text.encode()) > 2_000_000
    _body, view = await layered_round(
        client, sid, "read_log", text, server.settings.limits.layered_view_tokens
    )
    assert "退款单号: TK88231X" in view
    assert "\ufffd" not in view
    matches = await recall(client, sid, "DD00012345")
    assert matches and "DD00012345" in matches[0]["text"]
    await forget(client, sid)


@pytest.fixture(scope="module")
def small(settings: Settings) -> Iterator[RunningServer]:
    """A server whose tool results are capped at 64 KiB and layered above 2,000 tokens."""
    limits = settings.limits.model_copy(
        update={
            "max_tool_result_bytes": SMALL_CAP,
            "layer_tool_result_tokens": 2_000,
            "layered_view_tokens": 600,
        }
    )
    with run_server(settings.model_copy(update={"limits": limits})) as running:
        yield running


@pytest.fixture
async def small_client(small: RunningServer, api_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=small.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as http:
        yield http


async def test_a_result_over_the_cap_is_refused_naming_the_field_and_nothing_is_written(
    small_client: httpx.AsyncClient,
) -> None:
    sid = "huge-over-cap"
    text = english_log(1_000)
    assert len(text.encode()) > SMALL_CAP
    refused = await append(
        small_client, sid, [call("call_0", "read_log", "{}"), result("call_0", text)]
    )
    assert refused.status_code == 413
    error = refused.json()["error"]
    assert error["field"] == "turns[1].content"
    assert "limits.max_tool_result_bytes" in error["message"]
    # Above the turn limit (256 KiB by default) but within the cap: accepted and layered.
    within = english_log(400)
    assert 2_000 < len(within.encode()) <= SMALL_CAP
    accepted = await append(
        small_client, sid, [call("call_0", "read_log", "{}"), result("call_0", within)]
    )
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["turns"][1]["token_count"] <= 620


async def test_a_failed_append_leaves_no_chunk_of_its_huge_result(
    small_client: httpx.AsyncClient,
) -> None:
    sid = "huge-all-or-nothing"
    text = english_log(400)
    turns = [call("call_0", "read_log", "{}"), result("call_0", text), result("call_9", "{}")]
    refused = await append(small_client, sid, turns)
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "turns[2].tool_call_id"
    # The session, created by this append, is gone with its turns and chunks.
    assert (await small_client.get(f"/v1/sessions/{sid}")).status_code == 404
    assert (await small_client.get(f"/v1/sessions/{sid}/chunks")).status_code == 404


async def test_malformed_arguments_and_text_results_are_stored_as_sent(
    small_client: httpx.AsyncClient,
) -> None:
    sid = "huge-malformed"
    malformed = '{"path": "/var/log/app.log", "lines": '
    text = chinese_log(300)  # not JSON, Chinese, layered on this server
    plain = "Done. Exit code 0; wrote report to out/report.txt"
    turns = [
        {"role": "user", "content": "读一下日志，然后生成报告。"},
        call("call_0", "read_log", malformed),
        result("call_0", text),
        call("call_1", "make_report", "not json at all"),
        result("call_1", plain),
    ]
    appended = await append(small_client, sid, turns)
    assert appended.status_code == 201, appended.text
    listed = (await small_client.get(f"/v1/sessions/{sid}/turns")).json()["turns"]
    assert listed[1]["tool_calls"][0]["function"]["arguments"] == malformed
    assert listed[3]["tool_calls"][0]["function"]["arguments"] == "not json at all"
    assert listed[4]["content"] == plain
    assert listed[2]["content"].startswith(LAYERED_PREFIX)
    assert "退款单号: TK88231X" in listed[2]["content"]
    body = await build(small_client, sid)
    shown = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    assert shown["call_1"] == plain
    assert shown["call_0"] == listed[2]["content"]


def mixed_result(size: int) -> str:
    """English, Chinese and JSON lines with CRLF and bare CR, tabs, blank lines of spaces,
    emoji (a family joined by ZWJ, a flag), combining marks and unusual spaces: ~`size` bytes."""
    blocks: list[str] = []
    size_so_far = 0
    while size_so_far < size:
        i = len(blocks)
        lines = [
            f"2026-12-06T04:{i % 60:02d}:00Z INFO order ORD-{i:06d} shipped 👨‍👩‍👧 🇫🇷 café\r",
            f"订单号：DD{i:08d}，状态：已发货，备注：客户要求周末送达 ✅",
            json.dumps({"sku": f"SKU{i:05d}", "name": "Crème brûlée", "qty": i % 9}),
            "\t  indented\u3000全角空格\u00a0nbsp  \r\n  \n",
            f"Zalgo: Z\u0351\u0300a\u036ble\u0301\u0332 #{i} e\u0301 vs é\r\rend",
        ]
        blocks.append("\n".join(lines))
        size_so_far += len(blocks[-1].encode()) + 1
    return "\n".join(blocks) + "\n"


async def test_a_layered_result_is_given_back_whole_byte_for_byte(
    client: httpx.AsyncClient,
) -> None:
    sid = "huge-byte-exact"
    text = mixed_result(1_000_000)
    assert len(text.encode()) > 1_000_000
    turns = [call("call_0", "read_mixed", "{}"), result("call_0", text)]
    appended = await append(client, sid, turns)
    assert appended.status_code == 201, appended.text

    whole = await client.get(f"/v1/sessions/{sid}/turns/2/text")
    assert whole.status_code == 200, whole.text
    assert whole.json()["text"].encode() == text.encode()
    assert (
        whole.json()["pieces"]
        == (await client.get(f"/v1/sessions/{sid}")).json()["counts"]["chunks"]
    )
    # A client joins the same from the pieces: each one's text after its header line, less its
    # overlap copy.
    listed = (await client.get(f"/v1/sessions/{sid}/chunks", params={"limit": 3})).json()
    shown = [
        (await client.get(f"/v1/sessions/{sid}/chunks/{c['chunk_id']}")).json()
        for c in listed["chunks"]
    ]
    assert [c["part"] for c in shown] == [1, 2, 3] and shown[0]["overlap_chars"] == 0
    start = "".join(c["raw_text"].split("\n", 1)[1][c["overlap_chars"] :] for c in shown)
    assert text.startswith(start) and len(start) > 300

    missing = await client.get(f"/v1/sessions/{sid}/turns/1/text")  # the call: not in pieces
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "seq"
    await forget(client, sid)
