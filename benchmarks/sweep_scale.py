"""The worker's sweep as idle sessions pile up: each of its statements at several database sizes.

    .venv/bin/python -m benchmarks.sweep_scale [--sessions 1000,100000] [--rounds 7]
        [--data-dir DIR]

The sweep (`app.offload.sweep`, task `offload:sweep`, every minute on every worker) looks for
sessions over their watermark, counters to repair, chunks still lacking a vector and sessions
needing their own vector index. A service of many agents holds mostly idle sessions: sessions
nobody has written to for days, offloaded long ago, every chunk embedded. Their number must not
set the sweep's cost.

For each size one embedded PostgreSQL (its own data directory, the migrations applied) holds
that many idle sessions generated in the server (`benchmarks.recall_scale.add_sessions`: 5 chunks
with vectors and a 10-turn window each, last written and offloaded a week ago; loaded in one
transaction with the tables' indexes and keys built after the rows, as a restore does:
`benchmarks.bulk_load`; 10^6 sessions took 19 min and 24 GB of disk) and 20 live ones
(written a minute ago: one over its watermark with no job, one with drifted counters, one with
chunks lacking a vector), `VACUUM ANALYZE`d. Then, in `--rounds` rounds going through every size
(so the ratios are side by side), each statement of the sweep runs through its store function
on the configured defaults and is timed; printed: per size the median and p95 ms of each
statement and of their sum, what each found (it must be the live sessions' rows at every size),
the ratio of the largest size to the smallest, and the plan of each statement at the largest size.

Kept stores (`--data-dir DIR`): `DIR/s<N>` is reused when it holds N sessions, loaded otherwise.
"""

import argparse
import asyncio
import random
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Settings, load_settings
from app.core.db import create_engine, create_sessionmaker
from app.core.migrate import upgrade
from app.offload.sweep import RECOUNT_LOOKBACK
from app.runtime.embedded import EmbeddedStack
from app.store import chunks as chunks_store
from app.store import embedding_backlog as embedding_backlog_store
from app.store import sessions as sessions_store
from app.store import vector_index as vector_index_store
from app.store.embedding_backlog import CHUNKS
from benchmarks.build_prompt_latency import percentile
from benchmarks.bulk_load import deferred_indexes
from benchmarks.recall_scale import MODEL, add_sessions, chunk_rows, copy_chunks, text_pool

LIVE = 20
IDLE_PREFIX = "idle-"
LIVE_PREFIX = "live-"

Statement = Callable[[AsyncSession, Settings], Awaitable[int]]


def written_since(settings: Settings) -> datetime:
    return datetime.now(UTC) - timedelta(hours=settings.worker.sweep_lookback_hours)


async def over_watermark(db: AsyncSession, settings: Settings) -> int:
    found = await sessions_store.sessions_over_watermark(
        db, settings.session_defaults, written_since(settings)
    )
    return len(found)


async def with_drift(db: AsyncSession, settings: Settings) -> int:
    found = await sessions_store.sessions_with_drift(
        db,
        settings.session_defaults,
        chunks_store.active_chunk_count,
        changed_since=datetime.now(UTC) - RECOUNT_LOOKBACK,
        written_since=written_since(settings),
    )
    return len(found)


async def chunks_lacking_vectors(db: AsyncSession, settings: Settings) -> int:
    return len(await embedding_backlog_store.never_embedded(db, CHUNKS, 512))


async def needing_vector_index(db: AsyncSession, settings: Settings) -> int:
    found = await vector_index_store.sessions_needing_vector_index(
        db, MODEL, settings.recall.vector_index_min_chunks
    )
    return len(found)


# The sweep's statements, in the order it runs them.
STATEMENTS: dict[str, Statement] = {
    "counters to repair": with_drift,
    "over the watermark": over_watermark,
    "chunks lacking a vector": chunks_lacking_vectors,
    "sessions needing an index": needing_vector_index,
}


