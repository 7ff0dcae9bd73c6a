"""The benchmarks' bulk loader (`benchmarks.bulk_load`, `recall_scale.add_sessions`): sessions
generated in the server hold the rows the benchmarks describe, and the indexes and keys dropped
around the load come back as the migrations wrote them."""

import random
import uuid
from typing import Any

import psycopg

from app.core.config import Settings
from benchmarks.bulk_load import deferred_indexes, relation_sizes
from benchmarks.recall_scale import DIM, MODEL, add_sessions, text_pool

OWN_DATABASE = True
TABLES = ["sessions", "chunks", "turns"]


def schema(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    """Every index of the tables and every key on them or pointing at them, as the catalog
    spells them."""
    indexes = conn.execute(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
        "WHERE indrelid = ANY(%s::regclass[]) ORDER BY 1",
        (TABLES,),
    ).fetchall()
    keys = conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated "
        "FROM pg_constraint WHERE contype IN ('p', 'u', 'f') "
        "AND (conrelid = ANY(%(t)s::regclass[]) OR confrelid = ANY(%(t)s::regclass[])) "
        "ORDER BY 1, 2",
        {"t": TABLES},
    ).fetchall()
    return indexes + keys


def test_sessions_loaded_around_deferred_indexes_leave_the_schema_as_migrated(
    settings: Settings,
) -> None:
    with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
        migrated = schema(conn)
        tenant = uuid.uuid4()
        conn.execute("INSERT INTO tenants (id, name) VALUES (%s, %s)", (tenant, "bulk"))
        with conn.transaction(), deferred_indexes(conn, TABLES) as rebuilt:
            assert schema(conn) == []
            add_sessions(conn, random.Random(1), text_pool(1), tenant, "bulk-", 1, 30)
        assert schema(conn) == migrated
        assert set(rebuilt) == {"indexes_s", "keys_s"}

        sessions = conn.execute(
            "SELECT external_id, chunk_count, turn_count, last_seq, offloaded_until_seq, c1_turns, "
            "c1_tokens, "
            "(SELECT count(*) FROM chunks c WHERE c.session_id = s.id), "
            "(SELECT count(*) FROM turns t WHERE t.session_id = s.id) "
            "FROM sessions s WHERE tenant_id = %s ORDER BY external_id",
            (tenant,),
        ).fetchall()
        assert len(sessions) == 30
        assert sessions[0] == ("bulk-1", 5, 10, 30, 20, 10, 350, 5, 10)
        assert {s[1:] for s in sessions} == {(5, 10, 30, 20, 10, 350, 5, 10)}

        chunk = conn.execute(
            "SELECT array_agg(turn_first ORDER BY turn_first), count(DISTINCT raw_text), "
            "bool_and(length(lexical) > 0), min(vector_dims(embedding)), "
            "bool_and(embedding_model = %s), bool_and(status = 'active') "
            "FROM chunks c JOIN sessions s ON s.id = c.session_id WHERE s.external_id = 'bulk-7'",
            (MODEL,),
        ).fetchone()
        assert chunk == ([1, 5, 9, 13, 17], 5, True, DIM, True, True)
        window = conn.execute(
            "SELECT array_agg(seq ORDER BY seq), array_agg(role ORDER BY seq) FROM turns t "
            "JOIN sessions s ON s.id = t.session_id WHERE s.external_id = 'bulk-7'"
        ).fetchone()
        assert window == (list(range(21, 31)), ["user", "assistant"] * 5)
        # A chunk's words are found through the rebuilt full-text index.
        word = conn.execute(
            "SELECT split_part(raw_text, ' ', 3) FROM chunks WHERE tenant_id = %s LIMIT 1",
            (tenant,),
        ).fetchone()
        assert word is not None
        found = conn.execute(
            "SELECT count(*) FROM chunks WHERE lexical @@ to_tsquery('simple', %s)",
            (word[0].strip(";:,."),),
        ).fetchone()
        assert found is not None and found[0] >= 1
        sizes = {name: size for name, _, size in relation_sizes(conn, TABLES)}
        assert {"sessions", "chunks", "turns", "ix_chunks_session_lexical"} <= set(sizes)
        assert all(size > 0 for size in sizes.values())
