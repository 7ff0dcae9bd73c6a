"""Every statement of the store that picks rows of a tenant-scoped table by their id, their
session or their remembered item (`id`, `session_id`, `memory_id`), or locks rows of one, also
names the tenant: on Citus a statement that names the distribution column runs on the one node
holding that tenant; one that does not is sent to every node, and a multi-shard `SELECT ... FOR
UPDATE` is not supported at all.

Read from the source of `app/store/*.py` like the join check beside it
(`tests/store/test_tenant_keys.py`): a statement is the SQL text of one string expression, or the
SQLAlchemy expressions of the Python statements of one function that build one query (linked by
the names they assign and read: `query = select(...)`, `query = query.where(...)`). A filter on a
key column needs a filter on `tenant_id` of the same table (of the same alias, in SQL text) in the
same statement; `db.get(Model, ...)` counts as a filter by the key. The statements that read
across tenants by design are allowed by `CROSS_TENANT`, each with its reason."""

import ast
import importlib
import re
from collections.abc import Mapping
from textwrap import dedent

import pytest

from tests.store.test_tenant_keys import (
    _TABLES,
    SCOPED,
    STORE,
    TENANT,
    _module_names,
    _sql_texts,
    scoped_tables,
)

# The columns that pick a tenant-scoped row, or a session's or a remembered item's rows.
KEY_COLUMNS = frozenset({"id", "session_id", "memory_id"})

# Store statements that name rows by key without their tenant, on purpose (`module.function`).
# None locks (no FOR UPDATE): on Citus each is a multi-shard read, which Citus runs on every node.
CROSS_TENANT: dict[str, str] = {
    "vector_index.drop_stale_vector_indexes": (
        "the sweep's index housekeeping: an index's name carries its session's id alone, so which"
        " of them still have a session is asked of every tenant's rows at once"
    ),
    "sessions.tenants_of_sessions": (
        "upgrade path: a job queued by a version before the tenant was a job argument learns it"
        " from its session row, once"
    ),
    "embedding_backlog.tenants_of": (
        "upgrade path: an embedding job queued without its tenant learns it from its rows, once"
    ),
    "receipts.tenant_of_receipt": (
        "upgrade path: an erase job queued without its tenant learns it from its receipt, once"
    ),
}

_KEY_FILTER = re.compile(
    r"(?:\b(\w+)\.)?\b(" + "|".join(sorted(KEY_COLUMNS)) + r")\s*(?:=|\bIN\b)(?!\s*\w+\.\w)",
    re.I,
)
_TENANT_FILTER = re.compile(rf"(?:\b(\w+)\.)?\b{TENANT}\s*=(?!\s*\w+\.\w)", re.I)
_LOCKS = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b", re.I)


def _sql_filter_breaches(statement: str) -> list[str]:
    """Filters by a key column of a tenant-scoped table in one SQL text without a filter on the
    tenant of the same alias (an unqualified column: of an unqualified tenant filter)."""
    scoped_aliases = scoped_tables(statement)
    if not scoped_aliases:
        return []
    tenants = {(m.group(1) or "").lower() for m in _TENANT_FILTER.finditer(statement)}
    found = []
    for match in _KEY_FILTER.finditer(statement):
        alias, column = match.group(1), match.group(2)
        if alias is not None and alias not in scoped_aliases:
            continue
        if (alias or "").lower() not in tenants:
            named = f"{alias}.{column}" if alias else column
            found.append(f"filters {named} without {TENANT}")
    if _LOCKS.search(statement) and not tenants:
        found.append(f"locks rows without {TENANT}")
    return found


def _column(node: ast.expr, sources: Mapping[str, str]) -> tuple[str, str] | None:
    """(table, column) of a column expression of a mapped class or a name bound to one."""
    if not isinstance(node, ast.Attribute):
        return None
    owner = node.value
    if isinstance(owner, ast.Attribute) and owner.attr == "c":
        owner = owner.value
    if not isinstance(owner, ast.Name) or owner.id not in sources:
        return None
    return sources[owner.id], node.attr


