"""Is the worker fair? One tenant's embedding backlog against another tenant's offload and notes.

    .venv/bin/python -m benchmarks.worker_fairness [--a-turns 5000] [--a-sessions 8]
        [--b-rounds 5] [--cap 120] [--serve-args "..."]

A `contextd dev` with API keys on (default settings otherwise: e5 embeddings, the worker's
default concurrency) and two tenants. Tenant A appends `--a-turns` turns spread over
`--a-sessions` small sessions (an agent tenant runs many sessions at once), 50 turns per append,
two sessions at a time: every session crosses its watermark again and again, and each offload
queues the embedding of its chunks. Once A has appended a fifth of its turns, tenant B's session
crosses its watermark `--b-rounds` times, one round after the other: B appends 4 turns at a time
until an append enqueues an offload, then waits for the offload and for the notes that cover it.

Printed per round: append -> offload, offload -> notes, append -> notes (seconds, polled every
50 ms), and A's embedding jobs waiting at that moment; then the median and p95 of each. A wait
longer than `--cap` seconds ends the run and is counted as the cap (marked `>=`). Last, how long
after its last append B's chunks all have their vectors (embeddings stay first come, first
served: this is the wait behind A's embedding backlog).
"""

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.auth.service import create_key
from app.core.config import to_sqlalchemy_url
from app.core.db import create_sessionmaker, unit_of_work
from app.domain.callers import DEFAULT_SCOPES
from benchmarks.build_prompt_latency import percentile, turn_text
from benchmarks.floor_compare import contextd_dev

# Small windows so that A's sessions offload every few appends and B's every few rounds of
# appends; the floors leave most of a window to move.
A_CONFIG = {"context_limit": 16000, "reserve_tokens": 500, "min_recent_turns": 4}
B_CONFIG = {
    "context_limit": 3000,
    "reserve_tokens": 500,
    "min_recent_turns": 2,
    "min_recent_tokens": 200,
}
A_BATCH, B_BATCH, POLL = 50, 4, 0.05


@dataclass
class Round:
    to_offload: float
    to_notes: float
    backlog: int
    capped: bool


async def tenant_key(database_url: str, tenant: str) -> str:
    engine = create_async_engine(to_sqlalchemy_url(database_url))
    try:
        async with unit_of_work(create_sessionmaker(engine)) as db:
            key, _ = await create_key(db, tenant, [s.value for s in DEFAULT_SCOPES])
    finally:
        await engine.dispose()
    return key


async def embedding_backlog(database_url: str) -> int:
    """Embedding jobs waiting or running (every tenant's: B's chunks are a handful)."""
    engine = create_async_engine(to_sqlalchemy_url(database_url))
    try:
        async with engine.connect() as conn:
            count = await conn.scalar(
                text(
                    "SELECT count(*) FROM procrastinate_jobs WHERE task_name ="
                    " 'offload:embed_chunks' AND status IN ('todo', 'doing')"
                )
            )
    finally:
        await engine.dispose()
    return int(count or 0)


async def tenant_a(http: httpx.AsyncClient, turns: int, sessions: int, appended: list[int]) -> None:
    per_session = turns // sessions

    async def one(s: int) -> None:
        sid, rng = f"a-{s}", random.Random(s)
        (await http.put(f"/v1/sessions/{sid}", json=A_CONFIG)).raise_for_status()
        for start in range(0, per_session, A_BATCH):
            batch = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": turn_text(rng, i)}
                for i in range(start, min(per_session, start + A_BATCH))
            ]
            resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": batch})
            resp.raise_for_status()
            appended[0] += len(batch)

    for first in range(0, sessions, 2):  # two clients at a time
        await asyncio.gather(*(one(s) for s in range(first, min(sessions, first + 2))))


async def b_state(http: httpx.AsyncClient) -> tuple[str | None, int, bool]:
    session = (await http.get("/v1/sessions/b")).json()
    pad = (await http.get("/v1/sessions/b/scratchpad")).json()
    return session["last_offload_at"], pad["version"], pad["stale"]


async def b_unembedded(http: httpx.AsyncClient) -> int:
    chunks = (await http.get("/v1/sessions/b/chunks", params={"limit": 500})).json()["chunks"]
    return sum(1 for c in chunks if not c["embedded"])