def load(url: str, sessions: int, seed: int) -> float:
    """`sessions` idle sessions and `LIVE` live ones; seconds taken (0 when kept)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM sessions").fetchone()
        stored = 0 if row is None else int(row[0])
        if stored == sessions + LIVE:
            return 0.0
        if stored:
            raise SystemExit(f"{url} holds {stored} sessions, not {sessions + LIVE}: delete it")
        started = time.monotonic()
        rng = random.Random(seed)
        pool = text_pool(seed)
        tenant = uuid.uuid4()
        conn.execute("INSERT INTO tenants (id, name) VALUES (%s, %s)", (tenant, "sweep-scale"))
        # Index builds sort in memory rather than in many runs on disk (this connection only).
        conn.execute("SET maintenance_work_mem = '1GB'")
        with conn.transaction(), deferred_indexes(conn, ["sessions", "chunks", "turns"]):
            add_sessions(conn, rng, pool, tenant, IDLE_PREFIX, 0, sessions)
            conn.execute(
                "UPDATE sessions SET updated_at = now() - interval '7 days', "
                "last_offload_at = now() - interval '7 days'"
            )
        add_sessions(conn, rng, pool, tenant, LIVE_PREFIX, 0, LIVE)
        make_live_cases(conn, rng, pool, tenant)
        conn.execute("VACUUM ANALYZE")
        return time.monotonic() - started


def make_live_cases(
    conn: psycopg.Connection,
    rng: random.Random,
    pool: list[tuple[str, str, int, str]],
    tenant: uuid.UUID,
) -> None:
    """Among the live sessions: one over its watermark (a window far over the configured
    limit, no offload job), one whose stored turn count drifted from its rows, one with two
    chunks whose vectors are missing."""
    over, drifted, unembedded = (f"{LIVE_PREFIX}{i}" for i in range(3))
    conn.execute(
        "UPDATE sessions SET c1_tokens = 10000000, last_offload_at = NULL WHERE external_id = %s",
        (over,),
    )
    conn.execute(
        "UPDATE sessions SET turn_count = turn_count + 3 WHERE external_id = %s", (drifted,)
    )
    row = conn.execute("SELECT id FROM sessions WHERE external_id = %s", (unembedded,)).fetchone()
    assert row is not None
    copy_chunks(conn, chunk_rows(rng, pool, tenant, row[0], 1000, 2))
    conn.execute(
        "UPDATE chunks SET embedding = NULL, embedding_model = NULL "
        "WHERE session_id = %s AND turn_first >= 1000",
        (row[0],),
    )
    conn.execute(
        "UPDATE sessions SET chunk_count = chunk_count + 2, updated_at = now() WHERE id = %s",
        (row[0],),
    )


async def captured_statements(
    settings: Settings,
) -> tuple[dict[str, tuple[str, Any]], dict[str, int]]:
    """The SQL each statement sends (its first SELECT, with its parameters, as the engine passes
    it to psycopg) and how many rows each found."""
    engine = create_engine(settings)
    sent: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            sent.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", keep)
    statements: dict[str, tuple[str, Any]] = {}
    found: dict[str, int] = {}
    try:
        maker = create_sessionmaker(engine)
        for name, statement in STATEMENTS.items():
            sent.clear()
            async with maker() as db:
                found[name] = await statement(db, settings)
                await db.rollback()
            statements[name] = sent[0]
    finally:
        await engine.dispose()
    return statements, found


def analysed(conn: psycopg.Connection, statement: str, params: Any) -> tuple[float, int, str]:
    """Server execution ms, shared buffers touched (hit + read), and the plan."""
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).fetchall()
    conn.rollback()
    plan = "\n".join(r[0] for r in rows)
    ms = float(re.findall(r"Execution Time: ([\d.]+) ms", plan)[-1])
    top = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
    pages = sum(int(v) for k, v in re.findall(r"(hit|read)=(\d+)", top.group(1))) if top else 0
    return ms, pages, plan


Figures = dict[int, dict[str, list[tuple[float, int]]]]


def measure(
    urls: dict[int, str], statements: dict[int, dict[str, tuple[str, Any]]], rounds: int
) -> tuple[Figures, dict[str, str]]:
    """`rounds` rounds through every size (order alternating; a first one warms the buffers),
    each statement analysed once per round; the plans at the largest size."""
    figures: Figures = {n: {name: [] for name in STATEMENTS} for n in urls}
    plans: dict[str, str] = {}
    sizes = sorted(urls)
    with ExitStack() as stack:
        conns = {n: stack.enter_context(psycopg.connect(url)) for n, url in urls.items()}
        for r in range(rounds + 1):
            for n in sizes if r % 2 else sizes[::-1]:
                for name, (statement, params) in statements[n].items():
                    ms, pages, plan = analysed(conns[n], statement, params)
                    if r:
                        figures[n][name].append((ms, pages))
                    if n == sizes[-1]:
                        plans[name] = plan
    return figures, plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1000,100000")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--plans", action="store_true", help="print the whole plans")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sessions.split(","))
    with ExitStack() as stack:
        root = args.data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        settings_by_size: dict[int, Settings] = {}
        urls: dict[int, str] = {}
        for n in sizes:
            embedded = EmbeddedStack(root / f"s{n}").start_postgres()
            stack.callback(embedded.stop)
            upgrade(embedded.database_url)
            took = load(embedded.database_url, n, args.seed)
            size_mb = 0.0
            with psycopg.connect(embedded.database_url) as conn:
                row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
                size_mb = int(row[0]) / 2**20 if row else 0.0
            print(
                f"{n:,} idle sessions: "
                + (f"loaded in {took:.0f} s" if took else "kept")
                + f", database {size_mb:,.0f} MB",
                flush=True,
            )
            with psycopg.connect(embedded.database_url, autocommit=True) as conn:
                # Written a minute ago at every size, however long ago the store was loaded: the
                # sweep recounts what changed in its last minutes.
                conn.execute(
                    "UPDATE sessions SET updated_at = now() - interval '1 minute' "
                    "WHERE external_id LIKE %s",
                    (f"{LIVE_PREFIX}%",),
                )
            urls[n] = embedded.database_url
            settings_by_size[n] = load_settings(database_url=embedded.database_url)
        captured = {n: asyncio.run(captured_statements(s)) for n, s in settings_by_size.items()}
        statements = {n: c[0] for n, c in captured.items()}
        figures, plans = measure(urls, statements, args.rounds)
        report(sizes, figures, {n: c[1] for n, c in captured.items()})
        print(f"\nscans at {sizes[-1]:,} idle sessions (`--plans`: whole plans)")
        for name, plan in plans.items():
            shown = (
                plan
                if args.plans
                else "\n".join(
                    line
                    for line in plan.splitlines()
                    if "Scan" in line and "never executed" not in line
                )
            )
            print(f"\n-- {name}\n{shown}")


def report(sizes: list[int], figures: Figures, found: dict[int, dict[str, int]]) -> None:
    """Per statement and size: server execution ms p50 / p95 and shared buffers touched (their
    count does not depend on the machine's load), rows found; the largest size over the smallest."""
    columns = " | ".join(f"{n:,}: ms p50 / p95, pages (found)" for n in sizes)
    print(f"\n| statement | {columns} | ratio ms / pages |")
    print("|---|" + "---|" * len(sizes) + "---|")
    for name in [*STATEMENTS, "sweep (sum)"]:
        cells, ms_medians, page_medians = [], [], []
        for n in sizes:
            if name == "sweep (sum)":
                rounds = zip(*figures[n].values(), strict=True)
                pairs = [(sum(m for m, _ in r), sum(p for _, p in r)) for r in rounds]
                hits = ""
            else:
                pairs = figures[n][name]
                hits = f" ({found[n][name]})"
            ms = [m for m, _ in pairs]
            ms_medians.append(statistics.median(ms))
            page_medians.append(statistics.median(p for _, p in pairs))
            cells.append(
                f"{ms_medians[-1]:.2f} / {percentile(ms, 0.95):.2f}, {page_medians[-1]:,.0f}{hits}"
            )
        ratio = f"{ms_medians[-1] / ms_medians[0]:.2f} / {page_medians[-1] / page_medians[0]:.2f}"
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()
