"""A session delete is erased in its request (the receipt complete in the answer), its job kept
for a process that dies; a run whose cache hunt fails leaves every row and text for the retry;
two runs of one receipt take turns on its row."""

import asyncio
import uuid

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import create_sessionmaker
from app.domain.callers import ALL_SCOPES, Caller
from app.erasure.erase import run_erase
from app.erasure.service import delete_session
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from tests.erasure.test_erase_job import receipt, receipt_tenant
from tests.support.factories import session_of_key, tenant_of, transaction
from tests.support.waiting import wait_for

MARKER = "Quetzalharbour lockers 7731"
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


async def stored_session(admin: httpx.AsyncClient) -> str:
    sid = f"erase-{uuid.uuid4().hex[:8]}"
    turns = [
        {"role": "user", "content": f"My {MARKER} code, please keep it."},
        {"role": "assistant", "content": "Kept."},
    ]
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).is_success
    return sid


async def rows_of(engine: AsyncEngine, pk: uuid.UUID) -> tuple[int, int]:
    """(the session row, its turns quoting the marker)."""
    async with engine.connect() as conn:
        row = await conn.execute(
            text(
                "SELECT (SELECT count(*) FROM sessions WHERE id = :pk), "
                "(SELECT count(*) FROM turns WHERE session_id = :pk AND content LIKE :m)"
            ),
            {"pk": pk, "m": f"%{MARKER}%"},
        )
        found = row.one()
    return int(found[0]), int(found[1])


async def tombstoned(
    engine: AsyncEngine, settings: Settings, cache: Cache, pk: uuid.UUID, sid: str
) -> uuid.UUID:
    """The session tombstoned without the request's inline erase: its receipt, pending."""
    async with transaction(engine) as db:
        row = await sessions_store.get_session_by_pk(db, await tenant_of(db, pk), pk)
        assert row is not None
        caller = Caller(row.tenant_id, "admin", frozenset(s.value for s in ALL_SCOPES), None)
        erased = await delete_session(db, caller, settings, cache, sid)
        assert erased.status == "pending"
        return uuid.UUID(erased.erase_receipt_id)


async def test_a_session_delete_is_erased_in_its_request(
    admin: httpx.AsyncClient, admin_key: str, engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    sid = await stored_session(admin)
    pk = await session_of_key(engine, admin_key, sid)
    copy = cache.key("probe", sid)
    await cache.set_json(copy, {"quoted": f"the {MARKER} code"})

    deleted = await admin.delete(f"/v1/sessions/{sid}")
    assert deleted.status_code == 202, deleted.text
    assert deleted.json()["status"] == "completed"  # the answer says it is already erased
    receipt_id = uuid.UUID(deleted.json()["erase_receipt_id"])
    answer = (await admin.get(f"/v1/erase-receipts/{receipt_id}")).json()
    assert answer["status"] == "completed" and answer["attempts"] == 1
    assert answer["stores"]["session"]["deleted"] is True
    assert answer["stores"]["redis"]["keys_deleted"] >= 1
    assert await rows_of(engine, pk) == (0, 0)
    assert await cache.get_json(copy) is None

    # Its job waits (for a process that died before the erase), then finds nothing to do.
    async with engine.connect() as conn:
        waiting = await conn.scalar(
            text(
                "SELECT count(*) FROM procrastinate_jobs WHERE args->>'receipt_id' = :r "
                "AND status = 'todo' AND scheduled_at > now()"
            ),
            {"r": str(receipt_id)},
        )
    assert waiting == 1
    async with httpx.AsyncClient() as http:
        tenant = await receipt_tenant(engine, receipt_id)
        again = await run_erase(
            create_sessionmaker(engine), settings, cache, http, tenant, receipt_id
        )
    assert again is False
    assert (await receipt(engine, receipt_id))["attempts"] == 1


async def test_the_inline_bound_counts_the_bytes_of_the_turn_texts(
    admin: httpx.AsyncClient, admin_key: str, engine: AsyncEngine
) -> None:
    sid = f"bytes-{uuid.uuid4().hex[:8]}"
    texts = ["Grüße aus Köln", "你好，世界", "plain"]
    turns = [{"role": "user", "content": t} for t in texts]
    assert (await admin.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).is_success
    pk = await session_of_key(engine, admin_key, sid)
    async with transaction(engine) as db:
        assert await turns_store.session_text_bytes(db, await tenant_of(db, pk), pk) == sum(
            len(t.encode()) for t in texts
        )
        assert await turns_store.session_text_bytes(db, uuid.uuid4(), uuid.uuid4()) == 0


async def test_a_failed_cache_hunt_leaves_every_row_for_the_retry(
    admin: httpx.AsyncClient, admin_key: str, engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    sid = await stored_session(admin)
    pk = await session_of_key(engine, admin_key, sid)
    receipt_id = await tombstoned(engine, settings, cache, pk, sid)
    maker = create_sessionmaker(engine)

    down = Cache(UNREACHABLE_REDIS, settings.cache)
    try:
        async with httpx.AsyncClient() as http:
            failed: BaseException | None = None
            try:
                await run_erase(
                    maker,
                    settings,
                    down,
                    http,
                    await receipt_tenant(engine, receipt_id),
                    receipt_id,
                )
            except RuntimeError as exc:
                failed = exc
    finally:
        await down.aclose()
    assert failed is not None and "redis erase failed" in str(failed)
    found = await receipt(engine, receipt_id)
    assert found["status"] == "pending" and found["attempts"] == 1
    assert await rows_of(engine, pk) == (1, 1)  # the texts are still there to hunt with

    async with httpx.AsyncClient() as http:
        assert (
            await run_erase(
                maker, settings, cache, http, await receipt_tenant(engine, receipt_id), receipt_id
            )
            is True
        )
    found = await receipt(engine, receipt_id)
    assert found["status"] == "completed" and found["attempts"] == 2
    assert await rows_of(engine, pk) == (0, 0)


async def test_two_runs_of_one_receipt_take_turns(
    admin: httpx.AsyncClient, admin_key: str, engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    sid = await stored_session(admin)
    pk = await session_of_key(engine, admin_key, sid)
    receipt_id = await tombstoned(engine, settings, cache, pk, sid)

    async with engine.connect() as first:  # the first run: the receipt row locked
        await first.execute(
            text("SELECT id FROM erase_receipts WHERE id = :r FOR UPDATE"), {"r": receipt_id}
        )
        tenant = await receipt_tenant(engine, receipt_id)
        async with httpx.AsyncClient() as http:
            second = asyncio.create_task(
                run_erase(create_sessionmaker(engine), settings, cache, http, tenant, receipt_id)
            )

            async def waiting_on_a_lock() -> int:
                async with engine.connect() as conn:
                    found = await conn.scalar(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND query LIKE 'UPDATE erase_receipts%'"
                        )
                    )
                return int(found or 0)

            await wait_for(waiting_on_a_lock, lambda n: n == 1, what="the second run to wait")
            assert not second.done()
            # The first run completes the receipt (here: says so) and commits.
            await first.execute(
                text("UPDATE erase_receipts SET status = 'completed' WHERE id = :r"),
                {"r": receipt_id},
            )
            await first.commit()
            assert await second is False
    assert await rows_of(engine, pk) == (1, 1)  # the second run erased nothing beside the first
