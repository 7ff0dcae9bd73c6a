"""Migration 0018 (the tenant in every key) keeps every row of every tenant-scoped table, both
ways; a row filed under another tenant than its session's takes its session's; and the service
reads, appends to, builds from and deletes the sessions written before it."""

import asyncio
import uuid

import httpx
import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.core.migrate import alembic_config, upgrade
from tests.conftest import new_key
from tests.support.factories import transaction
from tests.support.server import RunningServer

OWN_DATABASE = True  # it migrates its database down and up again

TABLES = (
    "sessions",
    "turns",
    "chunks",
    "idempotency_keys",
    "scratchpads",
    "memories",
    "memory_versions",
    "offload_events",
    "prompt_builds",
    "erase_receipts",
)
MISFILED = "filed under another tenant"

# One session of a tenant with a row in every tenant-scoped table, as revision 0017 stores them.
_ROWS = [
    "INSERT INTO sessions (id, tenant_id, external_id, user_id, last_seq, turn_count, c1_turns,"
    " c1_tokens, chunk_count) VALUES (:session, :tenant, 'before', 'u-1', 3, 3, 2, 14, 1)",
    "INSERT INTO turns (tenant_id, session_id, seq, role, content, token_count, chunk_id)"
    " VALUES (:tenant, :session, 1, 'user', 'Ship the invoice to finance@example.com.', 9, :chunk),"
    " (:tenant, :session, 2, 'assistant', '好的，我会把发票发到财务。', 12, NULL),"
    " (:tenant, :session, 3, 'user', 'Thanks.', 2, NULL)",
    "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last, ts_first, ts_last,"
    " raw_text, token_count, lexical) VALUES (:chunk, :tenant, :session, 1, 1, now(), now(),"
    " 'user: Ship the invoice to finance@example.com.', 11,"
    " to_tsvector('simple', 'ship the invoice to finance'))",
    "INSERT INTO idempotency_keys (tenant_id, session_id, key, request_hash, status_code)"
    " VALUES (:tenant, :session, 'append-1', 'h', 200)",
    "INSERT INTO scratchpads (session_id, tenant_id, version, notes)"
    ' VALUES (:session, :tenant, 1, \'{"goal": "send the invoice"}\')',
    "INSERT INTO memories (id, tenant_id, session_id, user_id, scope, text, source, lexical)"
    " VALUES (:memory, :tenant, :session, 'u-1', 'user', '我住在上海。', 'remember',"
    " to_tsvector('simple', '我住 住在 在上 上海'))",
    "INSERT INTO memory_versions (tenant_id, memory_id, revision, status, text, trusted, actor,"
    " reason) VALUES (:tenant, :memory, 1, 'active', '我住在上海。', true, 'agent', 'remembered')",
    "INSERT INTO offload_events (tenant_id, session_id, trigger, trigger_ratio, ratio_after,"
    " tokens_freed, chunks_offloaded, turn_first, turn_last, turns, duration_ms)"
    " VALUES (:tenant, :session, 'watermark', 0.8, 0.5, 9, 1, 1, 1, 1, 3.5)",
    "INSERT INTO prompt_builds (id, tenant_id, session_id, record)"
    " VALUES (:build, :tenant, :session, '{\"messages\": 3}')",
    "INSERT INTO erase_receipts (id, tenant_id, session_external_id, target)"
    " VALUES (:receipt, :tenant, 'before', '{\"turns\": [1]}')",
]


async def _digests(engine: AsyncEngine) -> dict[str, tuple[int, str]]:
    """Each table's rows (but the misfiled turn) and a digest of their every column."""
    out = {}
    async with engine.connect() as conn:
        for table in TABLES:
            row = await conn.execute(
                text(
                    f"SELECT count(*), md5(coalesce(string_agg(r::text, '|' ORDER BY r::text),"
                    f" '')) FROM {table} AS r"
                    + (" WHERE r.content <> :misfiled" if table == "turns" else "")
                ),
                {"misfiled": MISFILED},
            )
            count, digest = row.one()
            out[table] = (int(count), str(digest))
    return out


