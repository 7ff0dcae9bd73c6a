"""Capacity figures that do not depend on the machine's load: what a known conversation set
costs in PostgreSQL rows and bytes, and an active session in Redis.

    .venv/bin/python -m benchmarks.capacity --locomo ../shared/eval/locomo/locomo_dev.json \
        [--conversations 10] [--agent-sessions 50] [--agent-turns 40]

One API process and one worker (`contextd serve`, `contextd worker`, the bundled e5 for
passages and queries, notes by the rules) on a fresh embedded PostgreSQL and Valkey, ingested
over HTTP in two sets, each then waited on until every offload, notes refresh and chunk vector
is done and the tables vacuumed:

1. LoCoMo (the first `--conversations` of `--locomo`, one session each, 20 turns an append; English,
   short turns; the window of `contextd eval locomo`: most of each conversation offloaded);
2. `--agent-sessions` sessions of `--agent-turns` bilingual turns (English and Chinese, order
   ids, one or two turns an append, a 1,600-token window: `tests/system/deployment.py`'s turns).

Prints, per set, rows and bytes per 1,000 turns of every table (heap with TOAST, and indexes),
the bytes of the chunks' columns (text, lexical `tsvector`, term counts, vector), the GIN
(lexical) and HNSW index sizes per 1,000 chunks (an HNSW index is built for every session here,
as the worker's sweep does for a session past `recall.vector_index_min_chunks`), and, after two
build-prompts on every session, the Redis memory of one active session: `MEMORY USAGE` of every
key carrying the session's hash tag (again after one `GET` of each session's view, which caches
it), the query-vector keys the builds wrote, and the `INFO memory` delta over the builds divided
by the sessions.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.tokens import count_tokens
from app.eval.locomo import load_locomo
from app.runtime.embedded import EmbeddedStack
from app.store.vector_index import ensure_vector_index
from benchmarks.scale_out import provisioned
from tests.support.waiting import wait_for
from tests.system.deployment import SMALL_WINDOW, Fleet, client_turn, deployment, process_env
from tests.system.deployment import settled as queue_settled

# The window `contextd eval locomo` ingests with (app/eval/driver.py's EvalConfig).
LOCOMO_WINDOW = {
    "context_limit": 4000,
    "reserve_tokens": 500,
    "min_recent_turns": 4,
    "min_recent_tokens": 500,
    "target_ratio": 0.1,
}
LOCOMO_TURNS_PER_APPEND = 20

RELATIONS = text(
    "SELECT c.relname, c.relkind, coalesce(t.relname, c.relname), coalesce(am.amname, ''),"
    " CASE WHEN c.relkind = 'r' THEN pg_table_size(c.oid) ELSE pg_relation_size(c.oid) END"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " LEFT JOIN pg_index i ON i.indexrelid = c.oid"
    " LEFT JOIN pg_class t ON t.oid = i.indrelid"
    " LEFT JOIN pg_am am ON am.oid = c.relam"
    " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')"
)
CHUNK_COLUMNS = text(
    "SELECT count(*), coalesce(sum(pg_column_size(raw_text)), 0),"
    " coalesce(sum(pg_column_size(lexical)), 0), coalesce(sum(pg_column_size(term_counts)), 0),"
    " coalesce(sum(pg_column_size(embedding)), 0), count(embedding)"
    " FROM chunks"
)


@dataclass(frozen=True)
class Relation:
    name: str
    table: str  # the table itself, or the one an index is on
    kind: str  # 'table', or the index's access method: btree, gin, hnsw
    bytes: int


@dataclass(frozen=True)
class Snapshot:
    relations: dict[str, Relation]
    rows: dict[str, int]
    chunk_columns: dict[str, int]
    database_bytes: int


async def vacuum(engine: AsyncEngine) -> None:
    """VACUUM ANALYZE every table: GIN pending lists merged, sizes as they stay."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE"))


