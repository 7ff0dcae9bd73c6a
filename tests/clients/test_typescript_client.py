"""A TypeScript client generated from the committed openapi/openapi.json (openapi-typescript types +
openapi-fetch), type-checked with `tsc --strict` and run with Node against a live server; the
script prints JSON that this test asserts on."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.clients.toolchain import (
    NODE_BIN,
    NODE_DIR,
    SPEC_PATH,
    compile_ts,
    node,
    node_toolchain,
    run,
    run_node,
)
from tests.support.server import RunningServer


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("tsclient")
    node_toolchain()
    run(
        [
            node(),
            str(NODE_BIN / "openapi-typescript"),
            str(SPEC_PATH),
            "-o",
            str(work / "schema.d.ts"),
            "--default-non-nullable",
            "false",
        ],
        what="openapi-typescript",
    )
    schema = (work / "schema.d.ts").read_text()
    assert '"/v1/sessions/{session_id}/build-prompt"' in schema
    assert 'operations["append_turns"]' in schema
    assert 'operations["memory_tool"]' in schema
    shutil.copy(NODE_DIR / "client_check.ts", work)
    shutil.copy(NODE_DIR / "memory_check.ts", work)
    return compile_ts(work)


def run_script(script: Path, server: RunningServer, api_key: str, sid: str) -> dict[str, Any]:
    proc = run_node(
        script, env={"CONTEXTD_URL": server.url, "CONTEXTD_API_KEY": api_key, "SESSION_ID": sid}
    )
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


async def test_typescript_client_appends_builds_and_reads(
    compiled: Path, server: RunningServer, api_key: str
) -> None:
    out = run_script(compiled / "client_check.js", server, api_key, "ts-client")

    assert out["configured"]["session_id"] == "ts-client"
    assert out["configured"]["context_limit"] == 16000
    assert out["configured"]["usage"]["limit"] == 14000

    appended = out["appended"]
    assert [(t["seq"], t["role"]) for t in appended["turns"]] == [(1, "user"), (2, "assistant")]
    assert all(t["token_count"] > 0 for t in appended["turns"])
    assert appended["watermark"]["level"] == "normal" and appended["offload_enqueued"] is False
    assert [t["seq"] for t in out["replayed"]["turns"]] == [1, 2]  # Idempotency-Key replay
    assert out["conflicting"]["status"] == 409
    assert out["conflicting"]["error"]["error"]["code"] == "conflict"

    built = out["built"]
    assert built["messages"] == [
        {"role": "system", "content": "You are a travel agent."},
        {"role": "user", "content": "Book the 9:40 train to Lyon. Budget at most 120 EUR."},
        {"role": "assistant", "content": "Booked: ticket LY-40917, 96 EUR."},
        {"role": "user", "content": "Which ticket did you book?"},
    ]
    assert built["usage"]["limit"] == 14000
    assert 0 < built["usage"]["total"] <= built["usage"]["limit"]
    assert built["recall"]["items"] == [] and built["build_id"]

    assert [(t["seq"], t["content"]) for t in out["listed"]["turns"]] == [
        (1, "Book the 9:40 train to Lyon. Budget at most 120 EUR."),
        (3, "Which ticket did you book?"),
    ]
    assert out["viewed"]["counts"] == {"turns": 3, "chunks": 0, "memories": 0}

    assert out["invalid"]["status"] == 422
    assert out["invalid"]["error"]["error"]["code"] == "invalid_value"
    assert out["invalid"]["error"]["error"]["field"] == "turns[0].role"


async def test_typescript_client_calls_the_memory_tool(
    compiled: Path, server: RunningServer, api_key: str
) -> None:
    out = run_script(compiled / "memory_check.js", server, api_key, "ts-memory")
    assert out["remember"]["type"] == "remember" and out["remember"]["text"]
    [item] = out["memories"]
    assert (item["text"], item["key"]) == (
        "User wants invoices by email only, never paper",
        "invoice",
    )
    assert out["recall"]["type"] == "recall"
    assert "User wants invoices by email only, never paper" in out["recall"]["text"]
    assert out["recall"]["data"]["matches"][0]["memory_id"] == item["memory_id"]
    assert "no match" in out["nothing"]["text"].lower()
    assert out["nothing"]["data"]["matches"] == []
    assert out["status"]["type"] == "status"
    assert out["refused"]["status"] == 403
    assert out["refused"]["error"]["error"]["code"] == "forbidden"
    tool = out["tool"]
    assert tool["type"] == "function" and tool["function"]["name"] == "memory"
    assert "offload" not in tool["function"]["parameters"]["properties"]["type"]["enum"]