def _sources(unit: ast.AST, tables: Mapping[str, str]) -> dict[str, str]:
    """The unit's names of tables: the module's mapped classes, names bound in it to an
    expression of one (`record = Model.__table__`), and names bound to a `Backlog`'s table
    (`table = backlog.table`: chunks or remembered items, both tenant-scoped)."""
    sources = {name: table for name, table in tables.items() if table in SCOPED}
    assignments = [n for n in ast.walk(unit) if isinstance(n, ast.Assign)]
    for assignment in sorted(assignments, key=lambda n: n.lineno):
        value = assignment.value
        table = None
        if isinstance(value, ast.Attribute) and value.attr == "table":
            table = "a backlog's table"
        else:
            for node in ast.walk(value):
                if isinstance(node, ast.Name) and node.id in sources:
                    table = sources[node.id]
                    break
        if table is None:
            continue
        for target in assignment.targets:
            if isinstance(target, ast.Name):
                sources[target.id] = table
    return sources


def _statement_filters(
    statement: ast.stmt, sources: Mapping[str, str]
) -> tuple[set[str], set[str], bool]:
    """(key filters as `table.column`, tables whose tenant is filtered, whether it locks) of the
    SQLAlchemy expressions of one Python statement."""
    keys: set[str] = set()
    tenants: set[str] = set()
    locks = False
    for node in ast.walk(statement):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = _column(node.left, sources), _column(node.comparators[0], sources)
            if left is not None and right is not None:
                continue  # a join: the join check's
            column = left or right
            if column is not None and isinstance(node.ops[0], ast.Eq | ast.In):
                if column[1] == TENANT:
                    tenants.add(column[0])
                elif column[1] in KEY_COLUMNS:
                    keys.add(f"{column[0]}.{column[1]}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in {"in_", "any_"}:
                column = _column(node.func.value, sources)
                if column is not None and column[1] in KEY_COLUMNS:
                    keys.add(f"{column[0]}.{column[1]}")
                elif column is not None and column[1] == TENANT:
                    tenants.add(column[0])
                elif isinstance(node.func.value, ast.Call):  # tuple_(A.tenant_id, ...).in_(...)
                    for arg in node.func.value.args:
                        column = _column(arg, sources)
                        if column is not None and column[1] == TENANT:
                            tenants.add(column[0])
            elif method == "get" and node.args and isinstance(node.args[0], ast.Name):
                table = sources.get(node.args[0].id)
                if table is not None:
                    keys.add(f"{table}.id")
            elif method == "with_for_update":
                locks = True
    return keys, tenants, locks


def _simple_statements(unit: ast.AST) -> list[ast.stmt]:
    compound = (
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.If,
        ast.For,
        ast.AsyncFor,
        ast.While,
        ast.With,
        ast.AsyncWith,
        ast.Try,
    )
    found = [n for n in ast.walk(unit) if isinstance(n, ast.stmt) and not isinstance(n, compound)]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _expression_filter_breaches(unit: ast.AST, tables: Mapping[str, str]) -> list[str]:
    """Key filters without the tenant in the SQLAlchemy queries of one function: its Python
    statements grouped into queries by the names one assigns and a later one reads."""
    sources = _sources(unit, tables)
    statements = _simple_statements(unit)
    group = list(range(len(statements)))

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    assigned_by: dict[str, int] = {}
    for i, statement in enumerate(statements):
        for node in ast.walk(statement):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            if node.id in assigned_by:
                group[root(i)] = root(assigned_by[node.id])
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                assigned_by[node.id] = i
    queries: dict[int, tuple[set[str], set[str], bool]] = {}
    for i, statement in enumerate(statements):
        keys, tenants, locks = _statement_filters(statement, sources)
        query = queries.setdefault(root(i), (set(), set(), False))
        query[0].update(keys)
        query[1].update(tenants)
        queries[root(i)] = (query[0], query[1], query[2] or locks)
    found = []
    for keys, tenants, locks in queries.values():
        found += [
            f"filters {key} without {TENANT}"
            for key in sorted(keys)
            if key.split(".")[0] not in tenants
        ]
        if locks and not tenants:
            found.append(f"locks rows without {TENANT}")
    return found


def filter_breaches(
    source: str, module: str, tables: Mapping[str, str], names: Mapping[str, str]
) -> list[str]:
    """The module's statements that pick tenant-scoped rows by key, or lock them, without the
    tenant, named by function (`tables`, `names`: as for `query_breaches`)."""
    found = []
    for unit in ast.parse(dedent(source)).body:
        where = f"{module}.{getattr(unit, 'name', f'line {unit.lineno}')}"
        breaches = _expression_filter_breaches(unit, tables)
        breaches += [b for text in _sql_texts(unit, names) for b in _sql_filter_breaches(text)]
        found += [f"{where}: {breach}" for breach in breaches]
    return found


def test_every_store_statement_that_picks_rows_by_key_names_the_tenant() -> None:
    found = []
    for path in sorted(STORE.glob("*.py")):
        module = importlib.import_module(f"app.store.{path.stem}")
        tables, names = _module_names(module)
        found += filter_breaches(path.read_text(), path.stem, tables, names)
    allowed = [line for line in found if line.split(":")[0] in CROSS_TENANT]
    assert [line for line in found if line not in allowed] == []
    # Every entry of the allow-list still allows something: none outlives its statement.
    assert {line.split(":")[0] for line in allowed} == set(CROSS_TENANT)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (  # a lock by the session alone: a multi-shard FOR UPDATE on Citus
            """
            async def lock(db, pk):
                return await db.execute(select(Session).where(Session.id == pk).with_for_update())
            """,
            [
                "m.lock: filters sessions.id without tenant_id",
                "m.lock: locks rows without tenant_id",
            ],
        ),
        (
            """
            async def lock(db, tenant_id, pk):
                query = select(Session).where(Session.id == pk).with_for_update()
                query = query.where(Session.tenant_id == tenant_id)
                return await db.execute(query)
            """,
            [],
        ),
        (  # two statements in one function: each is judged on its own
            """
            async def erase(db, tenant_id, pk):
                texts = await db.execute(select(Turn.content).where(Turn.session_id == pk))
                await db.execute(
                    update(Turn).where(Turn.session_id == pk, Turn.tenant_id == tenant_id)
                )
            """,
            ["m.erase: filters turns.session_id without tenant_id"],
        ),
        (  # a read by identity, a backlog's rows by id, a lock without any filter by key
            """
            async def read(db, pk, backlog, ids):
                table = backlog.table
                await db.execute(update(table).where(table.id.in_(ids)))
                await db.execute(select(Chunk).where(Chunk.status == "x").with_for_update())
                return await db.get(Scratchpad, pk)
            """,
            [
                "m.read: filters a backlog's table.id without tenant_id",
                "m.read: locks rows without tenant_id",
                "m.read: filters scratchpads.id without tenant_id",
            ],
        ),
        (  # a join is the join check's; the global tables filter as they like
            """
            async def joined(db, tenant_id, key_id):
                same = (Turn.session_id == Session.id) & (Turn.tenant_id == Session.tenant_id)
                await db.execute(select(ApiKey).where(ApiKey.id == key_id))
                return select(Turn).join(Session, same).where(Session.tenant_id == tenant_id)
            """,
            [],
        ),
        (  # SQL text: each alias needs its own tenant filter
            """
            SHOWN = (
                "WITH near AS (SELECT id, tenant_id FROM chunks WHERE session_id = %(s)s"
                " AND tenant_id = %(t)s) SELECT c.id FROM chunks c JOIN near n"
                " ON n.id = c.id AND n.tenant_id = c.tenant_id WHERE c.id = ANY(%(ids)s)"
            )
            """,
            ["m.line 2: filters c.id without tenant_id"],
        ),
        (
            """
            def exact(session, tenant):
                return (
                    f"SELECT id FROM chunks WHERE tenant_id = '{tenant}'::uuid"
                    f" AND session_id = '{session}'::uuid FOR UPDATE"
                )
            """,
            [],
        ),
        (
            """
            LOCK = "SELECT 1 FROM turns t WHERE t.session_id = :s FOR UPDATE SKIP LOCKED"
            QUEUE = "SELECT id FROM procrastinate_jobs WHERE id = :id FOR UPDATE"
            """,
            [
                "m.line 2: filters t.session_id without tenant_id",
                "m.line 2: locks rows without tenant_id",
            ],
        ),
    ],
)
def test_a_statement_that_picks_rows_without_the_tenant_is_named(
    source: str, expected: list[str]
) -> None:
    assert filter_breaches(source, "m", _TABLES, {}) == expected
