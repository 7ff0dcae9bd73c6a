"""build-prompt with recall as history grows: chunks per session, and sessions in the database.

    .venv/bin/python -m benchmarks.recall_scale [--chunks 100,1000,10000,100000]
        [--sessions 100,1000,10000,100000] [--requests 40] [--rounds 3] [--warmup 40]
        [--data-dir DIR [--load-only]] [--port P] [--explain] [--json out.json]

Starts a `contextd dev` (default settings, its own embedded Postgres and Valkey) and writes the
history straight into Postgres (COPY), as the offload and the worker would have: chunks of four
synthetic turns (~110 tokens, word list + an ID and an amount each; drawn from a pool of 10,000
distinct chunk texts), their term statistics and tsvector, and a random 384-d vector as their e5
embedding (search latency does not depend on what the vectors mean; random vectors are the
hardest case for an approximate index). Sessions at or above `recall.vector_index_min_chunks` are
measured once the worker's sweep has built their vector index (the wait is printed). One client
sends build-prompt requests with distinct queries (recall in auto mode, so every arm runs); the
command prints p50/p95 of the client wall time and the server's stages (`timings_ms`), and the
first build of each session (the per-process BM25 index is built then).

  chunks:   one session per size (10^2 .. 10^5 chunks) in one database, beside 1,000 small
            sessions (5 chunks, 10 turns each: the planner then expects a session to be a small
            part of the table, as in any database of many sessions; with the measured sessions
            alone, the generic plan of a statement filtered by session expects a third of the
            table and scans all of it); measured in `--rounds` rounds, each round going through
            every size, so the ratios are side by side;
  sessions: one `contextd dev` with its own database per size (10^2 .. 10^6 sessions of 5
            chunks and 10 turns each, besides the measured session of 1,000 chunks), all loaded
            first, then measured in `--rounds` interleaved rounds, so the ratios are side by side
            (two sizes, e.g. `--sessions 100,1000000`, keep the machine's memory in bounds);
            `--explain` prints the plans of the vector and exact-hits queries in each database.
            The small sessions are generated in the server (`add_sessions`: INSERT ... SELECT
            over generate_series, their chunks and turns copied from pool tables by index
            arithmetic), in one transaction with the three tables' indexes and keys dropped
            and built again after the rows, as a restore does (`benchmarks.bulk_load`: the
            catalog's own definitions, so the schema is the migrations'); then the measured
            session is written as before, through the indexes. Printed per database: how long
            the rows, the indexes and the keys took, and each table's and index's size.

Kept stores (`--data-dir DIR`): each axis's database (`DIR/chunks`, `DIR/s<N>`: an embedded
PostgreSQL and Valkey each) stays in DIR when the command ends, and a later run with the same DIR
measures what is there instead of loading it again: a session `scale-c<N>` already holding N
chunks (with its HNSW index) and a database already holding N sessions are reused, a missing one
is loaded (a store holding something else is an error: delete that directory). So another
checkout (e.g. after a merge) measures the same data with the same command; `contextd dev` runs
that checkout's migrations on the kept database when it starts. `--load-only` loads what is
missing (and waits for the HNSW index) and stops. Without `--data-dir` the stores live in a
temporary directory, deleted at the end. A 10^5-chunk session and its index took ~10 min on the
2 cores; the sessions axis's load times and sizes are in docs/BENCHMARKS.md ("A database of 10^6
sessions"). Every point gets `--warmup` builds (default 40, not counted) after its first build:
a reused store starts with cold buffers, and a 10^5-chunk session's HNSW index (195 MB) takes
~50 searches to be read into them (the first one read 3,785 pages in 68 ms, the 50th 37).

Ports: the chunks axis's server on `--port`, its Valkey on the next; the sessions axis's i-th
server on `--port` + 2 + 2i, its Valkey on the next (PostgreSQL listens on a Unix socket).
"""

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import re
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from app.core.config import load_settings
from app.core.db import READER_PLANS
from app.domain.text import lexical_document, terms
from app.store.chunks import _NEAREST, _exact_statement, session_lexeme
from app.store.vector_index import vector_index_name
from benchmarks.build_prompt_latency import WORDS, percentile, turn_text
from benchmarks.bulk_load import deferred_indexes, relation_sizes
from benchmarks.floor_compare import DevServer, contextd_dev

