"""The dependency rules of `app/`, checked from the source (run by `make lint` and by `make test`).

- No import cycles between modules — every import counts, also inside functions and under
  `TYPE_CHECKING`.
- Layers point one way. Bottom: `app.domain` (pure values: the budget kernel, shared records),
  importing nothing else of `app`. Infrastructure (`app.core`, `app.db`, `app.embeddings`,
  `app.jobs.queue`) imports only infrastructure and `app.domain`. In a domain folder, endpoints
  → service → repository / pure policy → infrastructure: a repository or a pure module never
  imports a service or endpoints, a service never imports endpoints, and the pure policy modules
  do no I/O (no database, cache or HTTP client).
- Composition roots (`app.main`, `app.cli`, `app.jobs.worker`) are imported by nobody but the CLI.
"""

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"

INFRASTRUCTURE = ("app.domain", "app.core", "app.db", "app.embeddings", "app.jobs.queue")
ROOTS = ("app.main", "app.cli", "app.jobs.worker")
# Rules of the product, no I/O: unit-tested without a database.
PURE = (
    "app.domain",
    "app.core.breaker",
    "app.offload.policy",
    "app.offload.chunking",
    "app.notes.policy",
    "app.notes.rules",
    "app.notes.values",
    "app.notes.layering",
    "app.recall.adapter",
    "app.recall.bm25",
    "app.recall.fusion",
    "app.recall.rerank",
    "app.recall.rewrite",
    "app.prompt.assembly",
    "app.prompt.blocks",
    "app.prompt.clearing",
    "app.memory.policy",
)
IO_LIBRARIES = ("sqlalchemy", "redis", "httpx", "psycopg", "procrastinate", "app.db", "app.core.db")


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Modules `path` imports: app modules resolved to the deepest known module, others kept as
    their top-level package name."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if not name.startswith("app"):
                found.add(name)
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph(root: Path = APP) -> dict[str, set[str]]:
    files = {module_name(p): p for p in root.rglob("*.py")}
    known = set(files)
    graph = {name: imports_of(path, known) - {name} for name, path in files.items()}
    # `from app.x import y` also names the package `app.x`: drop package self-edges that only
    # come from importing a sibling through its package.
    return {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def kind(module: str) -> str:
    """endpoints | service | repository | pure | other, from the module's last name."""
    last = module.rpartition(".")[2]
    if within(module, PURE):
        return "pure"
    if last in ("endpoints", "repository"):
        return last
    return "service" if last in ("service", "tasks") else "other"


def violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    out: list[str] = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            internal = target.startswith("app")
            if within(source, ("app.domain",)) and internal and not within(target, ("app.domain",)):
                out.append(f"{source} -> {target}: app.domain imports nothing else of app")
            elif within(source, INFRASTRUCTURE) and internal and not within(target, INFRASTRUCTURE):
                out.append(f"{source} -> {target}: infrastructure imports only infrastructure")
            if within(target, ROOTS) and source != "app.cli":
                out.append(f"{source} -> {target}: composition roots are imported by the CLI only")
            if kind(source) == "pure" and within(target, IO_LIBRARIES):
                out.append(f"{source} -> {target}: pure policy modules do no I/O")
            if kind(source) in ("pure", "repository") and kind(target) in ("service", "endpoints"):
                out.append(f"{source} -> {target}: {kind(source)} modules sit below services")
            if kind(source) == "service" and kind(target) == "endpoints":
                out.append(f"{source} -> {target}: services sit below endpoints")
    return out


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_dependencies_point_one_way() -> None:
    assert violations(import_graph()) == []


def test_the_checks_can_fail() -> None:
    graph = {
        "app.a.service": {"app.b.service"},
        "app.b.service": {"app.a.service"},
        "app.a.repository": {"app.a.service", "sqlalchemy"},
        "app.offload.policy": {"sqlalchemy"},
        "app.core.x": {"app.a.service"},
    }
    assert cycles(graph) == [["app.a.service", "app.b.service"]]
    assert len(violations(graph)) == 3
