"""Hostile strings every surface must refuse or store faithfully, never answer with a 5xx or
internal text: the set the security rounds probe with."""

import json
import uuid
from typing import Any

import httpx
from mcp_types import LATEST_PROTOCOL_VERSION

HOSTILE_STRINGS: dict[str, str] = {
    "nul": "a\x00b",
    "300 chars": "x" * 300,
    "tombstone": f"~erasing~{uuid.UUID(int=7)}",
    "slash and space": "a/b c",
    "html": "<script>alert(1)</script>",
    "rtl marks": "\u202eabc\u200f",
    "lone surrogate": "a\ud800b",
}

# Words of internal error text (SQL, driver and Python names) no answer may carry.
INTERNAL_WORDS = (
    "select ",
    "insert ",
    "update ",
    "sqlalchemy",
    "psycopg",
    "traceback",
    "external_id",
    "[sql",
    "parameters:",
)


def internal_text(text: str) -> list[str]:
    """The internal words `text` holds (none, for a clean answer)."""
    lowered = text.lower()
    return [word for word in INTERNAL_WORDS if word in lowered]


# Stands for a hostile string in a value until it is written as JSON (`hostile_json`): a lone
# surrogate cannot be encoded by JSON libraries, only written as its escape.
MARK = "\ue000"


def hostile_json(value: Any, hostile: str) -> bytes:
    """`value` as JSON, each MARK written as `hostile` (a lone surrogate as its `\\u` escape)."""
    return json.dumps(value).replace(json.dumps(MARK), json.dumps(hostile)).encode()


async def mcp_post(
    http: httpx.AsyncClient, key: str, method: str, params: dict[str, Any], hostile: str = ""
) -> dict[str, Any]:
    """One JSON-RPC request to `/mcp` of `http`'s server, written by hand (MARK in `params` as
    `hostile`, which the SDK's client could not encode); the JSON-RPC answer."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": LATEST_PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": envelope}}
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": LATEST_PROTOCOL_VERSION,
        "Mcp-Method": method,
    }
    if "name" in params:
        headers["Mcp-Name"] = params["name"]
    resp = await http.post("/mcp", content=hostile_json(message, hostile), headers=headers)
    assert resp.status_code < 500, resp.text
    answer: dict[str, Any] = resp.json()
    return answer