DIM = 384
MODEL = "e5-small-q4"
TURNS_PER_CHUNK = 4
WINDOW_TURNS = 10
BIG = "scale-big"
MEASURED_CHUNKS = 1000  # the sessions axis's measured session
NEIGHBOUR = "scale-n"  # the small sessions beside those of the chunks axis
NEIGHBOURS = 1000


POOL = 10_000  # distinct chunk texts the history is drawn from


@functools.cache
def text_pool(seed: int) -> list[tuple[str, str, int, str]]:
    """(text, term counts as JSON, term total, lexical source) of `POOL` synthetic chunks."""
    rng = random.Random(seed)
    pool = []
    for i in range(POOL):
        turn = 1 + i * TURNS_PER_CHUNK
        text = "\n".join(turn_text(rng, turn + k) for k in range(TURNS_PER_CHUNK))
        counts = Counter(terms(text))
        pool.append((text, json.dumps(counts), sum(counts.values()), lexical_document(text)))
    return pool


def chunk_rows(
    rng: random.Random,
    pool: list[tuple[str, str, int, str]],
    tenant: uuid.UUID,
    session: uuid.UUID,
    first_turn: int,
    n: int,
) -> list[tuple[Any, ...]]:
    """`n` chunk rows for COPY (lexical source in place of the tsvector, no vector: Postgres
    draws it), turns from `first_turn` on."""
    rows = []
    for i in range(n):
        turn = first_turn + i * TURNS_PER_CHUNK
        text, counts, total, lexical = pool[rng.randrange(POOL)]
        rows.append(
            (
                uuid.uuid4(),
                tenant,
                session,
                turn,
                turn + TURNS_PER_CHUNK - 1,
                text,
                len(text) // 4,
                counts,
                total,
                lexical,
            )
        )
    return rows


def copy_chunks(conn: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS staged (id uuid, tenant_id uuid, session_id uuid, "
        "turn_first bigint, turn_last bigint, raw_text text, token_count int, term_counts jsonb, "
        "term_total int, lexical_source text)"
    )
    with conn.cursor() as cur:
        with cur.copy("COPY staged FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        # A random direction per row (the subquery refers to the row, so it is drawn per row).
        cur.execute(
            "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last, part, parts, "
            "roles, ts_first, ts_last, raw_text, token_count, term_counts, term_total, lexical, "
            "embedding, embedding_model) SELECT id, tenant_id, session_id, turn_first, "
            "turn_last, 1, 1, '{user,assistant}', now(), now(), raw_text, token_count, "
            "term_counts, term_total, to_tsvector('simple', lexical_source), "
            f"CAST(ARRAY(SELECT random() - 0.5 FROM generate_series(1, {DIM} + 0 * turn_first)) "
            f"AS vector), '{MODEL}' FROM staged"
        )
        cur.execute("TRUNCATE staged")


def add_history(
    conn: psycopg.Connection,
    rng: random.Random,
    pool: list[tuple[str, str, int, str]],
    tenant: uuid.UUID,
    session: uuid.UUID,
    n: int,
) -> None:
    """`n` more chunks in front of the session's window, as an offload would leave them, in one
    transaction: the worker's sweep would otherwise see the chunks before the session's counters,
    "repair" its chunk count and start the session's vector index on part of the history (its
    build then holds the lock the `ANALYZE` below needs for the many minutes it takes)."""
    with conn.transaction():
        first_turn, chunks = conn.execute(
            "SELECT coalesce(max(turn_last), 0) + 1, count(*) FROM chunks WHERE session_id = %s",
            (session,),
        ).fetchone() or (1, 0)
        for start in range(0, n, 5000):
            count = min(5000, n - start)
            copy_chunks(conn, chunk_rows(rng, pool, tenant, session, first_turn, count))
            first_turn += count * TURNS_PER_CHUNK
        # The window moves behind the new history, as after an offload.
        conn.execute("DELETE FROM turns WHERE session_id = %s", (session,))
        insert_window(conn, rng, tenant, session, first_turn)
        # Statistics before the count that lets the worker start the session's vector index: its
        # build (CONCURRENTLY) holds the lock ANALYZE needs until it ends.
        conn.execute("ANALYZE chunks")
        # `turn_count` counts the session's turn rows (the offloaded turns are not written here):
        # a count the rows do not match would have the worker's sweep repair it during the run.
        # `offloaded_until_seq`: a build recalls only from a session with offloaded turns.
        conn.execute(
            "UPDATE sessions SET chunk_count = %s, chunks_version = chunks_version + 1, "
            "last_seq = %s, turn_count = %s, offloaded_until_seq = %s, version = version + 1 "
            "WHERE id = %s",
            (chunks + n, first_turn + WINDOW_TURNS - 1, WINDOW_TURNS, first_turn - 1, session),
        )


def insert_window(
    conn: psycopg.Connection, rng: random.Random, tenant: uuid.UUID, session: uuid.UUID, seq: int
) -> None:
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY turns (tenant_id, session_id, seq, role, content, token_count) FROM STDIN"
        ) as copy,
    ):
        for k in range(WINDOW_TURNS):
            role = "user" if k % 2 == 0 else "assistant"
            copy.write_row((tenant, session, seq + k, role, turn_text(rng, seq + k), 35))
    conn.execute(
        "UPDATE sessions SET c1_tokens = %s, c1_turns = %s WHERE id = %s",
        (35 * WINDOW_TURNS, WINDOW_TURNS, session),
    )


