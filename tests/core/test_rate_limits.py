"""Per-key and per-session (`remember`) rate limits hold with Redis up and with Redis down."""

import asyncio

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.conftest import new_key
from tests.support.loopback import closed_port_url
from tests.support.server import run_server


def with_redis(settings: Settings, up: bool, **limits: int) -> Settings:
    redis_url = settings.redis_url if up else closed_port_url().replace("http", "redis")
    return settings.model_copy(
        update={
            "redis_url": redis_url,
            "limits": settings.limits.model_copy(update=limits),
        }
    )


@pytest.mark.parametrize("redis_up", [True, False], ids=["redis up", "redis down"])
async def test_each_key_has_its_own_per_minute_limit(
    settings: Settings, engine: AsyncEngine, tenant_name: str, redis_up: bool
) -> None:
    first = await new_key(engine, tenant_name, ["sessions:read"])
    second = await new_key(engine, tenant_name, ["sessions:read"])
    with run_server(with_redis(settings, redis_up, requests_per_minute_per_key=5)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            statuses = [
                (await http.get("/v1/sessions/r", headers={"Authorization": f"Bearer {first}"}))
                for _ in range(7)
            ]
            assert [r.status_code for r in statuses] == [404] * 5 + [429] * 2
            limited = statuses[-1]
            assert limited.headers["retry-after"] == "60"
            assert limited.json()["error"]["code"] == "rate_limited"
            assert limited.json()["error"]["field"] == "Authorization"
            assert limited.json()["error"]["message"] == (
                "requests with this API key: at most 5 a minute; try again later"
            )
            other = await http.get("/v1/sessions/r", headers={"Authorization": f"Bearer {second}"})
            assert other.status_code == 404


@pytest.mark.parametrize("redis_up", [True, False], ids=["redis up", "redis down"])
async def test_build_prompt_counts_against_the_keys_limit_before_it_builds(
    settings: Settings, engine: AsyncEngine, tenant_name: str, redis_up: bool
) -> None:
    """build-prompt counts the request while it reads the session: within the limit every build
    answers, above it a 429 (before anything is built), and a key without `sessions:read` is
    counted too (429 once over the limit, 403 within it)."""
    writer = await new_key(engine, tenant_name, ["sessions:read", "sessions:write"])
    reader = await new_key(engine, tenant_name, ["sessions:read"])
    no_read = await new_key(engine, tenant_name, ["sessions:write"])
    limits = {"requests_per_minute_per_key": 3}
    with run_server(with_redis(settings, redis_up, **limits)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            made = await http.post(
                "/v1/sessions/rl-build/turns",
                json={"turns": [{"role": "user", "content": "订单号是 AB-12345"}]},
                headers={"Authorization": f"Bearer {writer}"},
            )
            assert made.status_code == 201, made.text

            async def builds(key: str, n: int) -> list[httpx.Response]:
                return [
                    await http.post(
                        "/v1/sessions/rl-build/build-prompt",
                        json={"query": "what was the order number? 订单号是多少?"},
                        headers={"Authorization": f"Bearer {key}"},
                    )
                    for _ in range(n)
                ]

            answered = await builds(reader, 5)
            refused = await builds(no_read, 4)
    assert [r.status_code for r in answered] == [200] * 3 + [429] * 2
    assert [m["content"] for m in answered[0].json()["messages"]] == [
        "订单号是 AB-12345",
        "what was the order number? 订单号是多少?",
    ]
    assert answered[1].json()["messages"] == answered[0].json()["messages"]
    limited = answered[-1].json()["error"]
    assert (limited["code"], limited["field"]) == ("rate_limited", "Authorization")
    assert [r.status_code for r in refused] == [403] * 3 + [429]


async def test_remember_limit_holds_with_redis_down(settings: Settings, api_key: str) -> None:
    with run_server(with_redis(settings, False)) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        ) as http:
            made = await http.post(
                "/v1/sessions/rl/turns", json={"turns": [{"role": "user", "content": "hi"}]}
            )
            assert made.status_code == 201
            calls = [
                http.post(
                    "/v1/sessions/rl/memory",
                    json={"type": "remember", "text": f"point {i}: {'abcdefgh'[i % 8] * (i + 1)}"},
                )
                for i in range(40)
            ]
            answers = await asyncio.gather(*calls)
    statuses = sorted(r.status_code for r in answers)
    limit = settings.memory.remember_per_minute
    assert statuses == [200] * limit + [429] * (40 - limit)
