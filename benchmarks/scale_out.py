"""Scale-out: 1 API process + 1 worker against 2 + 2, each a process of its own, on one embedded
PostgreSQL and one Valkey (tests/system/deployment.py starts them; tests/system/test_scale_out.py
kills them):

    .venv/bin/python -m benchmarks.scale_out [--rounds 3] [--clients 8] [--turns 40]
        [--builds 10] [--embedding e5|none]

Each round, on fresh sessions (one per client, a 1,600-token window: offloads and notes
refreshes every ~20 turns): every client appends `--turns` turns, one or two per call, then
makes `--builds` build-prompts. Prints, per deployment, the medians over rounds of appends/s
and builds/s (all clients together, wall clock), p50/p95 latencies of each call over all
rounds, and the lag behind the appends: from the acknowledgement of an append that crossed the
trigger and enqueued an offload, to that offload committed by a worker, and to the chunks it
wrote embedded (the database polled every 50 ms: figures carry that resolution).

On a 2-core machine the 2 + 2 deployment runs four processes (and Postgres and Valkey) on the
same two cores as 1 + 1: its figures show that the work is shared correctly, not a speed-up.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.auth.service import create_key
from app.core.config import load_settings, to_sqlalchemy_url
from app.core.db import create_sessionmaker, unit_of_work
from app.core.migrate import upgrade
from app.domain.callers import DEFAULT_SCOPES
from app.runtime.embedded import EmbeddedStack
from app.store.keys import get_or_create_tenant
from benchmarks.append_latency import percentile
from tests.support.waiting import wait_for
from tests.system.deployment import SMALL_WINDOW, Fleet, deployment, process_env, settled

POLL_SECONDS = 0.05


@dataclass
class Observation:
    at: float
    events: int  # offload events of the session
    chunks: int
    unembedded: int


@dataclass
class Round:
    appends_per_second: float
    builds_per_second: float
    append_ms: list[float]
    build_ms: list[float]
    offload_lag: list[float] = field(default_factory=list)
    embed_lag: list[float] = field(default_factory=list)


async def observe(
    engine: AsyncEngine, tenant: uuid.UUID, history: dict[str, list[Observation]]
) -> None:
    """Poll the tenant's sessions until cancelled."""
    query = text(
        "SELECT s.external_id,"
        " (SELECT count(*) FROM offload_events e WHERE e.session_id = s.id),"
        " (SELECT count(*) FROM chunks c WHERE c.session_id = s.id),"
        " (SELECT count(*) FROM chunks c WHERE c.session_id = s.id AND c.embedding IS NULL)"
        " FROM sessions s WHERE s.tenant_id = :t"
    )
    while True:
        async with engine.connect() as conn:
            found = (await conn.execute(query, {"t": tenant})).all()
        now = time.time()
        for sid, events, chunks, unembedded in found:
            history.setdefault(sid, []).append(Observation(now, events, chunks, unembedded))
        await asyncio.sleep(POLL_SECONDS)


def lags(
    history: list[Observation], acked_at: float, embedding: bool
) -> tuple[float | None, float | None]:
    """Seconds from an append acknowledged at `acked_at` (it enqueued an offload) to the next
    offload event seen, and to every chunk of the session then embedded."""
    seen_before = [o for o in history if o.at <= acked_at]
    events_before = seen_before[-1].events if seen_before else 0
    after = [o for o in history if o.at > acked_at]
    offloaded = next((o for o in after if o.events > events_before), None)
    if offloaded is None:
        return None, None
    if not embedding:
        return offloaded.at - acked_at, None
    embedded = next(
        (
            o
            for o in after
            if o.at >= offloaded.at and o.chunks >= offloaded.chunks and o.unembedded == 0
        ),
        None,
    )
    return offloaded.at - acked_at, (embedded.at - acked_at) if embedded else None


