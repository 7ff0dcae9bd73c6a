"""Recall's exact-hits arm: which chunks it returns (IDs, quoted strings, English and Chinese,
a needle whose term every chunk holds, a needle without terms), and that its statement is
served by the index of the chunks' terms with their session whatever the statistics know of
the session (on a real PostgreSQL)."""

import re
import uuid
from typing import Any

import pytest
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import create_reader_pool, driver_connection
from app.domain.callers import Caller
from app.domain.text import lexical_document
from app.store import chunks as chunks_store
from tests.offload.test_offload_service import session_pk
from tests.support.factories import configure, new_caller, transaction

TEXTS = [
    "the order AB-12345 ships on Friday, amount 40 EUR",
    "预算不超过一百二十欧元，订单号 XY-987, amount 120",
    "keep the AB-123456 receipt, amount 7",  # the ID inside a longer one
    'she wrote "meet me at the north gate" and the amount',
    *(f"note {i}: the amount of the bill was paid" for i in range(4, 12)),
]


async def add_chunks(
    engine: AsyncEngine,
    settings: Settings,
    cache: Cache,
    caller: Caller,
    sid: str,
    texts: list[str],
) -> tuple[uuid.UUID, list[str]]:
    """A session of `caller` whose chunks hold `texts`, one turn each in order, their terms as
    the offload writes them; its id and the chunks' ids."""
    await configure(engine, caller, settings, cache, sid)
    pk = await session_pk(engine, caller.tenant_id, sid)
    ids = [str(uuid.uuid4()) for _ in texts]
    rows = [
        {"id": cid, "tenant": caller.tenant_id, "session": pk, "turn": i + 1, "text": t,
         "lexical": lexical_document(t)}
        for i, (cid, t) in enumerate(zip(ids, texts, strict=True))
    ]  # fmt: skip
    async with transaction(engine) as db:
        await db.execute(
            text(
                "INSERT INTO chunks (id, tenant_id, session_id, turn_first, turn_last, part, "
                "parts, roles, ts_first, ts_last, raw_text, token_count, term_counts, term_total, "
                "lexical) VALUES (CAST(:id AS uuid), :tenant, :session, :turn, :turn, 0, 1, "
                "'{user}', now(), now(), :text, 3, '{}', 0, to_tsvector('simple', :lexical))"
            ),
            rows,
        )
    return pk, ids


async def test_the_exact_arm_finds_ids_and_quoted_strings_verbatim_in_its_session_only(
    engine: AsyncEngine, settings: Settings, cache: Cache
) -> None:
    caller = await new_caller(engine)
    texts = [*TEXTS, "AB-12345, amount"]
    pk, ids = await add_chunks(engine, settings, cache, caller, "exact", texts)
    # the same texts in another session of the tenant and in another tenant's
    await add_chunks(engine, settings, cache, caller, "other", TEXTS)
    await add_chunks(engine, settings, cache, await new_caller(engine), "exact", TEXTS)
    async with transaction(engine) as db:
        await chunks_store.tombstone_chunks(db, caller.tenant_id, [uuid.UUID(ids.pop())])
    notes = ids[4:]

    async with engine.connect() as conn:
        driver = await driver_connection(conn)

        async def hits(needles: list[str], limit: int = 100) -> list[str]:
            return await chunks_store.exact_hits(driver, caller.tenant_id, pk, needles, limit)

        assert await hits(["ab-12345"]) == [ids[0]]  # not AB-123456, nor the tombstoned one
        assert await hits(["一百二十欧元"]) == [ids[1]]
        assert await hits(["meet me at the north gate"]) == [ids[3]]
        assert await hits(["North Gate", "xy-987"]) == [ids[3], ids[1]]  # newest first
        assert await hits(["AB-99999"]) == []
        assert await hits(["%12345%"]) == []  # LIKE's wildcards are matched as themselves
        # A term every chunk holds: every chunk of the session, the newest first.
        assert await hits(["amount"]) == ids[::-1]
        assert await hits(["amount"], limit=3) == ids[:-4:-1]
        # A needle of stopwords only has no terms: the session's chunks are checked one by one.
        assert await hits(["of the"]) == notes[::-1]
        assert await hits(["of the"], limit=2) == notes[:-3:-1]


async def reader_plan(reader: Any, statement: str, params: dict[str, Any]) -> str:
    """The plan of `statement` (psycopg placeholders) on a connection of the reader pool: prepared,
    planned with the pool's settings (`app.core.db.READER_PLANS`)."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    prepared = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    await reader.execute(f"PREPARE arm AS {prepared}")
    values = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
    cursor = await reader.execute(sql.SQL("EXPLAIN EXECUTE arm ({})").format(values))
    plan = "\n".join(row[0] for row in await cursor.fetchall())
    await reader.execute("DEALLOCATE arm")
    return plan


@pytest.mark.parametrize("session_in_statistics", [True, False])
async def test_the_exact_arm_searches_one_index_whatever_the_statistics_know(
    engine: AsyncEngine, settings: Settings, cache: Cache, session_in_statistics: bool
) -> None:
    # A large session and a larger one; with a statistics target of 1 the most-common values
    # hold only the larger one, and the planner takes the large session for an average one:
    # the state in which it once read every chunk of the session through its B-tree.
    caller = await new_caller(engine)
    big, _ = await add_chunks(
        engine, settings, cache, caller, "big", [f"note {i} amount AB-{i:05d}" for i in range(300)]
    )
    bigger = [f"entry {i} amount" for i in range(600)]
    await add_chunks(engine, settings, cache, caller, "bigger", bigger)
    for s in range(40):
        await add_chunks(engine, settings, cache, caller, f"small-{s}", ["a note", "amount"])
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        if not session_in_statistics:
            await conn.execute(text("ALTER TABLE chunks ALTER COLUMN session_id SET STATISTICS 1"))
        await conn.execute(text("ANALYZE chunks"))
        driver = await driver_connection(conn)
        known = await driver.execute(
            "SELECT CAST(%s AS text) = ANY(CAST(CAST(most_common_vals AS text) AS text[])) "
            "FROM pg_stats WHERE tablename = 'chunks' AND attname = 'session_id'",
            (str(big),),
        )
        assert await known.fetchone() == (session_in_statistics,)
    pool = create_reader_pool(settings)
    try:
        async with pool.connection() as reader:
            # A table this small is cheaper to scan, and to search without parallel workers,
            # than a service's is.
            for setting in [
                "enable_seqscan = off",
                "parallel_setup_cost = 0",
                "parallel_tuple_cost = 0",
                "min_parallel_table_scan_size = 0",
            ]:
                await reader.execute(f"SET {setting}")  # fmt: skip
            statement = chunks_store._exact_statement(1, by_terms=True)
            for needle in ["AB-00042", "amount"]:
                params = {
                    "tenant": caller.tenant_id,
                    "limit": 30,
                    "n0": f"%{needle}%",
                    "t0": lexical_document(needle),
                    "session_lexeme": chunks_store.session_lexeme(big),
                }
                plan = await reader_plan(reader, statement, params)
                assert "Bitmap Index Scan on ix_chunks_session_lexical" in plan, plan
                assert "ix_chunks_session_range" not in plan, plan
                assert "Gather" not in plan, plan
                assert await chunks_store.exact_hits(reader, caller.tenant_id, big, [needle], 30)
    finally:
        await pool.dispose()
