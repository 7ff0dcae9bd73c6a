"""build-prompt with recall as history grows: chunks per session, and sessions in the database.

    .venv/bin/python -m benchmarks.recall_scale [--chunks 100,1000,10000,100000]
        [--sessions 100,1000,10000,100000] [--requests 40] [--rounds 3] [--json out.json]

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

  chunks:   one session per size (10^2 .. 10^5 chunks) in one database; measured in `--rounds`
            rounds, each round going through every size, so the ratios are side by side;
  sessions: one `contextd dev` with its own database per size (10^2 .. 10^5 sessions of 5
            chunks and 10 turns each, besides the measured session of 1,000 chunks), all loaded
            first, then measured in `--rounds` interleaved rounds, so the ratios are side by side
            (two sizes, e.g. `--sessions 100,100000`, keep the machine's memory in bounds);
            `--explain` prints the plans of the vector and exact-hits queries in each database.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg

from app.core.config import load_settings
from app.core.text import lexical_document, terms
from app.offload.repository import vector_index_name
from benchmarks.build_prompt_latency import WORDS, percentile, turn_text
from benchmarks.floor_compare import DevServer, contextd_dev

DIM = 384
MODEL = "e5-small-q4"
TURNS_PER_CHUNK = 4
WINDOW_TURNS = 10
BIG = "scale-big"


POOL = 10_000  # distinct chunk texts the history is drawn from


def text_pool(rng: random.Random) -> list[tuple[str, str, int, str]]:
    """(text, term counts as JSON, term total, lexical source) of `POOL` synthetic chunks."""
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
    """`n` more chunks in front of the session's window, as an offload would leave them."""
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
    conn.execute(
        "UPDATE sessions SET chunk_count = %s, chunks_version = chunks_version + 1, "
        "last_seq = %s, turn_count = %s, version = version + 1 WHERE id = %s",
        (chunks + n, first_turn + WINDOW_TURNS - 1, first_turn + WINDOW_TURNS - 1, session),
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


def add_sessions(
    conn: psycopg.Connection,
    rng: random.Random,
    pool: list[tuple[str, str, int, str]],
    tenant: uuid.UUID,
    prefix: str,
    start: int,
    n: int,
) -> None:
    """`n` small sessions (5 chunks, a 10-turn window) named `{prefix}{i}`."""
    for offset in range(0, n, 1000):
        ids = [uuid.uuid4() for _ in range(min(1000, n - offset))]
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY sessions (id, tenant_id, external_id, chunk_count, chunks_version, "
                "last_seq, turn_count) FROM STDIN"
            ) as copy,
        ):
            for k, sid in enumerate(ids):
                last = 5 * TURNS_PER_CHUNK + WINDOW_TURNS
                copy.write_row((sid, tenant, f"{prefix}{start + offset + k}", 5, 1, last, last))
        rows = []
        for sid in ids:
            rows += chunk_rows(rng, pool, tenant, sid, 1, 5)
        copy_chunks(conn, rows)
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY turns (tenant_id, session_id, seq, role, content, token_count) FROM STDIN"
            ) as copy,
        ):
            for sid in ids:
                for k in range(WINDOW_TURNS):
                    seq = 5 * TURNS_PER_CHUNK + 1 + k
                    role = "user" if k % 2 == 0 else "assistant"
                    copy.write_row((tenant, sid, seq, role, turn_text(rng, seq), 35))
        conn.execute(
            "UPDATE sessions SET c1_tokens = %s, c1_turns = %s WHERE id = ANY(%s)",
            (35 * WINDOW_TURNS, WINDOW_TURNS, ids),
        )


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


async def chunks_axis(
    args: argparse.Namespace,
    http: httpx.AsyncClient,
    conn: psycopg.Connection,
    rng: random.Random,
    pool: list[tuple[str, str, int, str]],
) -> dict[int, Any]:
    print("chunks in one session (one session per size, rounds side by side)", flush=True)
    sessions: dict[int, str] = {}
    out: dict[int, Any] = {}
    min_chunks = load_settings().recall.vector_index_min_chunks
    for n in args.chunks:
        sid = f"scale-c{n}"
        tenant, pk = await new_session(http, conn, sid)
        started = time.monotonic()
        add_history(conn, rng, pool, tenant, pk, n)
        out[n] = {"load_s": round(time.monotonic() - started, 1)}
        if n >= min_chunks:
            waited = wait_for_vector_index(conn, pk, args.index_wait)
            out[n]["vector_index_wait_s"] = round(waited, 1)
            print(f"  {n} chunks: vector index ready after {waited:.0f} s", flush=True)
        sessions[n] = sid
    for n, sid in sessions.items():
        out[n]["cold_ms"] = await cold_build(http, sid, seed=n)
    rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in sessions}
    for r in range(args.rounds):
        for n, sid in sessions.items():
            rounds[n].append(await measure(http, sid, args.requests, seed=1000 * r + n))
    for n in sessions:
        out[n] |= summary(rounds[n])
        print_point(f"{n} chunks", out[n])
    low, high = min(sessions), max(sessions)
    ratios = [
        percentile(b["walls"], 0.5) / percentile(a["walls"], 0.5)
        for a, b in zip(rounds[low], rounds[high], strict=True)
    ]
    out[high]["round_ratio_to_smallest"] = [round(x, 3) for x in ratios]
    return out