async def snapshot(engine: AsyncEngine) -> Snapshot:
    await vacuum(engine)
    async with engine.connect() as conn:
        relations = {
            name: Relation(name, table, "table" if relkind == "r" else method, int(size))
            for name, relkind, table, method, size in (await conn.execute(RELATIONS)).all()
        }
        rows = {}
        for rel in relations.values():
            if rel.kind == "table":
                quoted = '"' + rel.name.replace('"', '""') + '"'
                rows[rel.name] = int(await conn.scalar(text(f"SELECT count(*) FROM {quoted}")))
        found = (await conn.execute(CHUNK_COLUMNS)).one()
        database = int(await conn.scalar(text("SELECT pg_database_size(current_database())")))
    chunk_columns = dict(
        zip(
            ("rows", "raw_text", "lexical", "term_counts", "embedding", "vectors"),
            found,
            strict=True,
        )
    )
    return Snapshot(relations, rows, {k: int(v) for k, v in chunk_columns.items()}, database)


def kib(value: float) -> str:
    return f"{value / 1024:,.1f}"


def per_kturn_table(before: Snapshot, after: Snapshot, turns: int) -> str:
    """Rows and KiB per 1,000 turns of each table that grew, heap (with TOAST) and indexes."""
    scale = 1000 / turns
    lines = [
        "| table | rows | heap + TOAST KiB | indexes KiB | of which |",
        "|---|---|---|---|---|",
    ]
    tables = sorted(r.name for r in after.relations.values() if r.kind == "table")
    totals = [0.0, 0.0]
    for table in tables:
        rows = after.rows[table] - before.rows.get(table, 0)
        heap = after.relations[table].bytes - _size(before, table)
        indexes = [r for r in after.relations.values() if r.kind != "table" and r.table == table]
        index_bytes = sum(r.bytes - _size(before, r.name) for r in indexes)
        if rows == 0 and heap == 0 and index_bytes == 0:
            continue
        by_kind: dict[str, float] = {}
        for r in indexes:
            by_kind[r.kind] = by_kind.get(r.kind, 0) + r.bytes - _size(before, r.name)
        detail = ", ".join(f"{kind} {kib(size * scale)}" for kind, size in sorted(by_kind.items()))
        totals[0] += heap * scale
        totals[1] += index_bytes * scale
        lines.append(
            f"| {table} | {rows * scale:,.0f} | {kib(heap * scale)} | {kib(index_bytes * scale)}"
            f" | {detail} |"
        )
    lines.append(f"| all | | {kib(totals[0])} | {kib(totals[1])} | |")
    grown = (after.database_bytes - before.database_bytes) * scale
    lines.append(f"\nThe database grew by {kib(grown)} KiB per 1,000 turns.")
    return "\n".join(lines)


def _size(snap: Snapshot, name: str) -> int:
    found = snap.relations.get(name)
    return found.bytes if found else 0


def chunk_lines(before: Snapshot, after: Snapshot) -> str:
    chunks = after.chunk_columns["rows"] - before.chunk_columns["rows"]
    if chunks <= 0:
        return "no chunks"
    per = {
        column: (after.chunk_columns[column] - before.chunk_columns[column]) / chunks
        for column in ("raw_text", "lexical", "term_counts", "embedding")
    }
    gin = sum(r.bytes - _size(before, r.name) for r in after.relations.values() if r.kind == "gin")
    return (
        f"{chunks} chunks ({after.chunk_columns['vectors'] - before.chunk_columns['vectors']}"
        " with a vector); bytes per chunk: "
        + ", ".join(f"{column} {size:,.0f}" for column, size in per.items())
        + f"; GIN (lexical) index {kib(gin * 1000 / chunks)} KiB per 1,000 chunks"
    )


