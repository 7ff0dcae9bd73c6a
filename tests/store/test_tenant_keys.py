"""The schema is ready to be distributed by tenant (Citus), checked from the two places it lives:

- the migrations: an empty database upgraded to head, read from pg_catalog. Every table but the
  global ones (`app.store.models.GLOBAL_TABLES`) has a NOT NULL `tenant_id`, its primary key and
  every unique index include it, and every foreign key into a tenant-scoped table pairs
  `tenant_id` with `tenant_id` (a global table has none into one);
- the store's queries: the source of `app/store/*.py`, its SQLAlchemy expressions and its SQL
  text. Every join between rows of tenant-scoped tables (`JOIN ... ON`, a correlated subquery,
  a join in WHERE, a table joined to itself or to a subquery or CTE of it) matches `tenant_id`
  on both sides too. A subquery that is not correlated (`IN (SELECT ...)`) is no join: Citus
  runs it on its own and passes the result on; a join whose condition SQLAlchemy takes from a
  foreign key has the tenant by the first rule.

Each check names what breaks it, and each is fed a schema or a query that breaks it."""

import ast
import importlib
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import TableClause, TextClause

from app.core.migrate import upgrade
from app.runtime.embedded import EmbeddedStack
from app.store.models import GLOBAL_TABLES, Base
from tests.support.databases import database_url

STORE = Path(__file__).resolve().parents[2] / "app" / "store"
TENANT = "tenant_id"

# --- the schema ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """A primary key or a unique index."""

    table: str
    name: str
    columns: tuple[str, ...]
    primary: bool


@dataclass(frozen=True)
class Reference:
    """A foreign key: `columns` of `table` point at `target_columns` of `target`, in pairs."""

    table: str
    name: str
    columns: tuple[str, ...]
    target: str
    target_columns: tuple[str, ...]


@dataclass(frozen=True)
class Schema:
    columns: dict[str, dict[str, bool]]  # table -> column -> nullable
    keys: tuple[Key, ...]
    references: tuple[Reference, ...]


_COLUMNS = """
SELECT c.relname, a.attname, NOT a.attnotnull
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
"""
# Unique indexes (primary keys among them), their key columns in order (not INCLUDE ones).
_KEYS = """
SELECT t.relname, i.relname, x.indisprimary,
       ARRAY(SELECT coalesce(a.attname, '(expression)')
             FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, place)
             LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             WHERE k.place <= x.indnkeyatts ORDER BY k.place)
FROM pg_index x
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = current_schema() AND x.indisunique
"""
_REFERENCES = """
SELECT t.relname, c.conname, f.relname,
       ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, place)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
             ORDER BY k.place),
       ARRAY(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY AS k(attnum, place)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
             ORDER BY k.place)
FROM pg_constraint c
JOIN pg_class t ON t.oid = c.conrelid
JOIN pg_class f ON f.oid = c.confrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = current_schema() AND c.contype = 'f'
"""


def read_schema(conn: psycopg.Connection) -> Schema:
    columns: dict[str, dict[str, bool]] = {}
    for table, column, nullable in conn.execute(_COLUMNS):
        columns.setdefault(table, {})[column] = nullable
    keys = tuple(
        Key(table, name, tuple(cols), primary) for table, name, primary, cols in conn.execute(_KEYS)
    )
    references = tuple(
        Reference(table, name, tuple(cols), target, tuple(target_cols))
        for table, name, target, cols, target_cols in conn.execute(_REFERENCES)
    )
    return Schema(columns, keys, references)


def schema_breaches(schema: Schema, global_tables: Mapping[str, str]) -> list[str]:
    """What keeps the schema from being distributed by `tenant_id`, one line each."""
    scoped = {table for table in schema.columns if table not in global_tables}
    missing = [table for table in global_tables if table not in schema.columns]
    found = [f"{table}: listed as global, no such table" for table in missing]
    for table in sorted(scoped):
        nullable = schema.columns[table].get(TENANT)
        if nullable is None:
            found.append(f"{table}: no {TENANT} column")
        elif nullable:
            found.append(f"{table}.{TENANT}: nullable")
        if not any(key.primary for key in schema.keys if key.table == table):
            found.append(f"{table}: no primary key")
    for key in schema.keys:
        if key.table in scoped and TENANT not in key.columns:
            kind = "primary key" if key.primary else "unique index"
            columns = ", ".join(key.columns)
            found.append(f"{key.table}: {kind} {key.name} ({columns}) lacks {TENANT}")
    for ref in schema.references:
        if ref.target not in scoped:
            continue  # into a global table: a reference table on Citus, any node has it
        if ref.table not in scoped:
            found.append(
                f"{ref.table}: foreign key {ref.name} from a global table into tenant-scoped"
                f" {ref.target}"
            )
        elif (TENANT, TENANT) not in zip(ref.columns, ref.target_columns, strict=True):
            found.append(
                f"{ref.table}: foreign key {ref.name} ({', '.join(ref.columns)}) -> {ref.target}"
                f" ({', '.join(ref.target_columns)}) does not pair {TENANT} with {TENANT}"
            )
    return sorted(found)