async def load_sessions_point(
    http: httpx.AsyncClient, conn: psycopg.Connection, sessions: int, seed: int
) -> dict[str, Any]:
    """One database of the sessions axis: the measured session (1,000 chunks) and `sessions - 1`
    small ones, analysed; then the first build."""
    rng = random.Random(seed)
    pool = text_pool(rng)
    started = time.monotonic()
    tenant, measured = await new_session(http, conn, BIG)
    add_history(conn, rng, pool, tenant, measured, 1000)
    add_sessions(conn, rng, pool, tenant, "scale-s", 1, sessions - 1)
    conn.execute("VACUUM ANALYZE")
    out: dict[str, Any] = {"load_s": round(time.monotonic() - started, 1)}
    out["cold_ms"] = await cold_build(http, BIG, seed=sessions)
    return out


def explain_arms(conn: psycopg.Connection) -> dict[str, str]:
    """EXPLAIN ANALYZE of the database arms of recall (vector, exact hits) on the measured
    session, with the statements of `app.offload.repository`: the plan and its times."""
    session = conn.execute("SELECT id FROM sessions WHERE external_id = %s", (BIG,)).fetchone()
    assert session is not None
    vector = conn.execute(
        "SELECT embedding::text FROM chunks WHERE session_id = %s LIMIT 1", (session[0],)
    ).fetchone()
    assert vector is not None
    statements = {
        "vector": (
            "SELECT id, embedding <=> CAST(%(v)s AS vector) AS distance FROM chunks "
            "WHERE session_id = %(s)s AND status = 'active' AND embedding_model = %(m)s "
            "ORDER BY distance LIMIT 30"
        ),
        "exact": (
            "SELECT id FROM chunks WHERE session_id = %(s)s AND status = 'active' "
            "AND raw_text ILIKE '%%ord-4471%%' AND lexical @@ plainto_tsquery('simple', "
            "'ord-4471 ord 4471') ORDER BY turn_last DESC LIMIT 30"
        ),
    }
    params = {"v": vector[0], "s": session[0], "m": MODEL}
    plans = {}
    for arm, sql in statements.items():
        for _ in range(3):  # warm: the measured builds run against a warm cache
            rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params).fetchall()
        plans[arm] = "\n".join(r[0] for r in rows).replace(vector[0], "[query vector]")
    return plans


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
            print(f"  {n} sessions loaded in {out[n]['load_s']:.0f} s", flush=True)
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
                    out[n]["plans"] = explain_arms(conn)
                for arm, plan in out[n]["plans"].items():
                    print(f"--- {n} sessions, {arm} arm\n{plan}", flush=True)
        low, high = min(args.sessions), max(args.sessions)
        ratios = [
            percentile(b["walls"], 0.5) / percentile(a["walls"], 0.5)
            for a, b in zip(rounds[low], rounds[high], strict=True)
        ]
        out[high]["round_ratio_to_smallest"] = [round(x, 3) for x in ratios]
    finally:
        for client in clients.values():
            await client.aclose()
    return out


async def run(args: argparse.Namespace, base: str, database_url: str) -> dict[int, Any]:
    rng = random.Random(11)
    pool = text_pool(rng)
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return await chunks_axis(args, http, conn, rng, pool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])

    def sizes(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    parser.add_argument("--chunks", type=sizes, default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--sessions", type=sizes, default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--requests", type=int, default=40, help="builds per point and round")
    parser.add_argument("--rounds", type=int, default=3, help="measurement rounds per point")
    parser.add_argument(
        "--index-wait", type=float, default=3600, help="longest wait for a vector index, s"
    )
    parser.add_argument("--port", type=int, default=random.randint(18100, 18900))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--explain", action="store_true", help="print the vector and exact-hits plans per size"
    )
    args = parser.parse_args()
    out: dict[str, Any] = {}
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="recall-scale-") as tmp:
        if args.chunks:
            with contextd_dev(Path(tmp) / "chunks", args.port, []) as server:
                out["chunks"] = asyncio.run(run(args, server.url, server.database_url))
        if args.sessions:
            with contextlib.ExitStack() as stack:
                servers = [
                    stack.enter_context(
                        contextd_dev(Path(tmp) / f"s{n}", args.port + 1 + i, [], args.port + 50 + i)
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
        if low in points and high in points:
            ratio = points[high]["p50"] / points[low]["p50"]
            rounds = [
                round(b / a, 2)
                for a, b in zip(points[low]["round_p50"], points[high]["round_p50"], strict=True)
            ]
            print(f"{kind}: p50 at {high} / p50 at {low} = {ratio:.2f} (per round {rounds})")


if __name__ == "__main__":
    main()
