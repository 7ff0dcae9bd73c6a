"""A fuzz run with the hostile strings (NUL, 300 characters, a tombstone name, a slash and a
space, HTML, RTL marks, a lone surrogate as a JSON escape) in every body field and object key of
every body operation of the OpenAPI document, and in every argument of every MCP tool: 0 5xx, no
internal text. Each operation's valid bodies below cover every property of its schema (checked
against the document and the tools' input schemas, so a new field is fuzzed or fails here).
Path and query parameters: tests/test_hostile_parameters.py; schemathesis fuzzes besides."""

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.hostile import HOSTILE_STRINGS, MARK, hostile_json, internal_text, mcp_post

ROOT = Path(__file__).resolve().parents[2]
SPEC = json.loads((ROOT / "openapi" / "openapi.json").read_text())
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
MEMORY_BODIES: list[dict[str, Any]] = [
    {"type": "help"},
    {"type": "status"},
    {
        "type": "recall",
        "query": "the 9:40 train",
        "top_k": 3,
        "budget_tokens": 300,
        "as_of": "2026-12-01T10:00:00Z",
    },
    {
        "type": "remember",
        "text": "aisle seat",
        "tags": ["travel"],
        "key": "seat",
        "scope": "session",
    },
    {"type": "offload", "until_tokens": 10},
    {"type": "forget", "memory_id": str(uuid.UUID(int=9))},
    {"type": "verify", "memory_id": str(uuid.UUID(int=9))},
    {"type": "forget", "chunk_id": str(uuid.UUID(int=9))},
    {"type": "forget", "turn_range": [1, 1]},
]
BUILD_BODIES: list[dict[str, Any]] = [
    {
        "system": "You are a travel agent.",
        "tools": [TOOL],
        "query": "which train?",
        "context_limit": 8000,
        "reserve_tokens": 500,
        "recall": {"mode": "always", "top_k": 2, "candidates": 20, "budget_tokens": 400},
        "tool_results": {
            "keep": 1,
            "exclude_tools": ["lookup"],
            "clear_at_least": 10,
            "clear_tool_inputs": True,
        },
        "format": "anthropic",
        "persist_manifest": True,
    },
    {"system": [{"role": "system", "content": "Be brief."}], "query": "and back?", "append": True},
]
BODIES: dict[str, list[dict[str, Any]]] = {
    "append_turns": [
        {
            "turns": [
                {"role": "user", "content": "Book it.", "name": "ana", "metadata": {"k": "v"}},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "content": "{}", "tool_call_id": "call_1"},
            ]
        }
    ],
    "configure_session": [
        {
            "context_limit": 16000,
            "reserve_tokens": 1000,
            "trigger_ratio": 0.8,
            "emergency_ratio": 0.95,
            "target_ratio": 0.5,
            "min_recent_turns": 2,
            "min_recent_tokens": 100,
            "c0_tokens": 100,
            "recall_top_k": 3,
            "recall_budget_tokens": 300,
            "recall_candidates": 20,
            "tool_results_keep": 1,
            "tool_results_exclude_tools": ["lookup"],
            "tool_results_clear_at_least": 10,
            "tool_results_clear_tool_inputs": False,
            "value_table_tokens": 50,
            "user_id": "u-1",
            "metadata": {"owner": "ana"},
        }
    ],
    "memory_tool": MEMORY_BODIES,
    "create_memory": [
        {
            "text": "aisle seat",
            "tags": ["travel"],
            "key": "seat",
            "scope": "session",
            "source": "tool_result",
            "source_tool": "lookup",
            "turn_seqs": [1],
            "valid_from": "2026-12-01T10:00:00Z",
            "valid_until": "2026-12-31T10:00:00Z",
            "ttl_seconds": 3600,
            "actor": "api_key",
        }
    ],
    "update_memory": [
        {
            "expected_revision": 1,
            "text": "window seat",
            "status": "verified",
            "valid_from": "2026-12-01T10:00:00Z",
            "valid_until": "2026-12-31T10:00:00Z",
            "ttl_seconds": 3600,
            "reason": "the user said so",
            "actor": "user",
        }
    ],
    "build_prompt": BUILD_BODIES,
    "untrust_source": [{"tool": "lookup"}, {"turn_range": [1, 1]}],
}
TOOL_ARGUMENTS = {"memory": MEMORY_BODIES, "build_prompt": BUILD_BODIES}


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def schema_fields(schema: dict[str, Any], path: str = "") -> set[str]:
    """Every property path of a request schema: `turns[].tool_calls[].function.name`."""
    schema = resolve(schema)
    found: set[str] = set()
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []):
        found |= schema_fields(branch, path)
    if "items" in schema:
        found |= schema_fields(schema["items"], f"{path}[]")
    for name, inner in schema.get("properties", {}).items():
        child = f"{path}.{name}" if path else name
        found |= {child} | schema_fields(inner, child)
    return found