async def hnsw_per_kchunk(engine: AsyncEngine, work_mem_mb: int) -> str:
    """Build every session's HNSW index (as the sweep does past its threshold); its size per
    1,000 vectors."""
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        sessions = (
            await conn.execute(
                text(
                    "SELECT session_id, embedding_model, max(vector_dims(embedding)),"
                    " count(*) FROM chunks WHERE embedding IS NOT NULL AND status = 'active'"
                    " GROUP BY session_id, embedding_model"
                )
            )
        ).all()
        for session_pk, model, dim, _ in sessions:
            await ensure_vector_index(conn, session_pk, model, int(dim), work_mem_mb)
        size = int(
            await conn.scalar(
                text(
                    "SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c"
                    " JOIN pg_am am ON am.oid = c.relam WHERE am.amname = 'hnsw'"
                )
            )
        )
    vectors = sum(int(count) for *_, count in sessions)
    largest = max((int(count) for *_, count in sessions), default=0)
    return (
        f"HNSW: {len(sessions)} session indexes over {vectors} vectors (largest {largest}):"
        f" {kib(size * 1000 / max(vectors, 1))} KiB per 1,000 chunks"
    )


async def session_keys_bytes(
    client: redis.Redis, prefix: str, tenant: uuid.UUID, session: str
) -> tuple[int, dict[str, int]]:
    """Bytes (`MEMORY USAGE`) of every key of one session, and per key kind."""
    total, kinds = 0, dict[str, int]()
    async for key in client.scan_iter(match=f"{prefix}:*{{{tenant}:{session}}}*", count=1000):
        used = int(await client.memory_usage(key) or 0)
        kind = key.decode().removeprefix(prefix + ":").split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + used
        total += used
    return total, kinds


async def redis_per_session(
    client: redis.Redis, prefix: str, tenant: uuid.UUID, sessions: list[str]
) -> str:
    """Median and largest bytes of one session's keys, and the median per key kind."""
    per_session = []
    kinds: dict[str, list[int]] = {}
    for sid in sessions:
        total, by_kind = await session_keys_bytes(client, prefix, tenant, sid)
        per_session.append(total)
        for kind, used in by_kind.items():
            kinds.setdefault(kind, []).append(used)
    return (
        f"median {statistics.median(per_session):,.0f} B, max {max(per_session):,} B ("
        + ", ".join(f"{k} {statistics.median(v):,.0f}" for k, v in sorted(kinds.items()))
        + ")"
    )


async def used_memory(client: redis.Redis) -> int:
    return int((await client.info("memory"))["used_memory"])


async def ingest_locomo(fleet: Fleet, path: str, limit: int) -> tuple[list[str], int, list[str]]:
    """The first `limit` LoCoMo conversations, each into a session of its own; (sessions,
    tokens, contents)."""
    conversations = load_locomo(path, limit)
    sessions = [f"locomo-{conv.sample_id}" for conv in conversations]
    contents: list[str] = []

    async def one(sid: str, conv: Any) -> None:
        resp = await fleet.call("PUT", f"/v1/sessions/{sid}", LOCOMO_WINDOW)
        assert resp.status_code == 200, resp.text
        turns = list(conv.turns)
        for start in range(0, len(turns), LOCOMO_TURNS_PER_APPEND):
            batch = [
                {
                    "role": "user" if t.speaker == conv.speaker_a else "assistant",
                    "content": t.content,
                }
                for t in turns[start : start + LOCOMO_TURNS_PER_APPEND]
            ]
            contents.extend(t["content"] for t in batch)
            await fleet.append(sid, batch)

    await asyncio.gather(*(one(s, c) for s, c in zip(sessions, conversations, strict=True)))
    return sessions, sum(count_tokens(c) for c in contents), contents


async def ingest_agents(fleet: Fleet, count: int, turns: int) -> tuple[list[str], int]:
    sessions = [f"agent-{n}" for n in range(count)]
    tokens = 0

    async def one(n: int, sid: str) -> None:
        nonlocal tokens
        resp = await fleet.call("PUT", f"/v1/sessions/{sid}", SMALL_WINDOW)
        assert resp.status_code == 200, resp.text
        progress: dict[int, int] = {}
        await fleet.run_client(n, sid, turns, 0, progress)
        tokens += sum(count_tokens(client_turn(n, i)["content"]) for i in range(turns))

    await asyncio.gather(*(one(n, s) for n, s in enumerate(sessions)))
    return sessions, tokens


