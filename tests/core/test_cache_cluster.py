"""Redis Cluster: three Valkey primaries on loopback (`tests/support/valkey_cluster.py`).

Every key of one session hashes to one slot (CLUSTER KEYSLOT), versioned values and their floors
work on every primary, a rate limit counts across the cluster when two API processes share it,
and a primary killed mid-run loses nothing: requests answer from Postgres, and the cache is used
again once the primary is back.
"""

import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.ratelimit import RateLimiter
from app.notes.service import notes_cache_key
from app.store.models import Session
from app.store.sessions import session_cache_key
from tests.conftest import new_key
from tests.support.server import run_server
from tests.support.valkey_cluster import ValkeyCluster, valkey_cluster
from tests.support.waiting import wait_for

# Session ids as clients give them: ASCII, Chinese, and braces (which must not move a key's tag).
SESSION_IDS = [f"s-{i}" for i in range(24)] + ["会话-甲", "订单/42", "x}y{z", "{a}"]


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ValkeyCluster]:
    async with valkey_cluster(Path(tmp_path_factory.mktemp("valkey-cluster"))) as running:
        yield running


def on_cluster(settings: Settings, cluster: ValkeyCluster, **limits: int) -> Settings:
    return settings.model_copy(
        update={
            "redis_url": cluster.url,
            "cache": settings.cache.model_copy(update={"cluster": True}),
            "limits": settings.limits.model_copy(update=limits),
        }
    )


@pytest.fixture
async def cluster_cache(settings: Settings, cluster: ValkeyCluster) -> AsyncIterator[Cache]:
    cache = Cache(cluster.url, on_cluster(settings, cluster).cache)
    yield cache
    await cache.aclose()


def session_keys(cache: Cache, tenant_id: uuid.UUID, session_id: str) -> list[str]:
    """Every key contextd writes about one session, from the functions that write them."""
    row = Session(id=uuid.uuid4(), tenant_id=tenant_id, external_id=session_id)
    view = session_cache_key(cache, tenant_id, session_id)
    return [
        view,
        f"{view}:floor",
        notes_cache_key(cache, row, 1),
        notes_cache_key(cache, row, 7),
        cache.session_key("rate:remember", tenant_id, session_id),
    ]


async def test_keys_of_one_session_hash_to_one_slot(
    cluster: ValkeyCluster, cluster_cache: Cache
) -> None:
    tenant = uuid.uuid4()
    primaries = set()
    for session_id in SESSION_IDS:
        keys = session_keys(cluster_cache, tenant, session_id)
        slots = {await cluster.keyslot(key) for key in keys}
        assert len(slots) == 1, (session_id, keys, slots)
        primaries.add(cluster.node_of_slot(slots.pop()))
    assert primaries == {0, 1, 2}  # sessions spread over every primary, not one hot slot


async def test_versioned_values_and_floors_on_every_primary(
    cluster: ValkeyCluster, cluster_cache: Cache
) -> None:
    """A writer's floor refuses a reader's older copy on whichever primary holds the session;
    one delete of keys on all three primaries removes them all."""
    tenant = uuid.uuid4()
    views = [session_cache_key(cluster_cache, tenant, sid) for sid in SESSION_IDS]
    primaries = {cluster.node_of_slot(await cluster.keyslot(key)) for key in views}
    assert primaries == {0, 1, 2}
    for key in views:
        await cluster_cache.set_versioned(key, {"turns": 1}, 1)
        assert await cluster_cache.get_json(key) == {"turns": 1}
        await cluster_cache.invalidate_versioned(key, 2)
        assert await cluster_cache.get_json(key) is None
        await cluster_cache.set_versioned(key, {"turns": 1}, 1)  # read before the write: refused
        assert await cluster_cache.get_json(key) is None
        await cluster_cache.set_versioned(key, {"turns": 2}, 2)
        assert await cluster_cache.get_json(key) == {"turns": 2}
    await cluster_cache.delete(*views)
    assert [await cluster_cache.get_json(key) for key in views] == [None] * len(views)
    assert not cluster_cache.bypassed


async def test_two_limiters_count_one_session_limit_together(
    settings: Settings, cluster: ValkeyCluster
) -> None:
    """Two processes' limiters (two cluster clients) count the same per-session window."""
    first = Cache(cluster.url, on_cluster(settings, cluster).cache)
    second = Cache(cluster.url, on_cluster(settings, cluster).cache)
    try:
        limiters = [RateLimiter(first), RateLimiter(second)]
        tenant = uuid.uuid4()
        for session_id in SESSION_IDS[:6]:
            counts = [
                await limiters[i % 2].hit_session("remember", tenant, session_id) for i in range(7)
            ]
            assert counts == [1, 2, 3, 4, 5, 6, 7]
    finally:
        await first.aclose()
        await second.aclose()


