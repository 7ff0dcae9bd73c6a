import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.service import create_key, list_keys, revoke_key
from app.core.db import create_sessionmaker, unit_of_work
from app.core.errors import InvalidInput, NotFound
from tests.conftest import new_key
from tests.support.server import RunningServer

TURN = {"turns": [{"role": "user", "content": "secret plan"}]}


async def count_turns(engine: AsyncEngine, tenant: str) -> int:
    async with engine.connect() as conn:
        return int(
            await conn.scalar(
                text(
                    "SELECT count(*) FROM turns t JOIN tenants n ON n.id = t.tenant_id "
                    "WHERE n.name = :t"
                ),
                {"t": tenant},
            )
        )


async def test_missing_and_invalid_keys_are_401(
    server: RunningServer, engine: AsyncEngine, tenant_name: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        missing = await http.post("/v1/sessions/a/turns", json=TURN)
        wrong = await http.post(
            "/v1/sessions/a/turns", json=TURN, headers={"Authorization": "Bearer ctxd_nope"}
        )
        basic = await http.post(
            "/v1/sessions/a/turns", json=TURN, headers={"Authorization": "Basic abc"}
        )
    for resp in (missing, wrong, basic):
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "unauthorized"
        assert resp.json()["error"]["field"] == "Authorization"
    assert await count_turns(engine, tenant_name) == 0


async def test_another_tenants_session_is_not_found(
    server: RunningServer, client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    assert (await client.post("/v1/sessions/private/turns", json=TURN)).status_code == 201
    other_key = await new_key(engine, tenant_name + "-other", ["sessions:read", "sessions:write"])
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {other_key}"}
    ) as other:
        assert (await other.get("/v1/sessions/private")).status_code == 404
        listed = await other.get("/v1/sessions/private/turns")
        assert listed.status_code == 404
        assert listed.json()["error"]["code"] == "not_found"
        assert (await other.delete("/v1/sessions/private")).status_code == 404
        # Writing to the same id creates the other tenant's own, separate session.
        own = await other.post("/v1/sessions/private/turns", json=TURN)
        assert own.json()["turns"][0]["seq"] == 1
    assert await count_turns(engine, tenant_name) == 1
    mine = (await client.get("/v1/sessions/private/turns")).json()["turns"]
    assert [t["content"] for t in mine] == ["secret plan"]


async def test_read_only_key_cannot_write(
    server: RunningServer, engine: AsyncEngine, tenant_name: str
) -> None:
    key = await new_key(engine, tenant_name, ["sessions:read"])
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        resp = await http.post("/v1/sessions/ro/turns", json=TURN)
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "forbidden"
    assert await count_turns(engine, tenant_name) == 0


async def test_keys_are_stored_hashed(engine: AsyncEngine, tenant_name: str) -> None:
    key = await new_key(engine, tenant_name, ["sessions:read"])
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT key_hash, key_prefix FROM api_keys"))).all()
    assert all(key not in (h, p) for h, p in stored)
    assert any(key.startswith(p) for _, p in stored)


async def test_a_revoked_key_is_refused_at_its_next_request(
    server: RunningServer, engine: AsyncEngine, tenant_name: str
) -> None:
    kept = await new_key(engine, tenant_name, ["sessions:read"])
    revoked = await new_key(engine, tenant_name, ["sessions:read"])
    sessionmaker = create_sessionmaker(engine)
    async with unit_of_work(sessionmaker) as db:
        (first, second) = await list_keys(db, tenant_name)
    async with httpx.AsyncClient(base_url=server.url) as http:

        async def status(key: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            return (await http.get("/v1/sessions/any", headers=headers)).status_code

        assert (await status(kept), await status(revoked)) == (404, 404)  # known, no session
        async with unit_of_work(sessionmaker) as db:
            record = await revoke_key(db, second.key_id)
        assert (record.key_id, record.tenant, record.prefix) == (
            second.key_id,
            tenant_name,
            revoked[:11],
        )
        assert (await status(kept), await status(revoked)) == (404, 401)
    async with unit_of_work(sessionmaker) as db:
        again = await revoke_key(db, second.key_id)
        listed = await list_keys(db, tenant_name)
    assert again.revoked_at == record.revoked_at is not None
    assert [(k.key_id, k.revoked_at) for k in listed] == [
        (first.key_id, None),
        (second.key_id, record.revoked_at),
    ]


async def test_tenant_names_are_checked_and_an_unknown_tenant_is_not_found(
    engine: AsyncEngine, tenant_name: str
) -> None:
    sessionmaker = create_sessionmaker(engine)
    for bad in ("", f" {tenant_name}", f"{tenant_name}\n", "x" * 129):
        with pytest.raises(InvalidInput) as refused:
            async with unit_of_work(sessionmaker) as db:
                await create_key(db, bad, ["sessions:read"])
        assert refused.value.field == "tenant"
    async with unit_of_work(sessionmaker) as db:
        with pytest.raises(NotFound):
            await list_keys(db, tenant_name)
        with pytest.raises(NotFound):
            await revoke_key(db, "00000000-0000-0000-0000-000000000000")
        with pytest.raises(InvalidInput):
            await revoke_key(db, "not-a-key-id")