SESSION_CHUNKS = 5  # chunks of each small session, before its window
TURN_POOL = 1000  # distinct texts per window position of the small sessions' turns
BATCH = 100_000  # small sessions per statement


def add_sessions(
    conn: psycopg.Connection,
    rng: random.Random,
    pool: list[tuple[str, str, int, str]],
    tenant: uuid.UUID,
    prefix: str,
    start: int,
    n: int,
) -> None:
    """`n` small sessions (5 chunks, a 10-turn window) named `{prefix}{i}`, generated in the
    server: the chunks copy rows of `pool` (with a tsvector and a random vector each, computed
    once per pool row) and the turns rows of a pool of window texts, picked by index arithmetic
    per session, so a million sessions cost three INSERT ... SELECT per `BATCH` and no row
    crosses the socket."""
    conn.execute("DROP TABLE IF EXISTS pool_source, pool_chunks, pool_turns, batch_ids")
    conn.execute(
        "CREATE TEMP TABLE pool_source (i int, raw_text text, token_count int, "
        "term_counts jsonb, term_total int, lexical_source text)"
    )
    with conn.cursor() as cur, cur.copy("COPY pool_source FROM STDIN") as copy:
        for i, (text, counts, total, lexical) in enumerate(pool):
            copy.write_row((i, text, len(text) // 4, counts, total, lexical))
    # A random direction per pool row (the subquery refers to the row, so it is drawn per row).
    conn.execute(
        "CREATE TEMP TABLE pool_chunks AS SELECT i, raw_text, token_count, term_counts, "
        "term_total, to_tsvector('simple', lexical_source) AS lexical, "
        f"CAST(ARRAY(SELECT random() - 0.5 FROM generate_series(1, {DIM} + 0 * i)) AS vector) "
        "AS embedding FROM pool_source"
    )
    conn.execute("ALTER TABLE pool_chunks ADD PRIMARY KEY (i)")
    conn.execute("CREATE TEMP TABLE pool_turns (i int PRIMARY KEY, content text)")
    first_seq = SESSION_CHUNKS * TURNS_PER_CHUNK + 1
    with conn.cursor() as cur, cur.copy("COPY pool_turns FROM STDIN") as copy:
        for k in range(WINDOW_TURNS):
            for j in range(TURN_POOL):
                copy.write_row((k * TURN_POOL + j, turn_text(rng, first_seq + k)))
    conn.execute("CREATE TEMP TABLE batch_ids (g bigint, id uuid)")
    params = {
        "tenant": tenant,
        "prefix": prefix,
        "model": MODEL,
        "last": first_seq + WINDOW_TURNS - 1,
        "first_seq": first_seq,
    }
    # 7919 is prime to both pool sizes: neighbouring sessions draw different rows.
    statements = (
        "INSERT INTO batch_ids SELECT g, gen_random_uuid() "
        "FROM generate_series(%(a)s::bigint, %(b)s::bigint) g",
        "INSERT INTO sessions (id, tenant_id, external_id, chunk_count, chunks_version, "
        "last_seq, turn_count, c1_tokens, c1_turns, offloaded_until_seq) "
        "SELECT id, %(tenant)s, %(prefix)s || g, "
        f"{SESSION_CHUNKS}, 1, %(last)s, {WINDOW_TURNS}, {35 * WINDOW_TURNS}, {WINDOW_TURNS}, "
        "%(first_seq)s - 1 FROM batch_ids",
        "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last, part, parts, "
        "roles, ts_first, ts_last, raw_text, token_count, term_counts, term_total, lexical, "
        "embedding, embedding_model) SELECT gen_random_uuid(), %(tenant)s, b.id, "
        f"1 + k * {TURNS_PER_CHUNK}, {TURNS_PER_CHUNK} + k * {TURNS_PER_CHUNK}, 1, 1, "
        "'{user,assistant}', now(), now(), p.raw_text, p.token_count, p.term_counts, "
        "p.term_total, p.lexical, p.embedding, %(model)s "
        f"FROM batch_ids b, generate_series(0, {SESSION_CHUNKS - 1}) k, LATERAL (SELECT * "
        f"FROM pool_chunks WHERE i = (b.g * {SESSION_CHUNKS} + k) * 7919 %% {POOL}) p",
        "INSERT INTO turns (tenant_id, session_id, seq, role, content, token_count) "
        "SELECT %(tenant)s, b.id, %(first_seq)s + k, "
        "CASE WHEN k %% 2 = 0 THEN 'user' ELSE 'assistant' END, t.content, 35 "
        f"FROM batch_ids b, generate_series(0, {WINDOW_TURNS - 1}) k, LATERAL (SELECT content "
        f"FROM pool_turns WHERE i = k * {TURN_POOL} + (b.g * 7919 + k) %% {TURN_POOL}) t",
        "TRUNCATE batch_ids",
    )
    started = time.monotonic()
    for a in range(start, start + n, BATCH):
        bounds = {"a": a, "b": min(a + BATCH, start + n) - 1}
        for statement in statements:
            conn.execute(statement, params | bounds)
        if n > BATCH:
            done = bounds["b"] - start + 1
            print(f"    {done:,} sessions in {time.monotonic() - started:.0f} s", flush=True)
    conn.execute("DROP TABLE pool_source, pool_chunks, pool_turns, batch_ids")


def query_text(rng: random.Random) -> str:
    a, b = rng.sample(WORDS, 2)
    return f"what did we agree about the {a} and the {b} {uuid.uuid4().hex[:5]}?"


async def cold_build(http: httpx.AsyncClient, sid: str, seed: int) -> float:
    """The first build of a session in this process (its BM25 index is built then), ms."""
    started = time.perf_counter()
    resp = await http.post(
        f"/v1/sessions/{sid}/build-prompt", json={"query": query_text(random.Random(seed))}
    )
    resp.raise_for_status()
    return (time.perf_counter() - started) * 1000


async def measure(http: httpx.AsyncClient, sid: str, n: int, seed: int) -> dict[str, Any]:
    """`n` builds with distinct queries: client wall times, server stages, fallbacks."""
    rng = random.Random(seed)
    path = f"/v1/sessions/{sid}/build-prompt"
    walls: list[float] = []
    stages: dict[str, list[float]] = {}
    fallbacks: Counter[str] = Counter()
    recalled = 0
    for _ in range(n):
        started = time.perf_counter()
        resp = await http.post(path, json={"query": query_text(rng)})
        walls.append((time.perf_counter() - started) * 1000)
        resp.raise_for_status()
        body = resp.json()
        for stage, ms in body["timings_ms"].items():
            stages.setdefault(stage, []).append(ms)
        fallbacks.update(body["fallbacks"])
        recalled = len(body["recall"]["items"])
    return {"walls": walls, "stages": stages, "fallbacks": fallbacks, "recalled": recalled}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 over every build of the rounds, each round's p50, stage medians."""
    walls = [w for r in rounds for w in r["walls"]]
    stages: dict[str, list[float]] = {}
    fallbacks: Counter[str] = Counter()
    for r in rounds:
        for stage, values in r["stages"].items():
            stages.setdefault(stage, []).extend(values)
        fallbacks.update(r["fallbacks"])
    return {
        "p50": percentile(walls, 0.5),
        "p95": percentile(walls, 0.95),
        "round_p50": [round(percentile(r["walls"], 0.5), 2) for r in rounds],
        "stages": {s: percentile(v, 0.5) for s, v in stages.items()},
        "fallbacks": dict(fallbacks),
        "recalled": rounds[-1]["recalled"],
    }


def print_point(label: str, r: dict[str, Any]) -> None:
    shown = ("recall_lexical", "recall_embed", "recall_vector", "recall_exact", "recall_rerank")
    stage_text = " ".join(f"{s[7:]} {r['stages'].get(s, 0):.1f}" for s in shown)
    print(
        f"{label:>16s}  p50 {r['p50']:7.2f} ms  p95 {r['p95']:7.2f} ms"
        f"  rounds {r['round_p50']}  first {r.get('cold_ms', 0):8.1f} ms"
        f"  | {stage_text}  total {r['stages'].get('total', 0):.1f}"
        f"{'  fallbacks ' + str(r['fallbacks']) if r['fallbacks'] else ''}",
        flush=True,
    )


async def new_session(
    http: httpx.AsyncClient, conn: psycopg.Connection, sid: str
) -> tuple[uuid.UUID, uuid.UUID]:
    """(tenant, primary key) of a new session `sid`."""
    (await http.put(f"/v1/sessions/{sid}", json={})).raise_for_status()
    row = conn.execute(
        "SELECT tenant_id, id FROM sessions WHERE external_id = %s", (sid,)
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def stored_session(conn: psycopg.Connection, sid: str) -> tuple[uuid.UUID, int] | None:
    """(primary key, chunk count) of session `sid` when the store holds it already."""
    row = conn.execute(
        "SELECT id, chunk_count FROM sessions WHERE external_id = %s", (sid,)
    ).fetchone()
    return None if row is None else (row[0], int(row[1]))


def wait_for_vector_index(conn: psycopg.Connection, session: uuid.UUID, limit_s: float) -> float:
    """Seconds until the worker's sweep has built the session's vector index."""
    name = vector_index_name(session, MODEL)
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        row = conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,)
        ).fetchone()
        if row is not None and row[0]:
            return time.monotonic() - started
        time.sleep(2)
    raise SystemExit(f"no vector index after {limit_s:.0f} s")


async def first_builds(http: httpx.AsyncClient, sid: str, seed: int, warmup: int) -> float:
    """The session's first build in this process (ms), then `warmup` builds not counted: the
    measured rounds start with the process's caches and the database's buffers warm."""
    cold = await cold_build(http, sid, seed)
    if warmup:
        await measure(http, sid, warmup, seed=-1 - seed)
    return cold


def side_by_side(rounds: dict[int, list[dict[str, Any]]]) -> list[float]:
    """Each round's p50 at the largest size over its p50 at the smallest."""
    low, high = min(rounds), max(rounds)
    return [
        round(percentile(b["walls"], 0.5) / percentile(a["walls"], 0.5), 3)
        for a, b in zip(rounds[low], rounds[high], strict=True)
    ]


async def chunks_axis(
    args: argparse.Namespace, http: httpx.AsyncClient, conn: psycopg.Connection
) -> dict[int, Any]:
    print("chunks in one session (one session per size, rounds side by side)", flush=True)
    sessions: dict[int, str] = {}
    out: dict[int, Any] = {}
    min_chunks = load_settings().recall.vector_index_min_chunks
    loaded = False
    if stored_session(conn, f"{NEIGHBOUR}1") is None:
        with conn.transaction():
            tenant, _ = await new_session(http, conn, f"{NEIGHBOUR}0")
            add_sessions(conn, random.Random(0), text_pool(11), tenant, NEIGHBOUR, 1, NEIGHBOURS)
        loaded = True
    for n in args.chunks:
        sid = f"scale-c{n}"
        stored = stored_session(conn, sid)
        if stored is None:
            tenant, pk = await new_session(http, conn, sid)
            started = time.monotonic()
            add_history(conn, random.Random(n), text_pool(11), tenant, pk, n)
            out[n] = {"load_s": round(time.monotonic() - started, 1)}
            loaded = True
        elif stored[1] == n:
            pk = stored[0]
            out[n] = {"reused": True}
        else:
            raise SystemExit(f"{sid} holds {stored[1]} chunks, not {n}: delete the store")
        if n >= min_chunks:
            waited = wait_for_vector_index(conn, pk, args.index_wait)
            out[n]["vector_index_wait_s"] = round(waited, 1)
            print(f"  {n} chunks: vector index ready after {waited:.0f} s", flush=True)
        sessions[n] = sid
    if loaded:
        conn.execute("VACUUM ANALYZE")
    if args.load_only:
        return out
    for n, sid in sessions.items():
        out[n]["cold_ms"] = await first_builds(http, sid, n, args.warmup)
    rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in sessions}
    for r in range(args.rounds):
        for n, sid in sessions.items():
            rounds[n].append(await measure(http, sid, args.requests, seed=1000 * r + n))
    for n, sid in sessions.items():
        out[n] |= summary(rounds[n])
        print_point(f"{n} chunks", out[n])
        if args.explain:
            out[n]["plans"] = explain_arms(conn, sid, indexed=n >= min_chunks)
            print_plans(f"{n} chunks", out[n]["plans"])
    out[max(sessions)]["round_ratio_to_smallest"] = side_by_side(rounds)
    return out