async def test_two_api_processes_share_one_key_limit_on_the_cluster(
    settings: Settings, cluster: ValkeyCluster, engine: AsyncEngine, tenant_name: str
) -> None:
    key = await new_key(engine, tenant_name, ["sessions:read"])
    own = on_cluster(settings, cluster, requests_per_minute_per_key=6)
    with run_server(own) as one, run_server(own) as other:
        async with httpx.AsyncClient(
            timeout=30, headers={"Authorization": f"Bearer {key}"}
        ) as http:
            statuses = [
                (await http.get(f"{(one, other)[i % 2].url}/v1/sessions/none")).status_code
                for i in range(9)
            ]
    assert statuses == [404] * 6 + [429] * 3


async def cluster_keys(cluster: ValkeyCluster) -> list[str]:
    """Every key on every live primary."""
    keys: list[str] = []
    for node in cluster.nodes:
        if node.process is not None and node.process.poll() is None:
            async with node.client() as client:
                keys += [k.decode() async for k in client.scan_iter(match="*", count=1000)]
    return keys


async def test_appends_and_builds_through_the_api_survive_a_killed_primary(
    settings: Settings, cluster: ValkeyCluster, api_key: str
) -> None:
    """Appends, views, build-prompts and remembers on sessions spread over the three primaries;
    one primary SIGKILLed mid-run, then started again (empty). Every request answers, every turn
    is there once, views are never stale, and after the restart the cache is filled again."""
    sessions = [f"e2e-{i}" for i in range(9)]

    async def round_of(http: httpx.AsyncClient, n: int) -> list[int]:
        statuses = []
        for sid in sessions:
            appended = await http.post(
                f"/v1/sessions/{sid}/turns",
                json={"turns": [{"role": "user", "content": f"第 {n} 轮: keep the order AB-{n}"}]},
            )
            statuses.append(appended.status_code)
            view = await http.get(f"/v1/sessions/{sid}")
            statuses.append(view.status_code)
            assert view.json()["counts"]["turns"] == n  # never a view from before the append
            built = await http.post(
                f"/v1/sessions/{sid}/build-prompt", json={"query": f"order AB-{n}?"}
            )
            statuses.append(built.status_code)
            assert built.json()["messages"][-2]["content"].startswith(f"第 {n} 轮")
        return statuses

    with run_server(on_cluster(settings, cluster)) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            before = await round_of(http, 1) + await round_of(http, 2)
            remembered = await http.post(
                f"/v1/sessions/{sessions[0]}/memory",
                json={"type": "remember", "text": "the order is AB-2"},
            )
            assert remembered.status_code == 200, remembered.text
            written = await cluster_keys(cluster)
            watched = next(
                k for k in written if k.endswith(f":{sessions[0]}}}") and ":session:" in k
            )
            victim = cluster.node_of_slot(await cluster.keyslot(watched))
            cluster.kill(victim)
            during = await round_of(http, 3) + await round_of(http, 4)
            ready_during = (await http.get("/readyz")).json()["cache"]["ok"]
            await cluster.restart(victim)

            async def watched_cached() -> bool:
                await http.get(f"/v1/sessions/{sessions[0]}")
                async with cluster.nodes[victim].client() as client:
                    return bool(await client.exists(watched))

            await wait_for(watched_cached, bool, timeout=60, what="the cache to be used again")
            # no view cached before or during the outage is served after it
            counts = [
                (await http.get(f"/v1/sessions/{sid}")).json()["counts"]["turns"]
                for sid in sessions
            ]
            after = await round_of(http, 5)
            refilled = await cluster_keys(cluster)
            turns = {
                sid: [
                    t["seq"] for t in (await http.get(f"/v1/sessions/{sid}/turns")).json()["turns"]
                ]
                for sid in sessions
            }
    ok = {200, 201}
    assert set(before) <= ok and set(during) <= ok and set(after) <= ok
    assert ready_during is False
    assert counts == [4] * len(sessions)
    assert turns == {sid: [1, 2, 3, 4, 5] for sid in sessions}
    kinds = {key.split(":")[2] for key in written}
    assert {"session", "rate"} <= kinds
    assert any(":rate:remember:{" in key for key in written)
    assert any(key.endswith(":floor") for key in refilled)
    by_tag: dict[str, set[int]] = defaultdict(set)
    for key in written + refilled:
        start = key.index("{")  # every key carries a hash tag
        by_tag[key[start : key.index("}", start) + 1]].add(await cluster.keyslot(key))
    assert all(len(slots) == 1 for slots in by_tag.values())
    assert sum(tag.endswith(tuple(f":{sid}}}" for sid in sessions)) for tag in by_tag) == 9