async def test_every_row_stays_through_the_upgrade_and_back(
    engine: AsyncEngine, settings: Settings, request: pytest.FixtureRequest
) -> None:
    url = settings.database_url or ""
    await asyncio.to_thread(command.downgrade, alembic_config(url), "0017")
    names = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    keys = [await new_key(engine, name, ["sessions:read", "sessions:write"]) for name in names]
    sessions = {}
    async with transaction(engine) as db:
        for name in names:
            tenant = (
                await db.execute(text("SELECT id FROM tenants WHERE name = :n"), {"n": name})
            ).scalar_one()
            ids = {k: uuid.uuid4() for k in ("session", "chunk", "memory", "build", "receipt")}
            for statement in _ROWS:
                await db.execute(text(statement), {**ids, "tenant": tenant})
            sessions[name] = (tenant, ids["session"])
        # A turn of the first tenant's session under the second tenant's id (never written so).
        (first, first_session), (second, _) = sessions[names[0]], sessions[names[1]]
        await db.execute(
            text(
                "INSERT INTO turns (tenant_id, session_id, seq, role, content, token_count)"
                " VALUES (:tenant, :session, 4, 'user', :misfiled, 5)"
            ),
            {"tenant": second, "session": first_session, "misfiled": MISFILED},
        )
        await db.execute(
            text(
                "UPDATE sessions SET last_seq = 4, turn_count = 4, c1_turns = 3, c1_tokens = 19"
                " WHERE id = :s"
            ),
            {"s": first_session},
        )
    before = await _digests(engine)
    assert {table: count for table, (count, _) in before.items()} == {
        table: 6 if table == "turns" else 2 for table in TABLES
    }

    # To 0018 itself: a later revision may add a column, which changes every row's digest.
    await asyncio.to_thread(upgrade, url, "0018")
    assert await _digests(engine) == before
    async with engine.connect() as conn:
        misfiled = await conn.execute(
            text("SELECT tenant_id FROM turns WHERE content = :m"), {"m": MISFILED}
        )
        assert misfiled.scalar_one() == first
    await asyncio.to_thread(command.downgrade, alembic_config(url), "0017")
    assert await _digests(engine) == before
    await asyncio.to_thread(upgrade, url, "0018")
    assert await _digests(engine) == before
    await asyncio.to_thread(upgrade, url)

    server: RunningServer = request.getfixturevalue("contextd")
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {keys[0]}"}, timeout=30
    ) as client:
        listed = await client.get("/v1/sessions/before/turns")
        assert listed.status_code == 200, listed.text
        assert [(t["seq"], t["content"]) for t in listed.json()["turns"]] == [
            (1, "Ship the invoice to finance@example.com."),
            (2, "好的，我会把发票发到财务。"),
            (3, "Thanks."),
            (4, MISFILED),
        ]
        appended = await client.post(
            "/v1/sessions/before/turns", json={"turns": [{"role": "user", "content": "我住哪里？"}]}
        )
        assert appended.status_code == 201, appended.text
        assert [t["seq"] for t in appended.json()["turns"]] == [5]
        built = await client.post(
            "/v1/sessions/before/build-prompt", json={"query": "where do I live? 上海"}
        )
        assert built.status_code == 200, built.text
        prompt = "\n".join(m["content"] or "" for m in built.json()["messages"])
        assert "我住在上海。" in prompt

    # Deleting a session takes its rows through the foreign keys that now carry the tenant.
    second_session = sessions[names[1]][1]
    async with transaction(engine) as db:
        await db.execute(text("DELETE FROM sessions WHERE id = :s"), {"s": second_session})
    async with engine.connect() as conn:
        left = {
            table: (
                await conn.execute(
                    text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"), {"t": second}
                )
            ).scalar_one()
            for table in TABLES
        }
    assert left == {table: 1 if table == "erase_receipts" else 0 for table in TABLES}
