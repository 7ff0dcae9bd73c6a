"""Read-only endpoints on the primary against a streaming replica (`DATABASE_REPLICA_URL`), on
one embedded PostgreSQL and a hot standby of it on loopback (tests/support/replica.py):

    .venv/bin/python -m benchmarks.read_replica [--turns 200] [--reads 300]

One session of `--turns` turns (English and Chinese), then, against an API without a replica and
one with it, `--reads` sequential reads of each endpoint. Prints, per setup and endpoint, the
median and p95 (milliseconds, client side; the APIs run in this process) and the table rows each
read made PostgreSQL read, on the primary and on the replica (`pg_stat_user_tables`: rows read by
sequential scans and fetched by index scans, once the servers have flushed their statistics):
what a replica takes off the primary. Then the share of the reads the replicated API served
from the replica (`contextd_db_reads_total`).
"""

import argparse
import asyncio
import re
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from sqlalchemy.ext.asyncio import create_async_engine

from app.auth.service import create_key
from app.core.config import Settings, load_settings, to_sqlalchemy_url
from app.core.db import create_sessionmaker, unit_of_work
from app.core.migrate import upgrade
from app.domain.callers import DEFAULT_SCOPES
from app.runtime.embedded import EmbeddedStack
from benchmarks.append_latency import percentile
from tests.support.replica import StreamingReplica
from tests.support.server import run_server
from tests.support.waiting import wait_for

STATS_QUIET_SECONDS = 1.5  # a backend flushes its statistics within a second of going idle
# Rows read from contextd's tables (not the catalogs, which this query itself reads).
ROWS = "SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0) FROM pg_stat_user_tables"


async def new_key(database_url: str) -> str:
    engine = create_async_engine(to_sqlalchemy_url(database_url))
    async with unit_of_work(create_sessionmaker(engine)) as db:
        key, _ = await create_key(db, f"bench-{uuid.uuid4().hex[:8]}", DEFAULT_SCOPES)
    await engine.dispose()
    return key


def rows_read(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(ROWS).fetchone()
    assert row is not None
    return int(row[0])


async def settled_rows(url: str) -> int:
    """The server's row count once it stops moving (every backend flushed its statistics)."""
    last: list[int] = [-1]

    async def probe() -> tuple[int, int]:
        await asyncio.sleep(STATS_QUIET_SECONDS)
        previous, last[0] = last[0], rows_read(url)
        return previous, last[0]

    _, now = await wait_for(probe, lambda p: p[0] == p[1], timeout=60, what="statistics")
    return now


async def session_of(http: httpx.AsyncClient, turns: int) -> str:
    sid = f"replica-bench-{uuid.uuid4().hex[:8]}"
    for first in range(0, turns, 20):
        batch = [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"第 {i} 轮：订单 A-{1000 + i} 的退款已经处理。"
                if i % 3 == 0
                else f"Turn {i}: the refund for order B-{i} was approved on Friday.",
            }
            for i in range(first, min(first + 20, turns))
        ]
        resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": batch})
        assert resp.is_success, resp.text
    return sid


async def timed_reads(http: httpx.AsyncClient, path: str, reads: int) -> list[float]:
    out = []
    for _ in range(reads):
        started = time.perf_counter()
        resp = await http.get(path)
        out.append((time.perf_counter() - started) * 1000)
        assert resp.status_code == 200, resp.text
    return out


async def served(http: httpx.AsyncClient) -> dict[str, int]:
    text = (await http.get("/metrics")).text
    found = re.findall(r'contextd_db_reads_total\{server="(\w+)"\} ([0-9.e+]+)', text)
    return {server: int(float(count)) for server, count in found}


async def measure(
    settings: Settings, replica: StreamingReplica, key: str, turns: int, reads: int
) -> None:
    replicated = settings.model_copy(update={"database_replica_url": replica.url})
    primary_url, replica_url = settings.database_url or "", replica.url
    headers = {"Authorization": f"Bearer {key}"}
    print("| setup | read | median ms | p95 ms | primary rows/read | replica rows/read |")
    print("|---|---|---|---|---|---|")
    with run_server(settings) as plain, run_server(replicated) as with_replica:
        async with (
            httpx.AsyncClient(base_url=plain.url, headers=headers, timeout=30) as first,
            httpx.AsyncClient(base_url=with_replica.url, headers=headers, timeout=30) as second,
        ):
            sid = await session_of(first, turns)
            await wait_for(
                lambda: second.get(f"/v1/sessions/{sid}"),
                lambda r: r.status_code == 200 and r.json()["counts"]["turns"] == turns,
                what="the replica to replay the session",
            )
            paths = {
                "GET turns (100)": f"/v1/sessions/{sid}/turns?limit=100",
                "GET session": f"/v1/sessions/{sid}",
                "GET sessions": "/v1/sessions",
            }
            for setup, http in (("primary only", first), ("replica", second)):
                for name, path in paths.items():
                    on_primary, on_replica = (
                        await settled_rows(primary_url),
                        await settled_rows(replica_url),
                    )
                    ms = await timed_reads(http, path, reads)
                    primary_rows = (await settled_rows(primary_url) - on_primary) / reads
                    replica_rows = (await settled_rows(replica_url) - on_replica) / reads
                    print(
                        f"| {setup} | {name} | {statistics.median(ms):.2f} | "
                        f"{percentile(ms, 0.95):.2f} | {primary_rows:.1f} | {replica_rows:.1f} |"
                    )
            counts = await served(second)
    share = counts["replica"] / max(1, counts["replica"] + counts["primary"])
    print(f"\nreads served by the replica (replicated API): {share:.1%} of {sum(counts.values())}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--reads", type=int, default=300)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="read-replica-") as tmp,
        tempfile.TemporaryDirectory(prefix="read-replica-standby-") as standby,
    ):
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        try:
            upgrade(stack.database_url)
            settings = load_settings(
                database_url=stack.database_url,
                redis_url=stack.redis_url,
                embedding={"kind": "none"},
            )
            key = asyncio.run(new_key(stack.database_url))
            started = time.perf_counter()
            replica = StreamingReplica(
                stack.database_url, stack.data_dir.resolve() / "pg", Path(standby)
            )
            replica.start()
            print(f"replica made and started in {time.perf_counter() - started:.1f} s\n")
            try:
                asyncio.run(measure(settings, replica, key, args.turns, args.reads))
            finally:
                replica.stop()
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