async def load_sessions_point(
    http: httpx.AsyncClient, conn: psycopg.Connection, sessions: int, seed: int
) -> dict[str, Any]:
    """One database of the sessions axis: `sessions - 1` small ones loaded as a restore would
    (`bulk_load.deferred_indexes`, one transaction), then the measured session (1,000 chunks)
    written through the indexes, analysed; kept as it is when the store holds them already."""
    row = conn.execute("SELECT count(*) FROM sessions").fetchone()
    stored = 0 if row is None else int(row[0])
    measured_stored = stored_session(conn, BIG)
    if measured_stored is not None:
        if stored != sessions or measured_stored[1] != MEASURED_CHUNKS:
            raise SystemExit(f"the store holds {stored} sessions, not {sessions}: delete it")
        return {"reused": True}
    rng = random.Random(seed)
    pool = text_pool(seed)
    started = time.monotonic()
    tenant, measured = await new_session(http, conn, BIG)
    # Index builds sort in memory rather than in many runs on disk (this connection only).
    conn.execute("SET maintenance_work_mem = '1GB'")
    with conn.transaction(), deferred_indexes(conn, ["sessions", "chunks", "turns"]) as rebuilt:
        add_sessions(conn, rng, pool, tenant, "scale-s", 1, sessions - 1)
        rows_s = time.monotonic() - started
    add_history(conn, rng, pool, tenant, measured, MEASURED_CHUNKS)
    conn.execute("VACUUM ANALYZE")
    return {"load_s": round(time.monotonic() - started, 1), "rows_s": round(rows_s, 1)} | rebuilt