async def tenant_b(
    http: httpx.AsyncClient, database_url: str, rounds: int, cap: float
) -> list[Round]:
    (await http.put("/v1/sessions/b", json=B_CONFIG)).raise_for_status()
    rng, seq, measured = random.Random("b"), 0, []
    for _ in range(rounds):
        last_offload, version, _ = await b_state(http)
        while True:  # small appends until one crosses the watermark
            batch = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": turn_text(rng, i)}
                for i in range(seq, seq + B_BATCH)
            ]
            seq += B_BATCH
            resp = await http.post("/v1/sessions/b/turns", json={"turns": batch})
            resp.raise_for_status()
            if resp.json()["offload_enqueued"]:
                break
        appended_at = time.monotonic()
        backlog = await embedding_backlog(database_url)
        offloaded_at = notes_at = None
        while time.monotonic() - appended_at < cap:
            offload, notes_version, stale = await b_state(http)
            now = time.monotonic()
            if offloaded_at is None and offload != last_offload:
                offloaded_at = now
            if offloaded_at is not None and notes_version > version and not stale:
                notes_at = now
                break
            await asyncio.sleep(POLL)
        end = time.monotonic()
        capped = notes_at is None
        to_offload = (offloaded_at or end) - appended_at
        measured.append(Round(to_offload, (notes_at or end) - appended_at, backlog, capped))
        flag = ">=" if capped else ""
        print(
            f"  B round {len(measured)}: append->offload {flag}{to_offload:6.2f} s, "
            f"offload->notes {flag}{measured[-1].to_notes - to_offload:6.2f} s, "
            f"append->notes {flag}{measured[-1].to_notes:6.2f} s "
            f"(embedding jobs queued: {backlog})",
            flush=True,
        )
        if capped:
            break
    last_append = appended_at
    while await b_unembedded(http) and time.monotonic() - last_append < cap:
        await asyncio.sleep(POLL * 10)
    left = await b_unembedded(http)
    print(
        f"  B's chunks embedded {'>=' if left else ''}{time.monotonic() - last_append:.1f} s "
        f"after its last append ({left} without a vector)",
        flush=True,
    )
    return measured


def summary(name: str, values: list[float], capped: bool) -> str:
    flag = ">=" if capped else ""
    return (
        f"{name:16s} median {flag}{statistics.median(values):6.2f} s   "
        f"p95 {flag}{percentile(values, 0.95):6.2f} s   max {flag}{max(values):6.2f} s"
    )


async def worker_up(url: str) -> None:
    """Until the worker of `contextd dev` has started (it starts once the API answers)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        while (await http.get("/readyz")).json()["worker"]["live_workers"] < 1:
            await asyncio.sleep(0.5)


async def run(url: str, database_url: str, args: argparse.Namespace) -> None:
    await worker_up(url)
    key_a = await tenant_key(database_url, "fairness-a")
    key_b = await tenant_key(database_url, "fairness-b")
    appended = [0]
    async with (
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {key_a}"}, timeout=120
        ) as a,
        httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {key_b}"}, timeout=120
        ) as b,
    ):
        started = time.monotonic()
        load = asyncio.create_task(tenant_a(a, args.a_turns, args.a_sessions, appended))
        while appended[0] < args.a_turns // 5 and not load.done():
            await asyncio.sleep(POLL)
        print(f"A appended {appended[0]} turns in {time.monotonic() - started:.1f} s; B starts")
        rounds = await tenant_b(b, database_url, args.b_rounds, args.cap)
        await load
        print(
            f"A appended {appended[0]} turns in {time.monotonic() - started:.1f} s; "
            f"embedding jobs still queued: {await embedding_backlog(database_url)}"
        )
    capped = any(r.capped for r in rounds)
    offload = [r.to_offload for r in rounds]
    notes = [r.to_notes - r.to_offload for r in rounds]
    total = [r.to_notes for r in rounds]
    print(f"B, {len(rounds)} rounds:")
    print("  " + summary("append->offload", offload, capped))
    print("  " + summary("offload->notes", notes, capped))
    print("  " + summary("append->notes", total, capped))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-turns", type=int, default=5000)
    parser.add_argument("--a-sessions", type=int, default=8)
    parser.add_argument("--b-rounds", type=int, default=5)
    parser.add_argument("--cap", type=float, default=120.0, help="longest wait of a round, s")
    parser.add_argument("--port", type=int, default=random.randint(18100, 18900))
    parser.add_argument("--serve-args", default="", help="extra `contextd dev` arguments")
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} at start")
    with (
        tempfile.TemporaryDirectory(prefix="worker-fairness-") as tmp,
        contextd_dev(Path(tmp), args.port, ["--auth", *args.serve_args.split()]) as server,
    ):
        asyncio.run(run(server.url, server.database_url, args))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
