"""Migration 0016: every remembered item written before it stays as it was (status, trust,
text, revision); a user-scope one becomes a candidate seen once, its evidence its own writing,
and evidence after the migration promotes it like any other."""

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
    ("I live in Lyon.", "user", "active"),
    ("我对花生过敏。", "user", "active"),
    ("I live in Paris.", "user", "superseded"),
    ("", "user", "erased"),
]


async def test_existing_items_keep_their_state_and_user_ones_become_candidates(
    engine: AsyncEngine, settings: Settings, request: pytest.FixtureRequest
) -> None:
    key, session_pk = await session_before(engine, settings, "0015", user_id="u-1")
    async with transaction(engine) as db:
        for body, scope, status in ITEMS:
            await db.execute(
                text(
                    "INSERT INTO memories (id, tenant_id, session_id, user_id, scope, text,"
                    " source, trusted, status, turn_seqs, lexical)"
                    " SELECT :id, tenant_id, id, 'u-1', :scope, :text, 'remember', true,"
                    " :status, '{4}', to_tsvector('simple', :text) FROM sessions WHERE id = :s"
                ),
                {
                    "id": uuid.uuid4(),
                    "scope": scope,
                    "text": body,
                    "status": status,
                    "s": session_pk,
                },
            )
    await asyncio.to_thread(upgrade, settings.database_url or "")

    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT text, scope, status, trusted, revision, tier, stability, stable_by,"
                    " evidence, created_at FROM memories WHERE session_id = :s"
                ),
                {"s": session_pk},
            )
        ).all()
    assert sorted((r.text, r.scope, r.status, r.trusted, r.revision) for r in rows) == sorted(
        (body, scope, status, True, 1) for body, scope, status in ITEMS
    )
    for row in rows:
        if row.scope == "session":
            assert (row.tier, row.stability, row.stable_by, row.evidence) == (None, None, [], [])
            continue
        assert (row.tier, row.stability, row.stable_by) == ("candidate", 0.25, [])
        [evidence] = row.evidence
        assert (evidence["kind"], evidence["session"], evidence["seqs"]) == (
            "written",
            str(session_pk),
            [4],
        )
        assert evidence["at"] == row.created_at.isoformat()

    server: RunningServer = request.getfixturevalue("contextd")
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        listed = (await client.get("/v1/sessions/before/memories")).json()["memories"]
        assert sorted((m["text"], m["status"], m["in_force"], m["tier"]) for m in listed) == [
            ("I live in Lyon.", "active", True, "session"),  # the session that wrote it
            ("Invoices go to finance@example.com.", "active", True, None),
            ("我对花生过敏。", "active", True, "session"),
        ]
        # The user says it in a new session: the item written before is promoted, not doubled.
        assert (await client.put("/v1/sessions/after", json={"user_id": "u-1"})).status_code == 200
        turns = [{"role": "user", "content": "我对花生过敏，记得哦。"}]
        appended = await client.post("/v1/sessions/after/turns", json={"turns": turns})
        assert appended.status_code == 201, appended.text
        mine = [m for m in (await client.get("/v1/sessions/after/memories")).json()["memories"]]
        assert sorted((m["text"], m["tier"], m["stable_by"]) for m in mine) == [
            ("I live in Lyon.", "candidate", []),
            ("我对花生过敏。", "long_term", ["sessions", "contexts"]),
        ]
        built = await client.post(
            "/v1/sessions/after/build-prompt", json={"query": "where do I live? 过敏"}
        )
        assert built.status_code == 200, built.text
        shown = "\n".join(m["content"] or "" for m in built.json()["messages"])
        assert "I live in Lyon." in shown and "Paris" not in shown
