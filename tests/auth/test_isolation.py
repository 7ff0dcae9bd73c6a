"""Tenant isolation over every operation of the API: another tenant's key, naming the same
session id and the real ids of one tenant's chunk, build and erase receipt, never reads, changes or
erases that tenant's data.

The operations come from the committed OpenAPI document, so a new endpoint is covered (and a
missing request body for it fails the test) without anyone remembering to add it here."""

import json
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import new_key
from tests.support.server import RunningServer

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
SECRET = "ZEBRA-4471"  # in every kind of data the owner stores: turns, chunks, memories, builds
SID = "shared-name"
USER = "shared-user"  # the owner's user, whom the intruder tries to erase
SMALL = {"context_limit": 2000, "reserve_tokens": 200, "min_recent_turns": 2}
TURNS = [
    {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"Turn {i}: the vault code is {SECRET}, keep it between us. " * 3,
    }
    for i in range(24)
]
# A request body for each operation that takes one (a schema-valid, typical call).
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/v1/sessions/{session_id}/turns"): {"turns": [{"role": "user", "content": "hi"}]},
    ("put", "/v1/sessions/{session_id}"): {"context_limit": 100000},
    ("post", "/v1/sessions/{session_id}/scratchpad/rebuild"): {},
    ("post", "/v1/sessions/{session_id}/memory"): {"type": "recall", "query": "vault code"},
    ("post", "/v1/sessions/{session_id}/build-prompt"): {"query": "what is the vault code?"},
    ("post", "/v1/sessions/{session_id}/memories"): {"text": "the intruder's own note"},
    ("patch", "/v1/sessions/{session_id}/memories/{memory_id}"): {"status": "verified"},
    ("post", "/v1/sessions/{session_id}/memories/{memory_id}/versions/{revision}/redact"): {},
    ("post", "/v1/sessions/{session_id}/sources/untrust"): {"turn_range": [1, 1]},
}


async def owner_counts(engine: AsyncEngine, tenant: str) -> tuple[int, int, int, int]:
    """(turns, chunks, memories, sessions) of `tenant`, straight from the tables."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM turns WHERE tenant_id = n.id),"
                    " (SELECT count(*) FROM chunks WHERE tenant_id = n.id),"
                    " (SELECT count(*) FROM memories WHERE tenant_id = n.id),"
                    " (SELECT count(*) FROM sessions WHERE tenant_id = n.id)"
                    " FROM tenants n WHERE n.name = :t"
                ),
                {"t": tenant},
            )
        ).one()
    return (int(row[0]), int(row[1]), int(row[2]), int(row[3]))


async def test_another_tenant_reaches_nothing_through_any_operation(
    server: RunningServer, engine: AsyncEngine, tenant_name: str
) -> None:
    owner_tenant = tenant_name + "-owner"
    scopes = ["sessions:read", "sessions:write", "memory:offload", "memory:forget"]
    owner_key = await new_key(engine, owner_tenant, scopes)
    other_key = await new_key(engine, tenant_name + "-intruder", scopes)
    async with (
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {owner_key}"}
        ) as owner,
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {other_key}"}
        ) as other,
    ):
        owned = {**SMALL, "user_id": USER}
        assert (await owner.put(f"/v1/sessions/{SID}", json=owned)).status_code == 200
        assert (await owner.post(f"/v1/sessions/{SID}/turns", json={"turns": TURNS})).is_success
        moved = await owner.post(f"/v1/sessions/{SID}/memory", json={"type": "offload"})
        assert moved.status_code == 200, moved.text
        remembered = await owner.post(
            f"/v1/sessions/{SID}/memory",
            json={"type": "remember", "text": f"code {SECRET}", "scope": "user"},
        )
        assert remembered.status_code == 200, remembered.text
        built = await owner.post(
            f"/v1/sessions/{SID}/build-prompt",
            json={"query": "what is the vault code?", "persist_manifest": True},
        )
        assert SECRET in built.text
        chunks = (await owner.get(f"/v1/sessions/{SID}/chunks")).json()["chunks"]
        assert chunks
        await owner.post("/v1/sessions/erased-one/turns", json={"turns": TURNS[:1]})
        receipt = (await owner.delete("/v1/sessions/erased-one")).json()["erase_receipt_id"]
        ids = {
            "session_id": SID,
            "chunk_id": chunks[0]["chunk_id"],
            "build_id": built.json()["build_id"],
            "receipt_id": receipt,
            "user_id": USER,
            "seq": 1,
            "memory_id": remembered.json()["data"]["memory_id"],
            "revision": 1,
        }
        before = await owner_counts(engine, owner_tenant)

        # The intruder has a session of the same name of its own (the likeliest mix-up), and
        # deletes come last so that every other operation meets that session.
        mine_only = [{"role": "user", "content": "the intruder's own words"}]
        own = await other.post(f"/v1/sessions/{SID}/turns", json={"turns": mine_only})
        assert own.status_code == 201 and own.json()["turns"][0]["seq"] == 1
        answers: dict[str, int] = {}
        spec = json.loads(OPENAPI.read_text())
        calls = [(method, path) for path, ops in spec["paths"].items() for method in ops]
        for method, path in sorted(calls, key=lambda call: call[0] == "delete"):
            url = path.format(**ids)
            body = BODIES.get((method, path))
            if method in ("post", "put", "patch"):
                assert body is not None, f"add a request body for {method} {path}"
            resp = await other.request(method.upper(), url, json=body)
            answers[f"{method} {path}"] = resp.status_code
            assert resp.status_code < 500, (method, path, resp.text)
            assert SECRET not in resp.text, (method, path)
            if resp.is_success:  # a refusal may echo the id the intruder sent, nothing more
                assert chunks[0]["chunk_id"] not in resp.text, (method, path)
                assert USER not in resp.text, (method, path)  # the session list's included

        after = await owner_counts(engine, owner_tenant)
        mine = (await owner.get(f"/v1/sessions/{SID}/chunks")).json()["chunks"]
        again = await owner.post(
            f"/v1/sessions/{SID}/build-prompt", json={"query": "what is the vault code?"}
        )
    assert after == before
    assert [c["chunk_id"] for c in mine] == [c["chunk_id"] for c in chunks]
    assert SECRET in again.text
    # Reads of the owner's things by id are plain 404s, not 403s that would confirm they exist.
    for op in (
        "get /v1/sessions/{session_id}/chunks/{chunk_id}",
        "get /v1/sessions/{session_id}/builds/{build_id}",
        "get /v1/erase-receipts/{receipt_id}",
        "delete /v1/users/{user_id}",
        "get /v1/sessions/{session_id}/memories/{memory_id}",
        "patch /v1/sessions/{session_id}/memories/{memory_id}",
        "get /v1/sessions/{session_id}/memories/{memory_id}/versions",
        "post /v1/sessions/{session_id}/memories/{memory_id}/versions/{revision}/redact",
    ):
        assert answers[op] == 404, (op, answers[op])
    assert len(answers) >= 16
    # The intruder's own session answered (so the requests were valid ones, not refusals).
    for op in (
        "get /v1/sessions",
        "get /v1/sessions/{session_id}/chunks",
        "get /v1/sessions/{session_id}/scratchpad",
        "post /v1/sessions/{session_id}/memory",
        "post /v1/sessions/{session_id}/build-prompt",
        "post /v1/sessions/{session_id}/sources/untrust",
        "delete /v1/sessions/{session_id}",
    ):
        assert 200 <= answers[op] < 300, (op, answers[op])