def print_load(sessions: int, point: dict[str, Any]) -> None:
    """How a database of the sessions axis was loaded and what it takes on disk."""
    if "load_s" in point:
        state = (
            f"loaded in {point['load_s']:.0f} s (rows {point['rows_s']:.0f} s, indexes "
            f"{point['indexes_s']:.0f} s, keys {point['keys_s']:.0f} s)"
        )
    else:
        state = "kept"
    print(
        f"  {sessions} sessions {state}, database {point['database_bytes'] / 2**20:,.0f} MB",
        flush=True,
    )
    for name, rows, size in point["relations"]:
        counted = f"{rows:>12,} rows" if rows else ""
        print(f"    {name:40s} {counted:>17s} {size / 2**20:>10,.1f} MB", flush=True)


def reader_plan(conn: psycopg.Connection, statement: str, params: dict[str, Any]) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of `statement` (psycopg placeholders) as the reader pool runs
    it: prepared, with its settings (`app.core.db.READER_PLANS`), the third run (warm)."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    prepared = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    reader_settings = [setting.split("=", 1) for setting in READER_PLANS]
    for name, value in reader_settings:
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
    conn.execute(f"PREPARE arm AS {prepared}")
    values = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE arm ({})").format(values)
    try:
        for _ in range(3):
            rows = conn.execute(explain).fetchall()
    finally:
        conn.execute("DEALLOCATE arm")
        for name, _ in reader_settings:
            conn.execute(sql.SQL("RESET {}").format(sql.Identifier(name)))
    return "\n".join(r[0] for r in rows)


