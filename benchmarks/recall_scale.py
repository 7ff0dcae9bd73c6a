"""build-prompt with recall as history grows: chunks per session, and sessions in the database.

    .venv/bin/python -m benchmarks.recall_scale [--chunks 100,1000,10000,100000]
        [--sessions 100,1000,10000,100000] [--requests 100] [--json out.json]

Starts a `contextd dev` (default settings, its own embedded Postgres and Valkey) and writes the
history straight into Postgres (COPY), as the offload and the worker would have: chunks of four
synthetic turns (~110 tokens, word list + an ID and an amount each), their term statistics and
tsvector, and a random unit 384-d vector as their e5 embedding (search latency does not depend on
what the vectors mean). Then, per point, one client sends build-prompt requests with distinct
queries (recall in auto mode, so every arm runs) and the command prints p50/p95 of the client
wall time and the server's stages (`timings_ms`), and the first build after the history grew
(the per-process BM25 index is rebuilt then).

  chunks:   one session grows through 10^2 .. 10^5 chunks (the database holds nothing else);
  sessions: the database grows through 10^2 .. 10^5 sessions of 5 chunks and 10 turns each; the
            measured session always holds 1,000 chunks.
"""

import argparse
import asyncio
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
import numpy as np
import psycopg

from app.core.text import lexical_document, terms
from benchmarks.build_prompt_latency import WORDS, percentile, turn_text
from benchmarks.floor_compare import contextd_dev

DIM = 384
MODEL = "e5-small-q4"
TURNS_PER_CHUNK = 4
WINDOW_TURNS = 10
BIG = "scale-big"


def chunk_rows(
    rng: random.Random, tenant: uuid.UUID, session: uuid.UUID, first_turn: int, n: int
) -> list[tuple[Any, ...]]:
    """`n` chunk rows for COPY (lexical source in place of the tsvector), turns from
    `first_turn` on."""
    vectors = np.random.default_rng(rng.randrange(2**32)).standard_normal((n, DIM))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = []
    for i in range(n):
        turn = first_turn + i * TURNS_PER_CHUNK
        text = "\n".join(turn_text(rng, turn + k) for k in range(TURNS_PER_CHUNK))
        counts = Counter(terms(text))
        rows.append(
            (
                uuid.uuid4(),
                tenant,
                session,
                turn,
                turn + TURNS_PER_CHUNK - 1,
                text,
                len(text) // 4,
                json.dumps(counts),
                sum(counts.values()),
                lexical_document(text),
                "[" + ",".join(f"{x:.6f}" for x in vectors[i]) + "]",
            )
        )
    return rows