async def drained(engine: AsyncEngine, tenant: uuid.UUID) -> None:
    await wait_for(
        lambda: queue_settled(engine, tenant, True),
        lambda state: state == (0, 0, 0),
        timeout=1800,
        interval=0.5,
        what="every offload, notes refresh and vector",
    )


async def main(args: argparse.Namespace) -> None:
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start()
        try:
            settings, engine, tenant, api_key = await provisioned(stack, "capacity")
            cache = redis.Redis.from_url(stack.redis_url)
            prefix = f"{settings.cache.key_prefix}:v1"
            env = process_env(settings, CONTEXTD_EMBEDDING__KIND="e5")
            async with deployment(env, Path(tmp), engine, 1, 1) as running:
                fleet = Fleet([api.url for api in running.apis], api_key)
                try:
                    empty = await snapshot(engine)
                    locomo, locomo_tokens, _ = await ingest_locomo(
                        fleet, args.locomo, args.conversations
                    )
                    await drained(engine, tenant)
                    after_locomo = await snapshot(engine)
                    agents, agent_tokens = await ingest_agents(
                        fleet, args.agent_sessions, args.agent_turns
                    )
                    await drained(engine, tenant)
                    after_agents = await snapshot(engine)
                    sets = [
                        ("LoCoMo", empty, after_locomo, locomo, locomo_tokens),
                        ("bilingual agent turns", after_locomo, after_agents, agents, agent_tokens),
                    ]
                    for name, before, after, sessions, tokens in sets:
                        turns = after.rows["turns"] - before.rows["turns"]
                        print(
                            f"\n### {name}: {len(sessions)} sessions, {turns} turns,"
                            f" {tokens / turns:.1f} tokens a turn (cl100k)\n"
                        )
                        print(per_kturn_table(before, after, turns))
                        print(chunk_lines(before, after))
                    print("\n" + await hnsw_per_kchunk(engine, 256))

                    # Every session active: two builds each, as an agent's next two model calls.
                    memory_before = await used_memory(cache)
                    everyone = locomo + agents
                    for n in range(2):
                        await asyncio.gather(
                            *(
                                fleet.build(c, sid, f"What did we decide about order {n}-{c}?")
                                for c, sid in enumerate(everyone)
                            )
                        )
                    memory_after = await used_memory(cache)
                    measured = [await redis_per_session(cache, prefix, tenant, everyone)]
                    # A client (or the inspector) reading each session's view caches it too.
                    for sid in everyone:
                        assert (await fleet.call("GET", f"/v1/sessions/{sid}")).status_code == 200
                    measured.append(await redis_per_session(cache, prefix, tenant, everyone))
                finally:
                    await fleet.aclose()
            qemb = [0]
            async for key in cache.scan_iter(match=f"{prefix}:qemb:*", count=1000):
                qemb.append(int(await cache.memory_usage(key) or 0))
            print(
                f"\nRedis, {len(everyone)} active sessions, MEMORY USAGE of the keys tagged with"
                f" the session: after two builds each {measured[0]}; after a view read too"
                f" {measured[1]}. Query vectors: {len(qemb) - 1} keys,"
                f" {statistics.mean(qemb[1:] or [0]):,.0f} B each. INFO used_memory delta over the"
                f" builds: {(memory_after - memory_before) / len(everyone):,.0f} B per session"
            )
            print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            await cache.aclose()
            await engine.dispose()
        finally:
            stack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", required=True, help="LoCoMo JSON (locomo_dev.json)")
    parser.add_argument("--conversations", type=int, default=10, help="LoCoMo conversations")
    parser.add_argument("--agent-sessions", type=int, default=50)
    parser.add_argument("--agent-turns", type=int, default=40, help="turns of each agent session")
    asyncio.run(main(parser.parse_args()))