def index_plan(conn: psycopg.Connection, session: uuid.UUID, vector: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the HNSW search of a session with its own index, as
    `nearest_through_index` sends it (literal session and model, no sort, `hnsw.ef_search`),
    warm."""
    ef = load_settings().recall.vector_index_ef_search
    statement = (
        f"EXPLAIN (ANALYZE, BUFFERS) SELECT id, CAST(embedding AS vector({DIM})) "
        f"<=> CAST(%(v)s AS vector({DIM})) AS distance FROM chunks "
        f"WHERE session_id = '{session}'::uuid AND status = 'active' "
        f"AND embedding_model = '{MODEL}' ORDER BY distance LIMIT 30"
    )
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(max(ef, 30)),))
        conn.execute("SET LOCAL enable_sort = off")
        for _ in range(3):
            rows = conn.execute(statement, {"v": vector}).fetchall()
    return "\n".join(r[0] for r in rows)


def explain_arms(conn: psycopg.Connection, sid: str, indexed: bool) -> dict[str, str]:
    """The plans and times of recall's database arms on session `sid`, with the statements of
    `app.store.chunks`: the vector arm (ids and distances, as a build that keeps the
    chunks' rows sends it; the HNSW search when the session has its index; none for a session
    whose vectors recall scans in process) and the exact hits of a query's ID that no chunk
    holds (as the benchmark's queries' IDs) and of a word every chunk holds."""
    stored = stored_session(conn, sid)
    assert stored is not None
    session, chunks = stored
    tenant_row = conn.execute("SELECT tenant_id FROM sessions WHERE id = %s", (session,)).fetchone()
    assert tenant_row is not None
    tenant = tenant_row[0]
    row = conn.execute(
        "SELECT embedding::text FROM chunks WHERE session_id = %s LIMIT 1", (session,)
    ).fetchone()
    assert row is not None
    vector = row[0]
    plans = {}
    in_process = load_settings().recall.vector_scan_in_process_mb * 2**20
    if indexed:
        plans["vector"] = index_plan(conn, session, vector)
    elif chunks * DIM * 4 > in_process:
        params = {
            "vector": vector,
            "tenant": tenant,
            "session": session,
            "model": MODEL,
            "limit": 30,
        }
        plans["vector"] = reader_plan(conn, _NEAREST, params)
    statement = _exact_statement(1, by_terms=True)
    for arm, needle in (("exact", "7fa3c"), ("exact, a term of every chunk", "amount")):
        params = {
            "tenant": tenant,
            "limit": 30,
            "n0": f"%{needle}%",
            "t0": lexical_document(needle),
            "session_lexeme": session_lexeme(session),
        }
        plans[arm] = reader_plan(conn, statement, params)
    return {arm: plan.replace(vector, "[query vector]") for arm, plan in plans.items()}


def print_plans(label: str, plans: dict[str, str]) -> None:
    for arm, plan in plans.items():
        print(f"--- {label}, {arm} arm\n{plan}", flush=True)


async def sessions_axis(args: argparse.Namespace, servers: list[DevServer]) -> dict[int, Any]:
    """One `contextd dev` with its own database per size, all loaded first, then measured in
    interleaved rounds (the order alternating), so every round's ratio is side by side."""
    print("sessions in the database (measured session: 1,000 chunks), side by side", flush=True)
    out: dict[int, Any] = {}
    clients = {
        n: httpx.AsyncClient(base_url=s.url, timeout=600)
        for n, s in zip(args.sessions, servers, strict=True)
    }
    try:
        for n, server in zip(args.sessions, servers, strict=True):
            with psycopg.connect(server.database_url, autocommit=True) as conn:
                out[n] = await load_sessions_point(clients[n], conn, n, seed=11)
                out[n]["relations"] = relation_sizes(conn, ["sessions", "chunks", "turns"])
                row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
                out[n]["database_bytes"] = 0 if row is None else int(row[0])
            print_load(n, out[n])
        if args.load_only:
            return out
        for n in args.sessions:
            out[n]["cold_ms"] = await first_builds(clients[n], BIG, n, args.warmup)
        rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in args.sessions}
        for r in range(args.rounds):
            order = args.sessions if r % 2 == 0 else args.sessions[::-1]
            for n in order:
                rounds[n].append(await measure(clients[n], BIG, args.requests, seed=1000 * r))
        for n, server in zip(args.sessions, servers, strict=True):
            out[n] |= summary(rounds[n])
            print_point(f"{n} sessions", out[n])
            if args.explain:
                with psycopg.connect(server.database_url, autocommit=True) as conn:
                    out[n]["plans"] = explain_arms(conn, BIG, indexed=False)
                print_plans(f"{n} sessions", out[n]["plans"])
        out[max(args.sessions)]["round_ratio_to_smallest"] = side_by_side(rounds)
    finally:
        for client in clients.values():
            await client.aclose()
    return out


