"""Offload throughput on a 10,000-turn session (embedded Postgres, 2-core machine).

    .venv/bin/python -m benchmarks.offload_throughput [--turns 10000] [--runs 3]

Appends N turns with a large window (no trigger), then shrinks the window and times one offload
(chunking + chunk inserts + turn marking, one transaction). Prints turns/s and chunks/s per run,
the median, and the peak RSS of this process.
"""

import argparse
import asyncio
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from app.core.cache import Cache
from app.core.config import load_settings
from app.core.migrate import upgrade
from app.embedded import EmbeddedStack
from app.offload.service import offload_session
from app.sessions import repository as sessions_repository
from tests.support.factories import append, configure, new_caller, transaction

WORDS = "budget train Lyon order hotel price window seat invoice 预算 火车 订单 酒店".split()


async def one_run(engine, settings, cache, turns: int) -> tuple[float, int, int]:
    caller = await new_caller(engine)
    sid = "bench"
    await configure(engine, caller, settings, cache, sid, context_limit=10_000_000)
    rng = random.Random(7)
    for start in range(0, turns, 100):
        batch = [
            {
                "role": "user" if (start + i) % 2 == 0 else "assistant",
                "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 60))),
            }
            for i in range(min(100, turns - start))
        ]
        await append(engine, caller, settings, cache, sid, batch)
    await configure(engine, caller, settings, cache, sid, context_limit=8_000, reserve_tokens=500)
    async with transaction(engine) as db:
        session = await sessions_repository.get_session(db, caller.tenant_id, sid)
        assert session is not None
        pk = session.id
    started = time.perf_counter()
    async with transaction(engine) as db:
        result = await offload_session(db, settings, cache, pk, trigger="benchmark")
    elapsed = time.perf_counter() - started
    assert result is not None
    return elapsed, result.turns_moved, result.chunks_written


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        upgrade(stack.database_url)
        settings = load_settings(database_url=stack.database_url, redis_url=stack.redis_url)
        from app.core.db import create_engine

        engine = create_engine(settings)
        cache = Cache(settings.redis_url, settings.cache)
        rates = []
        for run in range(args.runs):
            elapsed, moved, chunks = await one_run(engine, settings, cache, args.turns)
            rates.append((moved / elapsed, chunks / elapsed))
            print(
                f"run {run + 1}: {moved} turns -> {chunks} chunks in {elapsed:.2f}s "
                f"({moved / elapsed:.0f} turns/s, {chunks / elapsed:.0f} chunks/s)"
            )
        print(
            f"median: {statistics.median(r[0] for r in rates):.0f} turns/s, "
            f"{statistics.median(r[1] for r in rates):.0f} chunks/s"
        )
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        await cache.aclose()
        await engine.dispose()
        stack.stop()


if __name__ == "__main__":
    asyncio.run(main())
