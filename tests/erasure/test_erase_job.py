"""The erase job (step two of forget) rebuilds the notes with the deployment's generator, and a
receipt is complete only when every store, the notes included, was cleaned."""

import json
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.schemas import MemoryRequest, MemoryType
from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import create_sessionmaker
from app.erasure.erase import NotesRebuildFailed, run_erase
from app.erasure.service import forget
from app.store import sessions as sessions_store
from tests.notes.test_notes_service import (
    ENGLISH,
    as_turns,
    chat_reply,
    offloaded_session,
    refresh,
    scratchpad,
)
from tests.support.factories import tenant_of, transaction
from tests.support.loopback import loopback_server

REBUILT = {"goal": [{"text": "offsite in Lisbon", "seq": 1, "subject": None, "source": "user"}]}


def llm_settings(settings: Settings, url: str) -> Settings:
    notes = settings.notes.model_copy(
        update={"generator": "llm", "llm_base_url": url, "llm_timeout_seconds": 5}
    )
    return settings.model_copy(update={"notes": notes})


async def forget_turn(
    engine: AsyncEngine, settings: Settings, cache: Cache, pk: uuid.UUID, seq: int
) -> uuid.UUID:
    async with transaction(engine) as db:
        session = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
        assert session is not None
        request = MemoryRequest(type=MemoryType.FORGET, turn_range=[seq, seq])
        _, data = await forget(db, settings, cache, session, request)
    return uuid.UUID(data["erase_receipt_id"])


async def receipt_tenant(engine: AsyncEngine, receipt_id: uuid.UUID) -> uuid.UUID:
    """The tenant of a receipt (what its erase job names besides its id)."""
    async with engine.connect() as conn:
        found = await conn.scalar(
            text("SELECT tenant_id FROM erase_receipts WHERE id = :r"), {"r": receipt_id}
        )
    assert found is not None
    return uuid.UUID(str(found))


async def receipt(engine: AsyncEngine, receipt_id: uuid.UUID) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = await conn.execute(
            text("SELECT status, stores, attempts FROM erase_receipts WHERE id = :r"),
            {"r": receipt_id},
        )
        return dict(row.one()._mapping)


async def test_erase_rebuilds_the_notes_with_the_llm_generator(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    _, pk = await offloaded_session(engine, settings, cache, as_turns(ENGLISH[:6]))
    assert await refresh(engine, settings, cache, pk) == "written"
    receipt_id = await forget_turn(engine, settings, cache, pk, 3)

    with loopback_server(lambda m, p, b: (200, chat_reply(json.dumps(REBUILT)))) as llm:
        async with httpx.AsyncClient(trust_env=False) as http:
            done = await run_erase(
                create_sessionmaker(engine),
                llm_settings(settings, llm.url),
                cache,
                http,
                await receipt_tenant(engine, receipt_id),
                receipt_id,
            )
    assert done is True
    [(_, path, sent)] = llm.requests
    assert path == "/v1/chat/completions"
    prompt = sent["messages"][1]["content"]
    assert "[seq 1 | user]" in prompt and "[seq 3 |" not in prompt  # rebuilt without turn 3
    found = await receipt(engine, receipt_id)
    assert found["status"] == "completed" and found["attempts"] == 1
    assert found["stores"]["notes"]["rebuilt_from_raw_turns"] == "written"
    pad = await scratchpad(engine, pk)
    assert pad["generator"] == "llm"
    assert [item["text"] for item in pad["notes"]["goal"]] == ["offsite in Lisbon"]


async def test_erase_stays_pending_while_the_notes_cannot_be_rebuilt(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    _, pk = await offloaded_session(engine, settings, cache, as_turns(ENGLISH[:6]))
    assert await refresh(engine, settings, cache, pk) == "written"
    receipt_id = await forget_turn(engine, settings, cache, pk, 3)

    with loopback_server(lambda m, p, b: (200, chat_reply("not JSON at all"))) as llm:
        async with httpx.AsyncClient(trust_env=False) as http:
            with pytest.raises(NotesRebuildFailed):
                await run_erase(
                    create_sessionmaker(engine),
                    llm_settings(settings, llm.url),
                    cache,
                    http,
                    await receipt_tenant(engine, receipt_id),
                    receipt_id,
                )
    found = await receipt(engine, receipt_id)
    assert found["status"] == "pending" and found["attempts"] == 1
    assert found["stores"] in ({}, None)