def copy_chunks(conn: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS staged (id uuid, tenant_id uuid, session_id uuid, "
        "turn_first bigint, turn_last bigint, raw_text text, token_count int, term_counts jsonb, "
        "term_total int, lexical_source text, embedding text)"
    )
    with conn.cursor() as cur:
        with cur.copy("COPY staged FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cur.execute(
            "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last, part, parts, "
            "roles, ts_first, ts_last, raw_text, token_count, term_counts, term_total, lexical, "
            "embedding, embedding_model) SELECT id, tenant_id, session_id, turn_first, "
            "turn_last, 1, 1, '{user,assistant}', now(), now(), raw_text, token_count, "
            "term_counts, term_total, to_tsvector('simple', lexical_source), "
            f"embedding::vector, '{MODEL}' FROM staged"
        )
        cur.execute("TRUNCATE staged")


def add_history(
    conn: psycopg.Connection, rng: random.Random, tenant: uuid.UUID, session: uuid.UUID, n: int
) -> None:
    """`n` more chunks in front of the session's window, as an offload would leave them."""
    first_turn, chunks = conn.execute(
        "SELECT coalesce(max(turn_last), 0) + 1, count(*) FROM chunks WHERE session_id = %s",
        (session,),
    ).fetchone() or (1, 0)
    for start in range(0, n, 5000):
        count = min(5000, n - start)
        copy_chunks(conn, chunk_rows(rng, tenant, session, first_turn, count))
        first_turn += count * TURNS_PER_CHUNK
    # The window moves behind the new history, as after an offload.
    conn.execute("DELETE FROM turns WHERE session_id = %s", (session,))
    insert_window(conn, rng, tenant, session, first_turn)
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
    conn: psycopg.Connection, rng: random.Random, tenant: uuid.UUID, prefix: str, start: int, n: int
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
            rows += chunk_rows(rng, tenant, sid, 1, 5)
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


async def measure(http: httpx.AsyncClient, sid: str, n: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    path = f"/v1/sessions/{sid}/build-prompt"
    started = time.perf_counter()
    first = await http.post(path, json={"query": query_text(rng)})
    first.raise_for_status()
    cold = (time.perf_counter() - started) * 1000
    walls: list[float] = []
    stages: dict[str, list[float]] = {}
    fallbacks: Counter[str] = Counter()
    for _ in range(n):
        started = time.perf_counter()
        resp = await http.post(path, json={"query": query_text(rng)})
        walls.append((time.perf_counter() - started) * 1000)
        resp.raise_for_status()
        body = resp.json()
        for stage, ms in body["timings_ms"].items():
            stages.setdefault(stage, []).append(ms)
        fallbacks.update(body["fallbacks"])
    return {
        "cold_ms": cold,
        "p50": percentile(walls, 0.5),
        "p95": percentile(walls, 0.95),
        "stages": {s: percentile(v, 0.5) for s, v in stages.items()},
        "fallbacks": dict(fallbacks),
        "recalled": len(first.json()["recall"]["items"]),
    }


def print_point(label: str, r: dict[str, Any]) -> None:
    shown = ("recall_lexical", "recall_embed", "recall_vector", "recall_exact", "recall_rerank")
    stage_text = " ".join(f"{s[7:]} {r['stages'].get(s, 0):.1f}" for s in shown)
    print(
        f"{label:>16s}  p50 {r['p50']:7.2f} ms  p95 {r['p95']:7.2f} ms"
        f"  first {r['cold_ms']:8.1f} ms"
        f"  | {stage_text}  total {r['stages'].get('total', 0):.1f}"
        f"{'  fallbacks ' + str(r['fallbacks']) if r['fallbacks'] else ''}",
        flush=True,
    )


async def run(args: argparse.Namespace, base: str, database_url: str) -> dict[str, Any]:
    rng = random.Random(11)
    out: dict[str, Any] = {"chunks": {}, "sessions": {}}
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        (await http.put(f"/v1/sessions/{BIG}", json={})).raise_for_status()
        with psycopg.connect(database_url, autocommit=True) as conn:
            tenant, big = conn.execute(
                "SELECT tenant_id, id FROM sessions WHERE external_id = %s", (BIG,)
            ).fetchone() or (None, None)
            assert tenant is not None and big is not None
            if args.chunks:
                print("chunks in one session", flush=True)
            have = 0
            for target in args.chunks:
                t0 = time.monotonic()
                add_history(conn, rng, tenant, big, target - have)
                conn.execute("ANALYZE chunks")
                have = target
                load_s = time.monotonic() - t0
                result = await measure(http, BIG, args.requests, seed=target)
                result["load_s"] = load_s
                out["chunks"][target] = result
                print_point(f"{target} chunks", result)
            if args.sessions:
                print("sessions in the database (measured session: 1,000 chunks)", flush=True)
                conn.execute("DELETE FROM sessions WHERE id = %s", (big,))
                (await http.put(f"/v1/sessions/{BIG}", json={})).raise_for_status()
                row = conn.execute("SELECT id FROM sessions WHERE external_id = %s", (BIG,))
                big = (row.fetchone() or (None,))[0]
                add_history(conn, rng, tenant, big, 1000)
            have = 1
            for target in args.sessions:
                t0 = time.monotonic()
                add_sessions(conn, rng, tenant, "scale-s", have, target - have)
                conn.execute("ANALYZE")
                have = target
                load_s = time.monotonic() - t0
                result = await measure(http, BIG, args.requests, seed=target)
                result["load_s"] = load_s
                out["sessions"][target] = result
                print_point(f"{target} sessions", result)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])

    def sizes(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    parser.add_argument("--chunks", type=sizes, default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--sessions", type=sizes, default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--requests", type=int, default=100, help="builds per point")
    parser.add_argument("--port", type=int, default=random.randint(18100, 18900))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="recall-scale-") as tmp,
        contextd_dev(Path(tmp), args.port, []) as server,
    ):
        load = os.getloadavg()
        print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {os.cpu_count()} cores")
        out = asyncio.run(run(args, server.url, server.database_url))
        load = os.getloadavg()
        print(f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    for kind, low, high in (("chunks", 1000, 100_000), ("sessions", 100, 100_000)):
        if low in out[kind] and high in out[kind]:
            ratio = out[kind][high]["p50"] / out[kind][low]["p50"]
            print(f"{kind}: p50 at {high} / p50 at {low} = {ratio:.2f}")


if __name__ == "__main__":
    main()
