"""Scale-out: 1 API process + 1 worker against 2 + 2, each a process of its own, on one embedded
PostgreSQL and one Valkey (tests/system/deployment.py starts them; tests/system/test_scale_out.py
kills them):

    .venv/bin/python -m benchmarks.scale_out [--rounds 3] [--clients 8] [--turns 40]
        [--builds 10] [--embedding e5|none] [--processes 1,2] [--precisions q4,int8]

Each round, on fresh sessions (one per client, a 1,600-token window: offloads and notes
refreshes every ~20 turns): every client appends `--turns` turns, one or two per call, then
makes `--builds` build-prompts. Prints, per deployment, the medians over rounds of appends/s
and builds/s (all clients together, wall clock), p50/p95 latencies of each call over all
rounds, and the lag behind the appends: from the acknowledgement of an append that crossed the
trigger and enqueued an offload, to that offload committed by a worker, and to the chunks it
wrote embedded (the database polled every 50 ms: figures carry that resolution).

`--pace S` has each client append once every S seconds (the clients spread over one interval)
instead of as fast as it can: the lag of a steady load rather than of a burst.

`--precisions` runs each deployment once per e5 precision (`CONTEXTD_EMBEDDING__E5_PRECISION`),
started afresh every round with the precisions taking turns, so a shared machine's load falls
on both alike. A second table gives what does not follow the load as much: CPU seconds of the
workers (each a process group with its e5 engine) per 1,000 turns they offloaded and embedded,
of the API processes per append and per build-prompt, of PostgreSQL per 1,000 turns; and the
load average (1 min) at the start and end of each round.

On a 2-core machine the 2 + 2 deployment runs four processes (and Postgres and Valkey) on the
same two cores as 1 + 1: its figures show that the work is shared correctly, not a speed-up.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.auth.service import create_key
from app.core.config import Settings, load_settings, to_sqlalchemy_url
from app.core.db import create_sessionmaker, unit_of_work
from app.core.migrate import upgrade
from app.domain.callers import DEFAULT_SCOPES
from app.runtime.embedded import EmbeddedStack
from app.store.keys import get_or_create_tenant
from benchmarks.append_latency import percentile
from benchmarks.floor_compare import Stack, cpu_seconds
from tests.support.waiting import wait_for
from tests.system.deployment import (
    SMALL_WINDOW,
    Deployment,
    Fleet,
    Member,
    deployment,
    process_env,
    settled,
)

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
    work: "Work | None" = None


@dataclass(frozen=True)
class Work:
    """What one round's processes did and the CPU seconds it took them."""

    offloaded_turns: int
    chunks: int
    appends: int
    builds: int
    worker_cpu: float  # from the first append to the queue drained
    api_append_cpu: float  # while the clients appended
    api_build_cpu: float  # while the clients built
    postgres_cpu: float  # the whole round
    load: tuple[float, float]  # load average (1 min) at the start and the end


def group_cpu(leader: int) -> float:
    """CPU seconds so far of every process in the process group led by `leader` (an API process
    or a worker and the e5 engine processes it started)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if group == leader:
            total += cpu_seconds(int(entry.name))
    return total


def members_cpu(members: list[Member]) -> float:
    return sum(group_cpu(m.process.pid) for m in members)


async def round_output(
    engine: AsyncEngine, tenant: uuid.UUID, sessions: list[str]
) -> tuple[int, int]:
    """(turns offloaded, chunks written) of the round's sessions."""
    async with engine.connect() as conn:
        found = (
            await conn.execute(
                text(
                    "SELECT coalesce(sum(offloaded_until_seq), 0), coalesce(sum(chunk_count), 0)"
                    " FROM sessions WHERE tenant_id = :t AND external_id = ANY(:ids)"
                ),
                {"t": tenant, "ids": sessions},
            )
        ).one()
    return int(found[0]), int(found[1])