def variants(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[Any, str]]:
    """`value` with one leaf, or one object key, replaced by MARK; and the field's path."""
    shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    if isinstance(value, dict):
        for key, inner in value.items():
            renamed = {(MARK if k == key else k): v for k, v in value.items()}
            yield renamed, f"{shown}.<key>".lstrip(".")
            for changed, where in variants(inner, (*path, key)):
                yield {**value, key: changed}, where
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            for changed, where in variants(inner, (*path, i)):
                yield [*value[:i], changed, *value[i + 1 :]], where
    if path or not isinstance(value, dict | list):
        yield MARK, shown


def field_name(where: str) -> str:
    """`turns[2].tool_calls[0].id` → `turns[].tool_calls[].id`."""
    return re.sub(r"\[\d+\]", "[]", where)


def covered(bodies: list[dict[str, Any]]) -> set[str]:
    return {field_name(where) for body in bodies for _, where in variants(body)}


def fuzz_cases(bodies: list[dict[str, Any]]) -> Iterator[tuple[Any, str]]:
    """The variants of `bodies`, each field once (its first body): a field is checked the same
    in every body that holds it."""
    seen: set[str] = set()
    for body in bodies:
        for changed, where in variants(body):
            if field_name(where) not in seen:
                seen.add(field_name(where))
                yield changed, where


def test_the_valid_bodies_cover_every_field_of_every_body_operation() -> None:
    operations = {
        op["operationId"]: op
        for methods in SPEC["paths"].values()
        for op in methods.values()
        if "requestBody" in op
    }
    assert sorted(operations) == sorted(BODIES)
    for name, operation in operations.items():
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        missing = schema_fields(schema) - covered(BODIES[name])
        assert missing == set(), f"{name}: no body below holds {sorted(missing)}"


async def test_hostile_strings_in_every_body_field_get_no_5xx(admin: httpx.AsyncClient) -> None:
    session = f"fuzz-{uuid.uuid4().hex[:8]}"
    first = {"turns": [{"role": "user", "content": "Book the 9:40 to Lyon."}]}
    assert (await admin.post(f"/v1/sessions/{session}/turns", json=first)).status_code == 201
    item = await admin.post(f"/v1/sessions/{session}/memories", json={"text": "aisle seat"})
    assert item.status_code == 201, item.text
    memory_id = item.json()["memory"]["memory_id"]
    paths = {
        op["operationId"]: (
            method.upper(),
            template.replace("{session_id}", session).replace("{memory_id}", memory_id),
        )
        for template, methods in SPEC["paths"].items()
        for method, op in methods.items()
    }
    failures, leaked, statuses, started = [], [], {}, time.perf_counter()
    for name, bodies in BODIES.items():
        method, path = paths[name]
        for changed, where in fuzz_cases(bodies):
            for label, hostile in HOSTILE_STRINGS.items():
                resp = await admin.request(
                    method,
                    path,
                    content=hostile_json(changed, hostile),
                    headers={"Content-Type": "application/json"},
                )
                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                if resp.status_code >= 500:
                    failures.append((name, where, label, resp.status_code, resp.text[:200]))
                leaked += [(name, where, label, w) for w in internal_text(resp.text)]
    seconds = time.perf_counter() - started
    print(f"body fuzz: {sum(statuses.values())} requests in {seconds:.1f} s, statuses {statuses}")
    assert sum(statuses.values()) > 500
    assert failures == []
    assert leaked == []


async def test_hostile_strings_in_every_mcp_tool_argument_get_no_5xx(
    admin: httpx.AsyncClient, admin_key: str
) -> None:
    session = f"fuzz-mcp-{uuid.uuid4().hex[:8]}"
    first = {"turns": [{"role": "user", "content": "Book the 9:40 to Lyon."}]}
    assert (await admin.post(f"/v1/sessions/{session}/turns", json=first)).status_code == 201
    listed = await mcp_post(admin, admin_key, "tools/list", {})
    schemas = {tool["name"]: tool["inputSchema"] for tool in listed["result"]["tools"]}
    assert sorted(schemas) == sorted(TOOL_ARGUMENTS)

    failures, leaked, calls, started = [], [], 0, time.perf_counter()
    for tool, bodies in TOOL_ARGUMENTS.items():
        arguments = [{"session_id": session, **body} for body in bodies]
        missing = schema_fields(schemas[tool]) - covered(arguments)
        assert missing == set(), f"{tool}: no arguments below hold {sorted(missing)}"
        for changed, where in fuzz_cases(arguments):
            for label, hostile in HOSTILE_STRINGS.items():
                call = {"name": tool, "arguments": changed}
                answer = await mcp_post(admin, admin_key, "tools/call", call, hostile)
                calls += 1
                result = answer.get("result") or {}
                error = (result.get("structuredContent") or {}).get("error") or {}
                if "result" not in answer or error.get("code") == "internal_error":
                    failures.append((tool, where, label, answer))
                leaked += [(tool, where, label, w) for w in internal_text(json.dumps(answer))]
    print(f"MCP fuzz: {calls} tool calls in {time.perf_counter() - started:.1f} s")
    assert calls > 300
    assert failures == []
    assert leaked == []