@pytest.fixture(scope="module")
def head_database(stack: EmbeddedStack) -> Iterator[str]:
    """An empty database upgraded to head by the migrations (not a copy of the suite's)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = database_url(stack.database_url, name)
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(stack.database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_the_migrated_schema_keys_every_tenant_scoped_table_by_tenant(head_database: str) -> None:
    with psycopg.connect(head_database) as conn:
        schema = read_schema(conn)
    assert schema_breaches(schema, GLOBAL_TABLES) == []
    # The model's tables are the tenant-scoped ones and two of the global ones.
    scoped = set(schema.columns) - set(GLOBAL_TABLES)
    assert scoped == set(Base.metadata.tables) - {"tenants", "api_keys"}
    assert scoped >= {"sessions", "turns", "chunks", "memories", "memory_versions"}


def test_a_schema_that_breaks_the_rules_is_named_table_by_table(head_database: str) -> None:
    with psycopg.connect(head_database) as conn:  # rolled back on leaving: DDL is transactional
        conn.execute(
            """
            CREATE TABLE stray (id uuid PRIMARY KEY, tenant_id uuid, label text UNIQUE);
            CREATE TABLE stray_child (
                stray_id uuid REFERENCES stray (id),
                tenant_id uuid NOT NULL REFERENCES tenants (id),
                PRIMARY KEY (stray_id, tenant_id));
            CREATE TABLE stray_note (id bigint PRIMARY KEY);
            ALTER TABLE api_keys ADD COLUMN session_id uuid,
                ADD FOREIGN KEY (session_id, tenant_id) REFERENCES sessions (id, tenant_id);
            """
        )
        found = schema_breaches(read_schema(conn), {**GLOBAL_TABLES, "gone": "dropped"})
        conn.rollback()
    assert found == sorted(
        [
            "gone: listed as global, no such table",
            "stray.tenant_id: nullable",
            "stray: primary key stray_pkey (id) lacks tenant_id",
            "stray: unique index stray_label_key (label) lacks tenant_id",
            "stray_child: foreign key stray_child_stray_id_fkey (stray_id) -> stray (id)"
            " does not pair tenant_id with tenant_id",
            "stray_note: no tenant_id column",
            "stray_note: primary key stray_note_pkey (id) lacks tenant_id",
            "api_keys: foreign key api_keys_session_id_tenant_id_fkey from a global table into"
            " tenant-scoped sessions",
        ]
    )


# --- the queries ---------------------------------------------------------------------------------

# The tables of the model that are tenant-scoped (every table of the database but the global ones).
SCOPED = frozenset(Base.metadata.tables) - frozenset(GLOBAL_TABLES)

_SQL_KEYWORDS = frozenset(
    "where on set left right inner outer full cross join order group limit using and or"
    " returning union values select from having window offset for lateral".split()
)
_TABLE_REF = re.compile(
    r"\b(?:FROM|JOIN|UPDATE)\s+(\w+)\b(?!\s*\()"  # a table (or CTE), not a function's rows
    rf"(?:\s+(?:AS\s+)?(?!(?:{'|'.join(_SQL_KEYWORDS)})\b)(\w+)\b)?",  # and its alias
    re.I,
)
_CTE = re.compile(
    r"\b(\w+)\s+AS\s+(?:MATERIALIZED\s+)?\(\s*(?:SELECT|INSERT|UPDATE|DELETE)\b", re.I
)
_CTE_SOURCE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+(\w+)\b(?!\s*\()", re.I)
_EQUALITY = re.compile(r"\b(\w+)\.(\w+)\s*=\s*(\w+)\.(\w+)\b")


def scoped_tables(statement: str) -> dict[str, str]:
    """For one SQL text, each alias (a table, a CTE of one, a subquery's alias) that stands for
    a tenant-scoped table, with that table."""
    ctes = {}
    for match in _CTE.finditer(statement):
        source = _CTE_SOURCE.search(statement, match.end())
        if source is not None:
            ctes[match.group(1)] = source.group(1)
    aliases: dict[str, str] = {}
    for match in _TABLE_REF.finditer(statement):
        table, alias = match.group(1), match.group(2)
        aliases[table] = table
        if alias:
            aliases[alias] = table
    scoped = {}
    for alias, name in aliases.items():
        for _ in range(len(ctes) + 1):
            if name not in ctes:
                break
            name = ctes[name]
        if name in SCOPED:
            scoped[alias] = name
    return scoped


def _sql_breaches(statement: str) -> list[str]:
    """Joins between rows of tenant-scoped tables in one SQL text that do not match the tenant:
    each `a.x = b.y` of two aliases (a table, a CTE of one, a subquery's alias) of such tables
    needs `a.tenant_id = b.tenant_id` beside it."""
    table_of = scoped_tables(statement).get
    joined: dict[frozenset[str], str] = {}
    matched: set[frozenset[str]] = set()
    for left, left_column, right, right_column in _EQUALITY.findall(statement):
        pair = frozenset((left, right))
        if left == right or table_of(left) is None or table_of(right) is None:
            continue
        joined.setdefault(pair, f"{left}.{left_column} = {right}.{right_column}")
        if left_column == right_column == TENANT:
            matched.add(pair)
    return [f"joins on {on} without {TENANT}" for pair, on in joined.items() if pair not in matched]


def _render(node: ast.expr, names: Mapping[str, str]) -> str | None:
    """The text of a string expression of the source (literals, f-strings, `+`, and names of
    module strings), `?` for any other part; None when it is no string expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value
            if isinstance(part, ast.Constant)
            else (_render(part.value, names) or "?")
            if isinstance(part, ast.FormattedValue)
            else "?"
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _render(node.left, names), _render(node.right, names)
        if left is None and right is None:
            return None
        return (left or "?") + (right or "?")
    return None


def _sql_texts(unit: ast.AST, names: Mapping[str, str]) -> list[str]:
    """Every outermost string expression of `unit`, rendered."""
    texts: list[str] = []
    covered: set[int] = set()
    for node in ast.walk(unit):
        if id(node) in covered or not isinstance(node, ast.JoinedStr | ast.BinOp | ast.Constant):
            continue
        rendered = _render(node, names)
        if rendered is None:
            continue
        covered.update(id(child) for child in ast.walk(node))
        texts.append(rendered)
    return texts


def _expression_breaches(unit: ast.AST, tables: Mapping[str, str]) -> list[str]:
    """Joins between rows of tenant-scoped tables in SQLAlchemy expressions of one function (or
    module statement): each `A.x == B.y` of two sources (mapped classes, and names bound in the
    function to a statement, subquery or alias of one: `sub.c.x`) of such tables needs
    `A.tenant_id == B.tenant_id` in the same function."""
    bound: dict[str, str] = {}
    assignments = [n for n in ast.walk(unit) if isinstance(n, ast.Assign)]
    for assignment in sorted(assignments, key=lambda n: n.lineno):
        for node in ast.walk(assignment.value):
            if isinstance(node, ast.Name) and (node.id in tables or node.id in bound):
                table = tables.get(node.id) or bound[node.id]
                for target in assignment.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = table
                break

    def source_of(node: ast.expr) -> tuple[str, str, str] | None:
        """(source, its table, column) of a column expression."""
        if not isinstance(node, ast.Attribute):
            return None
        owner = node.value
        if isinstance(owner, ast.Attribute) and owner.attr == "c":
            owner = owner.value
        if not isinstance(owner, ast.Name):
            return None
        table = tables.get(owner.id) or bound.get(owner.id)
        return None if table is None else (owner.id, table, node.attr)

    joined: dict[frozenset[str], str] = {}
    matched: set[frozenset[str]] = set()
    for node in ast.walk(unit):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
            continue
        if not isinstance(node.ops[0], ast.Eq):
            continue
        left, right = source_of(node.left), source_of(node.comparators[0])
        if left is None or right is None or left[0] == right[0]:
            continue
        if left[1] not in SCOPED or right[1] not in SCOPED:
            continue
        pair = frozenset((left[0], right[0]))
        joined.setdefault(pair, f"{left[0]}.{left[2]} == {right[0]}.{right[2]}")
        if left[2] == right[2] == TENANT:
            matched.add(pair)
    return [f"joins on {on} without {TENANT}" for pair, on in joined.items() if pair not in matched]


def query_breaches(
    source: str, module: str, tables: Mapping[str, str], names: Mapping[str, str]
) -> list[str]:
    """Joins of the module's queries that do not match the tenant, named by function.
    `tables`: the module's names of mapped classes and tables, with their table names;
    `names`: its module-level SQL strings (so a statement built from them reads whole)."""
    found = []
    for unit in ast.parse(dedent(source)).body:
        where = f"{module}.{getattr(unit, 'name', f'line {unit.lineno}')}"
        breaches = _expression_breaches(unit, tables)
        breaches += [b for text in _sql_texts(unit, names) for b in _sql_breaches(text)]
        found += [f"{where}: {breach}" for breach in breaches]
    return found


def _module_names(module: object) -> tuple[dict[str, str], dict[str, str]]:
    """The module's mapped classes and tables by name, and its module-level SQL strings."""
    tables: dict[str, str] = {}
    names: dict[str, str] = {}
    for name, value in vars(module).items():
        if isinstance(value, type) and hasattr(value, "__table__"):
            tables[name] = value.__table__.name
        elif isinstance(value, TableClause):
            tables[name] = value.name
        elif isinstance(value, TextClause):
            names[name] = value.text
        elif isinstance(value, str):
            names[name] = value
    return tables, names


def test_no_query_of_the_store_joins_rows_of_two_tenants() -> None:
    found = []
    modules = sorted(STORE.glob("*.py"))
    assert len(modules) >= 12
    for path in modules:
        module = importlib.import_module(f"app.store.{path.stem}")
        tables, names = _module_names(module)
        found += query_breaches(path.read_text(), path.stem, tables, names)
    assert found == []


_MODELS = importlib.import_module("app.store.models")
_TABLES, _ = _module_names(_MODELS)
_TABLES["JOBS"] = "procrastinate_jobs"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (  # a join on the session alone
            """
            async def window(db):
                return select(Turn).join(Session, Turn.session_id == Session.id)
            """,
            ["m.window: joins on Turn.session_id == Session.id without tenant_id"],
        ),
        (
            """
            async def window(db):
                same = (Turn.session_id == Session.id) & (Turn.tenant_id == Session.tenant_id)
                return select(Turn).join(Session, same)
            """,
            [],
        ),
        (  # a table joined to a subquery of itself
            """
            async def newest(db, pk):
                newest = select(OffloadEvent).where(OffloadEvent.session_id == pk).subquery()
                return select(OffloadEvent).join(newest, OffloadEvent.id == newest.c.id)
            """,
            ["m.newest: joins on OffloadEvent.id == newest.id without tenant_id"],
        ),
        (  # the global tables join as they like; a filter on one table is no join
            """
            def key(db, h):
                q = select(ApiKey, Tenant).join(Tenant, Tenant.id == ApiKey.tenant_id)
                return q.where(ApiKey.key_hash == h, Session.id == Session.id)
            """,
            [],
        ),
        (  # a correlated subquery in SQL text
            """
            WINDOW = (
                "SELECT s.id, (SELECT count(*) FROM turns t WHERE t.session_id = s.id) "
                "FROM sessions s WHERE s.tenant_id = %(tenant)s"
            )
            """,
            ["m.line 2: joins on t.session_id = s.id without tenant_id"],
        ),
        (  # a CTE of chunks joined back to chunks, its text built from a module string
            """
            def shown(session):
                return NEAR + f"SELECT c.id FROM chunks c JOIN near n ON n.id = c.id {session}"
            """,
            ["m.shown: joins on n.id = c.id without tenant_id"],
        ),
        (
            """
            SHOWN = NEAR + (
                "SELECT c.id FROM chunks c JOIN near n ON n.id = c.id"
                " AND c.tenant_id = n.tenant_id"
            )
            """,
            [],
        ),
        (  # an alias right after a table without one
            """
            SHOWN = NEAR + "SELECT c.id FROM near JOIN chunks c ON c.id = near.id"
            """,
            ["m.line 2: joins on c.id = near.id without tenant_id"],
        ),
        (  # the job queue's tables are global; a function's rows are no table
            """
            QUEUE = "SELECT 1 FROM procrastinate_jobs j JOIN procrastinate_events e ON e.id = j.id"
            ASSIGN = (
                "UPDATE turns SET chunk_id = r.chunk_id FROM unnest(:a) AS r(chunk_id, seq)"
                " WHERE turns.seq = r.seq"
            )
            """,
            [],
        ),
    ],
)
def test_a_query_that_joins_across_tenants_is_named(source: str, expected: list[str]) -> None:
    near = "WITH near AS (SELECT id, tenant_id FROM chunks WHERE session_id = %(s)s) "
    assert query_breaches(source, "m", _TABLES, {"NEAR": near}) == expected