async def one_round(
    urls: list[str],
    engine: AsyncEngine,
    api_key: str,
    tenant: uuid.UUID,
    label: str,
    args: argparse.Namespace,
) -> Round:
    embedding = args.embedding != "none"
    fleet = Fleet(urls, api_key)
    sessions = [f"{label}-{c}" for c in range(args.clients)]
    history: dict[str, list[Observation]] = {}
    try:
        for sid in sessions:
            assert (await fleet.call("PUT", f"/v1/sessions/{sid}", SMALL_WINDOW)).status_code == 200
        poller = asyncio.create_task(observe(engine, tenant, history))
        progress = {c: 0 for c in range(args.clients)}
        started = time.perf_counter()
        await asyncio.gather(
            *(
                fleet.run_client(c, sessions[c], args.turns, 0, progress)
                for c in range(args.clients)
            )
        )
        append_seconds = time.perf_counter() - started

        async def builds(c: int) -> None:
            for i in range(args.builds):
                await fleet.build(c, sessions[c], f"Which order ships to Lyon? AB-{c}{i:03d}")

        started = time.perf_counter()
        await asyncio.gather(*(builds(c) for c in range(args.clients)))
        build_seconds = time.perf_counter() - started
        await wait_for(
            lambda: settled(engine, tenant, embedding),
            lambda state: state == (0, 0, 0),
            timeout=600,
            interval=0.2,
            what="the queue to drain",
        )
        poller.cancel()
    finally:
        await fleet.aclose()
    record = fleet.record
    assert [s for s in record.statuses if s >= 500] == []
    result = Round(
        len(record.append_ms) / append_seconds,
        len(record.build_ms) / build_seconds,
        record.append_ms,
        record.build_ms,
    )
    for accepted in record.accepted:
        if accepted.offload_enqueued:
            offload, embed = lags(history[accepted.session], accepted.acked_at, embedding)
            if offload is not None:
                result.offload_lag.append(offload)
            if embed is not None:
                result.embed_lag.append(embed)
    return result


def spread(values: list[float], digits: int = 0) -> str:
    """p50 / p95 of `values`."""
    if not values:
        return "–"
    return f"{percentile(values, 0.5):.{digits}f} / {percentile(values, 0.95):.{digits}f}"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        try:
            upgrade(stack.database_url)
            settings = load_settings(database_url=stack.database_url, redis_url=stack.redis_url)
            engine = create_async_engine(to_sqlalchemy_url(stack.database_url))
            async with unit_of_work(create_sessionmaker(engine)) as db:
                tenant = (await get_or_create_tenant(db, "scale-out")).id
                api_key, _ = await create_key(db, "scale-out", [s.value for s in DEFAULT_SCOPES])
            env = process_env(settings, CONTEXTD_EMBEDDING__KIND=args.embedding)
            print(
                f"{args.clients} clients x {args.turns} turns, then x {args.builds} builds;"
                f" {args.rounds} rounds; embedding {args.embedding}\n"
            )
            print(
                "| API + workers | appends/s | builds/s | append ms p50 / p95 |"
                " build ms p50 / p95 | append → offloaded s p50 / p95 |"
                " append → embedded s p50 / p95 |\n|---|---|---|---|---|---|---|"
            )
            for processes in (1, 2):
                logs = Path(tmp) / f"logs-{processes}"
                logs.mkdir()
                async with deployment(env, logs, engine, processes, processes) as running:
                    urls = [api.url for api in running.apis]
                    rounds = [
                        await one_round(urls, engine, api_key, tenant, f"p{processes}r{n}", args)
                        for n in range(args.rounds)
                    ]
                print(
                    f"| {processes} + {processes}"
                    f" | {statistics.median(r.appends_per_second for r in rounds):.1f}"
                    f" | {statistics.median(r.builds_per_second for r in rounds):.1f}"
                    f" | {spread([v for r in rounds for v in r.append_ms])}"
                    f" | {spread([v for r in rounds for v in r.build_ms])}"
                    f" | {spread([v for r in rounds for v in r.offload_lag], digits=2)}"
                    f" | {spread([v for r in rounds for v in r.embed_lag], digits=2)} |",
                    flush=True,
                )
            await engine.dispose()
        finally:
            stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40, help="turns each client appends")
    parser.add_argument("--builds", type=int, default=10, help="build-prompts each client makes")
    parser.add_argument("--embedding", choices=["e5", "none"], default="e5")
    asyncio.run(main(parser.parse_args()))
