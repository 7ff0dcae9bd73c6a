"""The memory tool through HTTP: recall latency and forget → erase completion time.

    .venv/bin/python -m benchmarks.memory_tool [--turns 600] [--queries 200] [--forgets 10]

Starts an embedded stack, the API and a worker (lexical recall, no embedder), appends N turns with
planted facts to a small-window session and offloads them with the `offload` type; then times
`recall` calls (p50/p95, client side, including HTTP and JSON) and, for a few chunks, the time from
the `forget` call to the erase receipt reaching `completed`.
"""

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from app.auth.service import create_key
from app.core.config import load_settings
from app.core.db import create_engine, create_sessionmaker, unit_of_work
from app.core.migrate import upgrade
from app.domain.callers import ALL_SCOPES
from app.runtime.embedded import EmbeddedStack
from tests.support.server import run_server

WORDS = "budget train Lyon order hotel price window seat invoice 预算 火车 订单 酒店".split()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(url: str, key: str, turns: int, queries: int, forgets: int) -> None:
    rng = random.Random(7)
    sid = "bench"
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as http:
        await http.put(f"/v1/sessions/{sid}", json={"context_limit": 8000, "reserve_tokens": 500})
        for start in range(0, turns, 100):
            batch = []
            for i in range(start, min(turns, start + 100)):
                text = " ".join(rng.choices(WORDS, k=rng.randint(10, 60)))
                if i % 10 == 0:
                    text += f" Order ORD-{i:05d} costs {100 + i} EUR."
                batch.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
            await http.post(f"/v1/sessions/{sid}/turns", json={"turns": batch})
        await http.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
        chunks = (await http.get(f"/v1/sessions/{sid}/chunks", params={"limit": 500})).json()[
            "chunks"
        ]
        print(f"session: {turns} turns, {len(chunks)} chunks offloaded")

        latencies: list[float] = []
        matched = 0
        for q in range(queries):
            i = rng.randrange(0, turns // 2, 10)
            query = f"how much was order ORD-{i:05d}?" if q % 2 else "what was the hotel budget"
            started = time.perf_counter()
            resp = await http.post(
                f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query}
            )
            latencies.append((time.perf_counter() - started) * 1000)
            matched += bool(resp.json()["data"]["matches"])
        print(
            f"recall via the tool: p50 {pct(latencies, 0.5):.1f} ms, "
            f"p95 {pct(latencies, 0.95):.1f} ms, mean {statistics.mean(latencies):.1f} ms "
            f"({queries} calls, {matched} with matches)"
        )

        durations: list[float] = []
        for chunk in chunks[:forgets]:
            started = time.perf_counter()
            resp = await http.post(
                f"/v1/sessions/{sid}/memory", json={"type": "forget", "chunk_id": chunk["chunk_id"]}
            )
            forget_ms = (time.perf_counter() - started) * 1000
            receipt = resp.json()["data"]["erase_receipt_id"]
            while True:
                state = (await http.get(f"/v1/erase-receipts/{receipt}")).json()
                if state["status"] == "completed":
                    break
                await asyncio.sleep(0.02)
            durations.append((time.perf_counter() - started) * 1000)
            print(f"  forget {forget_ms:.1f} ms (tombstoned), erased after {durations[-1]:.0f} ms")
        if durations:
            print(
                f"forget → erase completed: p50 {pct(durations, 0.5):.0f} ms, "
                f"max {max(durations):.0f} ms ({len(durations)} forgets)"
            )


async def make_key(database_url: str) -> str:
    settings = load_settings(database_url=database_url)
    engine = create_engine(settings)
    async with unit_of_work(create_sessionmaker(engine)) as db:
        key, _ = await create_key(
            db, f"bench-{uuid.uuid4().hex[:8]}", [s.value for s in ALL_SCOPES]
        )
    await engine.dispose()
    return key


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--forgets", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="contextd-bench-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        try:
            upgrade(stack.database_url)
            settings = load_settings(
                database_url=stack.database_url,
                redis_url=stack.redis_url,
                embedding={"kind": "none"},
                memory={"remember_per_minute": 1000},
            )
            key = asyncio.run(make_key(stack.database_url))
            with run_server(settings, with_worker=True) as server:
                asyncio.run(run(server.url, key, args.turns, args.queries, args.forgets))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
