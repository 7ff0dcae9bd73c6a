"""The MCP endpoint with the SDK's own client over streamable HTTP against a live server: the tools
a key may use, recall through MCP equal to recall through REST, build_prompt, and the same keys and
tenant walls as the REST API."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.conftest import new_key
from tests.prompt.test_recall_needles import offloaded_session

OWN_DATABASE = True  # runs a worker

SID = "mcp-recall"
QUERY = "what was that order number again?"


@asynccontextmanager
async def mcp_client(base_url: str, key: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client,
    ):
        yield client


def without_session(schema: dict[str, Any]) -> dict[str, Any]:
    props = {k: v for k, v in schema["properties"].items() if k != "session_id"}
    required = [r for r in schema["required"] if r != "session_id"]
    return {**schema, "properties": props, "required": required}


async def test_mcp_tools_recall_like_rest_and_build_prompts(
    settings: Settings, api_key: str, engine: AsyncEngine
) -> None:
    async with offloaded_session(settings, api_key, SID, seed=11) as http:
        base = str(http.base_url).rstrip("/")
        definition = (await http.get("/v1/memory/tool", params={"format": "anthropic"})).json()
        rest = await http.post(
            f"/v1/sessions/{SID}/memory", json={"type": "recall", "query": QUERY}
        )
        assert rest.status_code == 200
        rest_matches = rest.json()["data"]["matches"]
        assert rest_matches and "ORD-58213" in rest_matches[0]["text"]

        async with mcp_client(base, api_key) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert sorted(listed) == ["build_prompt", "memory"]
            memory = listed["memory"]
            # the very definition of GET /v1/memory/tool, plus the session it works on
            assert memory.description is not None
            assert memory.description.startswith(definition["description"])
            assert without_session(memory.input_schema) == definition["input_schema"]
            assert memory.input_schema["required"] == ["session_id", "type"]
            assert memory.input_schema["properties"]["type"]["enum"] == [
                "help",
                "recall",
                "remember",
                "status",
                "verify",
            ]

            called = await client.call_tool(
                "memory", {"session_id": SID, "type": "recall", "query": QUERY}
            )
            assert not called.is_error
            assert called.structured_content is not None
            assert called.structured_content["data"]["matches"] == rest_matches
            assert called.content[0].text == rest.json()["text"]

            built = await client.call_tool(
                "build_prompt",
                {"session_id": SID, "system": "You are a travel agent.", "query": QUERY},
            )
            assert not built.is_error and built.structured_content is not None
            body = built.structured_content
            assert body["messages"][0] == {"role": "system", "content": "You are a travel agent."}
            assert body["messages"][-1] == {"role": "user", "content": QUERY}
            assert body["usage"]["total"] <= body["usage"]["limit"]
            assert any("ORD-58213" in m["content"] for m in body["messages"])
            assert any(e["layer"] == "c3" and e["included"] for e in body["manifest"])

            refused = await client.call_tool("memory", {"session_id": SID, "type": "offload"})
            assert refused.is_error and refused.structured_content is not None
            assert refused.structured_content["error"]["code"] == "forbidden"

            invalid = await client.call_tool("memory", {"session_id": SID, "type": "recall"})
            assert invalid.is_error and invalid.structured_content is not None
            assert invalid.structured_content["error"]["field"] == "query"

        stranger = await new_key(engine, "mcp-stranger", ["sessions:read", "sessions:write"])
        async with mcp_client(base, stranger) as client:
            hidden = await client.call_tool(
                "memory", {"session_id": SID, "type": "recall", "query": QUERY}
            )
            assert hidden.is_error and hidden.structured_content is not None
            assert hidden.structured_content["error"]["code"] == "not_found"

        initialize = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(base_url=base, timeout=30) as anonymous:
            resp = await anonymous.post("/mcp", json=initialize, headers=headers)
            assert resp.status_code == 401
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert resp.json()["error"]["data"]["error"]["code"] == "unauthorized"
            wrong = {**headers, "Authorization": "Bearer ctxd_not-a-key"}
            assert (await anonymous.post("/mcp", json=initialize, headers=wrong)).status_code == 401
