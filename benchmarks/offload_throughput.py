"""Offload throughput on a 10,000-turn session (embedded Postgres, 2-core machine).

    .venv/bin/python -m benchmarks.offload_throughput [--turns 10000] [--runs 3]

Appends N turns with a large window (no trigger), then shrinks the window and times one offload
(chunking + chunk inserts + turn marking, one transaction). Prints turns/s and chunks/s per run,
the median, the CPU time each side spent (this process, and the PostgreSQL backend of the
offload's transaction: on a shared machine wall time follows the load, CPU time much less), and
the peak RSS of this process.
"""

import argparse
import asyncio
import random
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from app.core.cache import Cache
from app.core.config import load_settings
from app.core.migrate import upgrade
from app.offload.service import offload_session
from app.runtime.embedded import EmbeddedStack
from app.store import sessions as sessions_store
from benchmarks.floor_compare import cpu_seconds
from tests.support.factories import append, configure, new_caller, transaction

WORDS = "budget train Lyon order hotel price window seat invoice 预算 火车 订单 酒店".split()


@dataclass(frozen=True)
class Run:
    seconds: float
    python_cpu: float  # this process, all threads
    postgres_cpu: float  # the backend that ran the offload's transaction
    moved: int
    chunks: int


async def one_run(engine, settings, cache, turns: int) -> Run:
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
        session = await sessions_store.get_session(db, caller.tenant_id, sid)
        assert session is not None
        pk = session.id
    started, cpu = time.perf_counter(), time.process_time()
    async with transaction(engine) as db:
        backend = int((await db.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        backend_cpu = cpu_seconds(backend)
        result = await offload_session(
            db, settings, cache, caller.tenant_id, pk, trigger="benchmark"
        )
    elapsed = time.perf_counter() - started
    assert result is not None
    return Run(
        elapsed,
        time.process_time() - cpu,
        cpu_seconds(backend) - backend_cpu,
        result.turns_moved,
        result.chunks_written,
    )


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
        runs = []
        for n in range(args.runs):
            run = await one_run(engine, settings, cache, args.turns)
            runs.append(run)
            print(
                f"run {n + 1}: {run.moved} turns -> {run.chunks} chunks in {run.seconds:.2f}s "
                f"({run.moved / run.seconds:.0f} turns/s, {run.chunks / run.seconds:.0f} "
                f"chunks/s); CPU python {run.python_cpu:.2f}s, postgres {run.postgres_cpu:.2f}s"
            )
        python = statistics.median(1e4 * r.python_cpu / r.moved for r in runs)
        postgres = statistics.median(1e4 * r.postgres_cpu / r.moved for r in runs)
        print(
            f"median: {statistics.median(r.moved / r.seconds for r in runs):.0f} turns/s, "
            f"{statistics.median(r.chunks / r.seconds for r in runs):.0f} chunks/s; CPU per "
            f"10,000 turns python {python:.2f}s, postgres {postgres:.2f}s"
        )
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        await cache.aclose()
        await engine.dispose()
        stack.stop()


if __name__ == "__main__":
    asyncio.run(main())
