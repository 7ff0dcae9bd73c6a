"""Idempotency records hold for `db.idempotency_ttl_hours`: within it a replay answers the first
response (and a different request under the key is a 409); past it the key is new again, and the
worker's hourly purge deletes the record, oldest first, a batch per transaction."""

from datetime import timedelta

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.store import turns as turns_store

DAY = timedelta(hours=24)  # the default lifetime (`CONTEXTD_DB__IDEMPOTENCY_TTL_HOURS`)


async def age(engine: AsyncEngine, tenant: str, key: str, hours: int) -> None:
    """Make the tenant's record of `key` `hours` old."""
    async with engine.begin() as conn:
        aged = await conn.execute(
            text(
                "UPDATE idempotency_keys i SET created_at = now() - make_interval(hours => :h) "
                "FROM tenants n WHERE n.id = i.tenant_id AND n.name = :tenant AND i.key = :key"
            ),
            {"h": hours, "tenant": tenant, "key": key},
        )
        assert aged.rowcount == 1


async def keys_of(engine: AsyncEngine, tenant: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT i.key FROM idempotency_keys i JOIN tenants n ON n.id = i.tenant_id "
                "WHERE n.name = :tenant ORDER BY i.key"
            ),
            {"tenant": tenant},
        )
        return [r[0] for r in rows]


async def test_a_key_past_its_lifetime_is_new_again(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    async def send(content: str) -> httpx.Response:
        return await client.post(
            "/v1/sessions/idem-life/turns",
            json={"turns": [{"role": "user", "content": content}]},
            headers={"Idempotency-Key": "order-7"},
        )

    first = await send("book the 9:40 train")
    assert first.status_code == 201
    assert (await send("book the 10:10 train")).status_code == 409  # within the lifetime
    await age(engine, tenant_name, "order-7", 25)
    again = await send("预订十点十分的火车")
    assert again.status_code == 201 and again.headers.get("Idempotent-Replayed") is None
    assert [t["seq"] for t in again.json()["turns"]] == [2]
    replay = await send("预订十点十分的火车")  # the claim renewed the record's lifetime
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["turns"] == again.json()["turns"]


async def test_the_purge_deletes_expired_records_a_batch_at_a_time(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    for key in ("k-old-1", "k-old-2", "k-fresh"):
        resp = await client.post(
            "/v1/sessions/idem-purge/turns",
            json={"turns": [{"role": "user", "content": f"turn under {key}"}]},
            headers={"Idempotency-Key": key},
        )
        assert resp.status_code == 201
    await age(engine, tenant_name, "k-old-1", 30)
    await age(engine, tenant_name, "k-old-2", 26)
    purged = []
    for _ in range(3):
        async with AsyncSession(engine) as db, db.begin():
            purged.append(await turns_store.purge_idempotency_records(db, DAY, limit=1))
    assert purged == [1, 1, 0]
    assert await keys_of(engine, tenant_name) == ["k-fresh"]
