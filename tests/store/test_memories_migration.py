"""Migration 0013: every remembered item written before it stays as it was — the active ones
active and trusted, in prompts and lists as before — with its first version and provenance."""

import asyncio
import uuid

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.core.migrate import upgrade
from tests.support.factories import transaction
from tests.support.migrations import session_before
from tests.support.server import RunningServer

OWN_DATABASE = True  # it migrates its database down and up again

ITEMS = [  # (text, scope, status)
    ("Invoices go to finance@example.com.", "session", "active"),
    ("我住在上海。", "user", "active"),
    ("Seat: window.", "session", "superseded"),
    ("", "session", "erased"),
]


async def test_existing_items_stay_active_and_trusted_with_a_first_version(
    engine: AsyncEngine, settings: Settings, request: pytest.FixtureRequest
) -> None:
    key, session_pk = await session_before(engine, settings, "0012", user_id="u-1")
    async with transaction(engine) as db:
        for body, scope, status in ITEMS:
            await db.execute(
                text(
                    "INSERT INTO memories (id, tenant_id, session_id, user_id, scope, text,"
                    " source, trusted, status, lexical)"
                    " SELECT :id, tenant_id, id, 'u-1', :scope, :text, 'memory', true, :status,"
                    " to_tsvector('simple', :text) FROM sessions WHERE id = :session"
                ),
                {
                    "id": uuid.uuid4(),
                    "scope": scope,
                    "text": body,
                    "status": status,
                    "session": session_pk,
                },
            )
    await asyncio.to_thread(upgrade, settings.database_url or "")

    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT m.text, m.status, m.trusted, m.source, m.actor, m.revision,"
                    " v.revision, v.status, v.text, v.content_hash IS NOT NULL"
                    " FROM memories m JOIN memory_versions v ON v.memory_id = m.id"
                    " AND v.tenant_id = m.tenant_id WHERE m.session_id = :s ORDER BY m.text"
                ),
                {"s": session_pk},
            )
        ).all()
    assert sorted(tuple(r) for r in rows) == sorted(
        (body, status, True, "remember", "agent", 1, 1, status, body or None, bool(body))
        for body, _, status in ITEMS
    )

    server: RunningServer = request.getfixturevalue("contextd")
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        listed = (await client.get("/v1/sessions/before/memories")).json()["memories"]
        assert sorted((m["text"], m["status"], m["in_force"], m["trusted"]) for m in listed) == [
            ("Invoices go to finance@example.com.", "active", True, True),
            ("我住在上海。", "active", True, True),
        ]
        built = await client.post(
            "/v1/sessions/before/build-prompt", json={"query": "where do I live? 上海"}
        )
        assert built.status_code == 200, built.text
        assert "我住在上海。" in "\n".join(m["content"] or "" for m in built.json()["messages"])