async def run(args: argparse.Namespace, server: DevServer) -> dict[int, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
        with psycopg.connect(server.database_url, autocommit=True) as conn:
            return await chunks_axis(args, http, conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])

    def sizes(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    parser.add_argument("--chunks", type=sizes, default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--sessions", type=sizes, default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--requests", type=int, default=40, help="builds per point and round")
    parser.add_argument("--rounds", type=int, default=3, help="measurement rounds per point")
    parser.add_argument(
        "--warmup", type=int, default=40, help="builds per point before the rounds, not counted"
    )
    parser.add_argument(
        "--index-wait", type=float, default=3600, help="longest wait for a vector index, s"
    )
    parser.add_argument("--port", type=int, default=random.randint(18100, 18900))
    parser.add_argument(
        "--data-dir", type=Path, help="keep the stores here; reuse what is loaded there already"
    )
    parser.add_argument(
        "--load-only", action="store_true", help="load the stores (--data-dir) and stop"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--explain", action="store_true", help="print the vector and exact-hits plans per size"
    )
    args = parser.parse_args()
    if args.load_only and args.data_dir is None:
        parser.error("--load-only keeps nothing without --data-dir")
    out: dict[str, Any] = {}
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {os.cpu_count()} cores")
    persist = args.data_dir is not None
    with contextlib.ExitStack() as stack:
        root = args.data_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="recall-scale-"))
        )
        if args.chunks:
            with contextd_dev(
                root / "chunks", args.port, [], args.port + 1, persist=persist
            ) as server:
                out["chunks"] = asyncio.run(run(args, server))
        if args.sessions:
            with contextlib.ExitStack() as servers_stack:
                servers = [
                    servers_stack.enter_context(
                        contextd_dev(
                            root / f"s{n}",
                            args.port + 2 + 2 * i,
                            [],
                            args.port + 3 + 2 * i,
                            persist=persist,
                        )
                    )
                    for i, n in enumerate(args.sessions)
                ]
                out["sessions"] = asyncio.run(sessions_axis(args, servers))
    load = os.getloadavg()
    print(f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    for kind, low, high in (("chunks", 1000, 100_000), ("sessions", 100, 100_000)):
        points = out.get(kind, {})
        if "p50" in points.get(low, {}) and "p50" in points.get(high, {}):
            ratio = points[high]["p50"] / points[low]["p50"]
            rounds = [
                round(b / a, 2)
                for a, b in zip(points[low]["round_p50"], points[high]["round_p50"], strict=True)
            ]
            print(f"{kind}: p50 at {high} / p50 at {low} = {ratio:.2f} (per round {rounds})")


if __name__ == "__main__":
    main()