async def observe(
    engine: AsyncEngine,
    tenant: uuid.UUID,
    sessions: list[str],
    history: dict[str, list[Observation]],
    backend: list[tuple[int, float]],
) -> None:
    """Poll the round's sessions until cancelled, on one connection whose server process id and
    CPU seconds so far go to `backend` (its CPU from then on is the benchmark's, not contextd's)."""
    query = text(
        "SELECT s.external_id,"
        " (SELECT count(*) FROM offload_events e WHERE e.session_id = s.id),"
        " (SELECT count(*) FROM chunks c WHERE c.session_id = s.id),"
        " (SELECT count(*) FROM chunks c WHERE c.session_id = s.id AND c.embedding IS NULL)"
        " FROM sessions s WHERE s.tenant_id = :t AND s.external_id = ANY(:ids)"
    )
    async with engine.connect() as conn:
        pid = int(await conn.scalar(text("SELECT pg_backend_pid()")))
        backend.append((pid, cpu_seconds(pid)))
        while True:
            found = (await conn.execute(query, {"t": tenant, "ids": sessions})).all()
            await conn.rollback()  # no transaction left open between polls
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
    running: Deployment,
    postgres: Stack,
    engine: AsyncEngine,
    api_key: str,
    tenant: uuid.UUID,
    label: str,
    args: argparse.Namespace,
) -> Round:
    embedding = args.embedding != "none"
    fleet = Fleet([api.url for api in running.apis], api_key)
    load_before = os.getloadavg()[0]
    sessions = [f"{label}-{c}" for c in range(args.clients)]
    history: dict[str, list[Observation]] = {}
    try:
        for sid in sessions:
            assert (await fleet.call("PUT", f"/v1/sessions/{sid}", SMALL_WINDOW)).status_code == 200
        poller_backend: list[tuple[int, float]] = []
        poller = asyncio.create_task(observe(engine, tenant, sessions, history, poller_backend))
        progress = {c: 0 for c in range(args.clients)}
        postgres_parts = postgres.parts()
        postgres_before = postgres.cpu(postgres_parts)["postgres"]
        worker_before, api_before = members_cpu(running.workers), members_cpu(running.apis)
        started = time.perf_counter()

        async def appends(c: int) -> None:
            # Paced clients start spread over one interval: appends arrive evenly.
            await asyncio.sleep(args.pace * c / args.clients)
            await fleet.run_client(c, sessions[c], args.turns, 0, progress, args.pace)

        await asyncio.gather(*(appends(c) for c in range(args.clients)))
        append_seconds = time.perf_counter() - started
        api_appended = members_cpu(running.apis)

        async def builds(c: int) -> None:
            for i in range(args.builds):
                await fleet.build(c, sessions[c], f"Which order ships to Lyon? AB-{c}{i:03d}")

        started = time.perf_counter()
        await asyncio.gather(*(builds(c) for c in range(args.clients)))
        build_seconds = time.perf_counter() - started
        api_built = members_cpu(running.apis)
        await wait_for(
            lambda: settled(engine, tenant, embedding),
            lambda state: state == (0, 0, 0),
            timeout=600,
            interval=0.2,
            what="the queue to drain",
        )
        worker_after = members_cpu(running.workers)
        # Less the poller's own backend: PostgreSQL's CPU for contextd's work.
        postgres_after = postgres.cpu(postgres.parts())["postgres"] - sum(
            cpu_seconds(pid) - before for pid, before in poller_backend
        )
        poller.cancel()
        offloaded, chunks = await round_output(engine, tenant, sessions)
    finally:
        await fleet.aclose()
    record = fleet.record
    assert [s for s in record.statuses if s >= 500] == []
    result = Round(
        len(record.append_ms) / append_seconds,
        len(record.build_ms) / build_seconds,
        record.append_ms,
        record.build_ms,
        work=Work(
            offloaded,
            chunks,
            len(record.append_ms),
            len(record.build_ms),
            worker_after - worker_before,
            api_appended - api_before,
            api_built - api_appended,
            postgres_after - postgres_before,
            (load_before, os.getloadavg()[0]),
        ),
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


def per_round_spread(rounds: list[Round], values: str) -> str:
    """The median over rounds of each round's p50, and of each round's p95, of `values`."""
    spreads = [getattr(r, values) for r in rounds if getattr(r, values)]
    if not spreads:
        return "–"
    p50 = statistics.median(percentile(v, 0.5) for v in spreads)
    p95 = statistics.median(percentile(v, 0.95) for v in spreads)
    return f"{p50:.2f} / {p95:.2f}"


def round_line(name: str, n: int, result: Round) -> str:
    work = result.work
    assert work is not None
    return (
        f"{name} round {n + 1}: {result.appends_per_second:.1f} appends/s,"
        f" append → embedded s p50 / p95 {spread(result.embed_lag, digits=2)},"
        f" {work.offloaded_turns} turns offloaded into {work.chunks} chunks,"
        f" CPU s: workers {work.worker_cpu:.1f}, API {work.api_append_cpu:.1f} appending"
        f" + {work.api_build_cpu:.1f} building, PostgreSQL {work.postgres_cpu:.1f};"
        f" load {work.load[0]:.1f} → {work.load[1]:.1f}"
    )


def cpu_line(name: str, rounds: list[Round]) -> str:
    works = [r.work for r in rounds if r.work is not None]
    loads = [x for w in works for x in w.load]

    def median(value: str) -> float:
        return statistics.median(value_of(w, value) for w in works)

    return (
        f"| {name}"
        f" | {median('worker_per_kturn'):.1f}"
        f" | {median('chunks_per_worker_cpu'):.1f}"
        f" | {median('api_ms_per_append'):.1f}"
        f" | {median('api_ms_per_build'):.1f}"
        f" | {median('postgres_per_kturn'):.1f}"
        f" | {min(loads):.1f}-{max(loads):.1f} |"
    )


def value_of(work: Work, name: str) -> float:
    """The per-unit figures of one round (turns: those appended; chunks: those written)."""
    turns = max(work.offloaded_turns, 1)
    return {
        "worker_per_kturn": 1000 * work.worker_cpu / turns,
        "chunks_per_worker_cpu": work.chunks / work.worker_cpu if work.worker_cpu else 0.0,
        "api_ms_per_append": 1000 * work.api_append_cpu / max(work.appends, 1),
        "api_ms_per_build": 1000 * work.api_build_cpu / max(work.builds, 1),
        "postgres_per_kturn": 1000 * work.postgres_cpu / turns,
    }[name]


async def provisioned(
    stack: EmbeddedStack, tenant_name: str
) -> tuple[Settings, AsyncEngine, uuid.UUID, str]:
    """The stack migrated, its settings, an engine on it, and a tenant `tenant_name` with a key of
    the default scopes."""
    upgrade(stack.database_url)
    settings = load_settings(database_url=stack.database_url, redis_url=stack.redis_url)
    engine = create_async_engine(to_sqlalchemy_url(stack.database_url))
    async with unit_of_work(create_sessionmaker(engine)) as db:
        tenant = (await get_or_create_tenant(db, tenant_name)).id
        api_key, _ = await create_key(db, tenant_name, [s.value for s in DEFAULT_SCOPES])
    return settings, engine, tenant, api_key


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        try:
            settings, engine, tenant, api_key = await provisioned(stack, "scale-out")
            postgres = Stack(0, stack.database_url, stack.redis_url, os.getpid())
            print(
                f"{args.clients} clients x {args.turns} turns"
                + (f", an append every {args.pace:g} s" if args.pace else "")
                + f", then x {args.builds} builds;"
                f" {args.rounds} rounds; embedding {args.embedding};"
                f" load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n",
                flush=True,
            )
            results: dict[str, list[Round]] = {}
            for processes in args.processes:
                for n in range(args.rounds):
                    for precision in args.precisions:
                        name = f"{processes} + {processes}" + (
                            f", {precision}" if args.embedding == "e5" else ""
                        )
                        label = f"p{processes}{precision}r{n}"
                        env = process_env(
                            settings,
                            CONTEXTD_EMBEDDING__KIND=args.embedding,
                            CONTEXTD_EMBEDDING__E5_PRECISION=precision,
                        )
                        logs = Path(tmp) / f"logs-{label}"
                        logs.mkdir()
                        async with deployment(env, logs, engine, processes, processes) as running:
                            result = await one_round(
                                running, postgres, engine, api_key, tenant, label, args
                            )
                        results.setdefault(name, []).append(result)
                        print(round_line(name, n, result), flush=True)
            print(
                "\n| API + workers | appends/s | builds/s | append ms p50 / p95 |"
                " build ms p50 / p95 | append → offloaded s p50 / p95 |"
                " append → embedded s p50 / p95 |\n|---|---|---|---|---|---|---|"
            )
            for name, rounds in results.items():
                print(
                    f"| {name}"
                    f" | {statistics.median(r.appends_per_second for r in rounds):.1f}"
                    f" | {statistics.median(r.builds_per_second for r in rounds):.1f}"
                    f" | {spread([v for r in rounds for v in r.append_ms])}"
                    f" | {spread([v for r in rounds for v in r.build_ms])}"
                    f" | {per_round_spread(rounds, 'offload_lag')}"
                    f" | {per_round_spread(rounds, 'embed_lag')} |"
                )
            print(
                "\n| API + workers | worker CPU s per 1,000 turns | chunks per worker CPU s |"
                " API CPU ms per append | API CPU ms per build | PostgreSQL CPU s per 1,000"
                " turns | load average |\n|---|---|---|---|---|---|---|"
            )
            for name, rounds in results.items():
                print(cpu_line(name, rounds))
            await engine.dispose()
        finally:
            stack.stop()


def numbers(text_: str) -> list[int]:
    return [int(word) for word in text_.split(",") if word.strip()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40, help="turns each client appends")
    parser.add_argument("--builds", type=int, default=10, help="build-prompts each client makes")
    parser.add_argument(
        "--pace",
        type=float,
        default=0,
        help="seconds between one client's appends (0: each right after the one before)",
    )
    parser.add_argument("--embedding", choices=["e5", "none"], default="e5")
    parser.add_argument(
        "--processes", type=numbers, default=[1, 2], help="API processes and workers, each"
    )
    parser.add_argument(
        "--precisions",
        type=lambda t: [w for w in t.split(",") if w],
        default=["q4"],
        help="e5 precisions (q4, int8), each a deployment of its own every round",
    )
    asyncio.run(main(parser.parse_args()))