async def test_a_session_delete_erases_its_keys_on_every_primary(
    settings: Settings, cluster: ValkeyCluster, admin_key: str
) -> None:
    """The erase hunt scans every primary, reads values one slot at a time and deletes the
    session's keys and any copy quoting its text, wherever they live; other sessions keep theirs."""
    marker = "Quetzalharbour lockers 7731"
    sessions = [f"erase-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
    doomed = sessions[0]
    with run_server(on_cluster(settings, cluster)) as server:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
        ) as http:
            for sid in sessions:
                content = f"My {marker} code" if sid == doomed else f"nothing secret in {sid}"
                turn = {"turns": [{"role": "user", "content": content}]}
                assert (await http.post(f"/v1/sessions/{sid}/turns", json=turn)).is_success
                assert (await http.get(f"/v1/sessions/{sid}")).status_code == 200
            remembered = await http.post(
                f"/v1/sessions/{doomed}/memory", json={"type": "remember", "text": "lockers"}
            )
            assert remembered.status_code == 200, remembered.text
            cache = Cache(cluster.url, server.settings.cache)
            try:
                tenant = (
                    next(k for k in await cluster_keys(cluster) if k.endswith(f":{doomed}}}"))
                    .split("{")[1]
                    .split(":")[0]
                )
                tag = cache.session_tag(tenant, doomed)
                # a copy quoting the text, kept under every other session's tag (other slots)
                copies = [cache.key("probe", sid) for sid in sessions[1:]]
                for copy in copies:
                    await cache.set_json(copy, {"quoted": f"the {marker} code"})
                nodes = {cluster.node_of_slot(await cluster.keyslot(k)) for k in copies}
                before = [k for k in await cluster_keys(cluster) if tag in k]
                deleted = await http.delete(f"/v1/sessions/{doomed}")
                assert deleted.status_code == 202, deleted.text
                receipt = (
                    await http.get(f"/v1/erase-receipts/{deleted.json()['erase_receipt_id']}")
                ).json()
                left = await cluster_keys(cluster)
                views_left = [
                    await cache.get_json(session_cache_key(cache, tenant, sid))
                    for sid in sessions[1:]
                ]
            finally:
                await cache.aclose()
    assert len(nodes) >= 2  # the copies span primaries
    assert {k.split(":")[2] for k in before} >= {"session", "rate"}
    assert deleted.json()["status"] == "completed"
    assert receipt["stores"]["redis"]["keys_deleted"] >= len(before) + len(copies)
    assert [k for k in left if tag in k or ":probe:" in k] == []
    assert all(view is not None for view in views_left)


async def test_a_process_starting_while_its_url_node_is_down_finds_the_others(
    settings: Settings, cluster: ValkeyCluster
) -> None:
    """With `cluster_nodes`, a new client learns the cluster from another node while the one
    its URL names is down (the others serving their slots: full coverage not required);
    without it, the cache steps aside. (redis-py reads its command table from the primary of
    slot 0, so that one must answer when a client starts: the URL here names the second.)
    Each of several new processes' first command is a write: it must go to its key's node,
    not to whichever node a client that does not know the topology yet picks."""
    for node in cluster.nodes:
        async with node.client() as client:
            await client.config_set("cluster-require-full-coverage", "no")
    down = cluster.nodes[1]
    others = ",".join(f"127.0.0.1:{node.port}" for node in cluster.nodes if node is not down)
    cluster.kill(1)
    cache_settings = on_cluster(settings, cluster).cache
    lone = Cache(down.url, cache_settings)
    starting = [
        Cache(down.url, cache_settings.model_copy(update={"cluster_nodes": others}))
        for _ in range(12)
    ]
    found = starting[0]
    try:
        keys = [found.session_key("session", uuid.uuid4(), sid) for sid in SESSION_IDS]
        live = [k for k in keys if cluster.node_of_slot(await cluster.keyslot(k)) != 1]
        for cache, key in zip(starting, live, strict=False):
            await cache.set_json(key, {"first": key})
        first = [await cache.get_json(key) for cache, key in zip(starting, live, strict=False)]
        for key in live:
            await found.set_json(key, {"found": key})
        stored = [await found.get_json(key) for key in live]
        alone = await lone.get_json(live[0])
    finally:
        await lone.aclose()
        for cache in starting:
            await cache.aclose()
        await cluster.restart(1)
        for node in cluster.nodes:
            async with node.client() as client:
                await client.config_set("cluster-require-full-coverage", "yes")
    assert len(live) >= len(starting)
    assert first == [{"first": key} for key in live[: len(starting)]]
    assert not any(cache.bypassed for cache in starting)
    assert stored == [{"found": key} for key in live] and not found.bypassed
    assert alone is None and lone.bypassed
