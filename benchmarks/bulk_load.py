"""Bulk loads as a restore does them: the rows first, the indexes and constraints after.

`deferred_indexes(conn, tables)` drops every index of `tables` and every primary-key, unique and
foreign-key constraint on them or pointing at them, yields, and recreates them from the
definitions the catalog gave (`pg_get_indexdef`, `pg_get_constraintdef`), in pg_dump's order:
indexes, then keys, then foreign keys. The result is the schema the migrations left, whatever
they hold (a migration that changes a key needs no change here); building each index once over
all the rows is far cheaper than adding millions of random keys to it one by one.
`relation_sizes(conn, tables)` reports what the tables and their indexes take on disk.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

_CONSTRAINTS = """
SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)
FROM pg_constraint c
WHERE c.contype IN ('p', 'u', 'f')
  AND (c.conrelid = ANY(%(tables)s::regclass[]) OR c.confrelid = ANY(%(tables)s::regclass[]))
ORDER BY c.contype = 'f' DESC, c.conname
"""

# Indexes of their own (not those behind a key, which the constraints bring back).
_INDEXES = """
SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
FROM pg_index i
WHERE i.indrelid = ANY(%(tables)s::regclass[])
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
ORDER BY 1
"""


@contextmanager
def deferred_indexes(conn: psycopg.Connection, tables: list[str]) -> Iterator[dict[str, float]]:
    """Without the indexes and keys of `tables` inside the block; rebuilt when it ends. Run it
    inside a transaction: nobody sees the tables without them. Yields the seconds the rebuild
    took (`indexes_s`, `keys_s`), filled in when the block ends."""
    constraints = conn.execute(_CONSTRAINTS, {"tables": tables}).fetchall()
    indexes = conn.execute(_INDEXES, {"tables": tables}).fetchall()
    for table, name, _, _ in constraints:  # foreign keys first: the keys they need go after
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                sql.SQL(table), sql.Identifier(name)
            )
        )
    for name, _ in indexes:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.SQL(name)))
    timings: dict[str, float] = {}
    yield timings
    started = time.monotonic()
    for _, definition in indexes:
        conn.execute(definition)
    timings["indexes_s"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    for table, name, _, definition in reversed(constraints):  # keys, then foreign keys
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                sql.SQL(table), sql.Identifier(name), sql.SQL(definition)
            )
        )
    timings["keys_s"] = round(time.monotonic() - started, 1)


def relation_sizes(conn: psycopg.Connection, tables: list[str]) -> list[tuple[str, int, int]]:
    """(table or index, rows (estimated; 0 for an index), bytes on disk) of `tables` (with
    TOAST) and each of their indexes, largest first per table."""
    rows: list[tuple[str, int, int]] = []
    for table in tables:
        row = conn.execute(
            "SELECT reltuples::bigint, pg_table_size(oid) FROM pg_class WHERE oid = %s::regclass",
            (table,),
        ).fetchone()
        assert row is not None
        rows.append((table, int(row[0]), int(row[1])))
        rows += [
            (str(name), 0, int(size))
            for name, size in conn.execute(
                "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
                "WHERE indrelid = %s::regclass ORDER BY 2 DESC",
                (table,),
            ).fetchall()
        ]
    return rows
