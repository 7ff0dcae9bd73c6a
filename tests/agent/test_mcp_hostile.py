"""MCP is as strict as REST: a session id REST refuses is refused by every tool with the same
code and message, nothing is stored, and no answer carries internal text (SQL, driver names);
a wrong key reads as 401 in the MCP client."""

from typing import Any
from urllib.parse import quote

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.errors import InvalidSessionId
from tests.agent.test_mcp_server import mcp_client
from tests.sessions.test_bad_input import tenant_rows
from tests.support.hostile import HOSTILE_STRINGS, MARK, internal_text, mcp_post
from tests.support.server import RunningServer

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("memory", {"type": "remember", "text": "keep the 9:40 train"}),
    ("memory", {"type": "status"}),
    ("build_prompt", {"query": "hello", "append": True}),
    ("build_prompt", {"query": "hello"}),
]


def is_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(char) <= 0xDFFF for char in text)


async def raw_tool_call(
    base_url: str, key: str, tool: str, session_id: str, arguments: dict[str, Any]
) -> CallToolResult:
    call = {"name": tool, "arguments": {"session_id": MARK, **arguments}}
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        answer = await mcp_post(http, key, "tools/call", call, session_id)
    return CallToolResult.model_validate(answer["result"])


async def test_hostile_session_ids_are_refused_by_every_tool_as_by_rest(
    server: RunningServer,
    client: httpx.AsyncClient,
    admin_key: str,
    engine: AsyncEngine,
    tenant_name: str,
) -> None:
    accepted, leaked, refusals = [], [], set()
    async with mcp_client(server.url, admin_key) as mcp:
        for label, session_id in HOSTILE_STRINGS.items():
            for tool, arguments in CALLS:
                if is_surrogate(session_id):  # the SDK cannot encode it: sent as a JSON escape
                    result = await raw_tool_call(server.url, admin_key, tool, session_id, arguments)
                else:
                    result = await mcp.call_tool(tool, {"session_id": session_id, **arguments})
                text = result.content[0].text if result.content else ""
                leaked += [(label, tool, word) for word in internal_text(text)]
                if not result.is_error:
                    accepted.append((label, tool))
                    continue
                assert result.structured_content is not None
                error = result.structured_content["error"]
                refusals.add((error["code"], error["message"], error["field"]))
    assert accepted == []
    assert leaked == []
    assert refusals == {("invalid_session_id", InvalidSessionId.RULE, "session_id")}
    assert await tenant_rows(engine, tenant_name) == (0, 0)  # not a turn, not a session

    # REST says the same of every id ("a/b c" too, sent encoded as one path segment)
    for label, session_id in HOSTILE_STRINGS.items():
        path = f"/v1/sessions/{quote(session_id, safe='', errors='surrogatepass')}/turns"
        resp = await client.post(path, json={"turns": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 422, label
        assert resp.json()["error"] == {
            "code": "invalid_session_id",
            "message": InvalidSessionId.RULE,
            "field": "session_id",
        }, label
    assert await tenant_rows(engine, tenant_name) == (0, 0)


@pytest.mark.parametrize("missing", [None, 42, ""])
async def test_a_missing_or_mistyped_session_id_names_the_field(
    server: RunningServer, api_key: str, missing: object
) -> None:
    arguments: dict[str, Any] = {"type": "status"}
    if missing is not None:
        arguments["session_id"] = missing
    async with mcp_client(server.url, api_key) as mcp:
        result = await mcp.call_tool("memory", arguments)
    assert result.is_error and result.structured_content is not None
    error = result.structured_content["error"]
    assert error["field"] == "session_id"
    assert error["code"] == ("missing_field" if missing is None else "invalid_session_id")


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


async def test_a_wrong_key_reads_as_401_in_the_mcp_client(server: RunningServer) -> None:
    with pytest.raises(BaseException) as refused:  # the client's task groups wrap its error
        async with mcp_client(server.url, "ctxd_not-a-key") as mcp:
            await mcp.list_tools()
    errors = [leaf for leaf in leaves(refused.value) if isinstance(leaf, MCPError)]
    assert errors, refused.value
    assert {error.message for error in errors} == {"401 unauthorized: invalid or revoked API key"}
    assert errors[0].data["status"] == 401
    assert errors[0].data["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"type": "recall", "query": 5}, "query"),
        ({"type": "recall", "query": "ticket", "top_k": "three"}, "top_k"),
    ],
    ids=["query", "top_k"],
)
async def test_a_mistyped_argument_names_its_field_as_rest_does(
    server: RunningServer, api_key: str, arguments: dict[str, Any], field: str
) -> None:
    async with mcp_client(server.url, api_key) as mcp:
        result = await mcp.call_tool("memory", {"session_id": "mcp-typed", **arguments})
    assert result.is_error and result.structured_content is not None
    assert result.structured_content["error"]["code"] == "wrong_type"
    assert result.structured_content["error"]["field"] == field


def request_count(metrics: str, route: str) -> float:
    wanted = {"route": route, "method": "POST", "status": "200"}
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "contextd_http_request_duration_seconds_count" and sample.labels == wanted
    )


async def test_mcp_requests_are_counted_under_their_path(
    server: RunningServer, client: httpx.AsyncClient, api_key: str
) -> None:
    """Not as "unmatched", the label of a request no route took (a 404)."""
    before = (await client.get("/metrics")).text
    await mcp_post(client, api_key, "tools/list", {})
    after = (await client.get("/metrics")).text
    assert request_count(after, "/mcp") - request_count(before, "/mcp") == 1
    assert request_count(after, "unmatched") == request_count(before, "unmatched")
