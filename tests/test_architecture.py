"""The dependency rules of `app/`, checked from the source (run by `make lint` and by `make test`).

- No import cycles between modules: every import counts, also inside functions and under
  `TYPE_CHECKING`.
- Layers point one way (`LAYERS`, bottom first): a module imports only modules of a lower layer,
  or of its own folder. Folders of one rank never import each other: the four engines (offload,
  notes, memories, recall), inspect and eval, jobs and auth.
- Inside a folder: nothing imports `endpoints` but the API root, and the pure policy modules
  (`PURE`) do no I/O and import no service.
- The composition roots (`app.runtime`) are imported by nobody in `app` but themselves.
- The build and recall paths stay readable: no function there over `MAX_HOT_FUNCTION_LINES`
  lines, and no file of `app` over `MAX_FILE_LINES` lines without a reason at its top.
"""

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"

# Bottom first. The longest matching prefix names a module's layer.
LAYERS: dict[str, int] = {
    "app": 0,  # the package itself: `__version__`
    "app.domain": 0,  # product language, pure: budget, records, tokens, text, dates, stem, ids
    "app.embeddings": 1,  # embedders behind one interface, with their own settings
    "app.core": 2,  # infrastructure: config, context, db, cache, breaker, limits, metrics, errors
    "app.store": 3,  # every table's SQL, one module per table group
    "app.http": 4,  # FastAPI plumbing: deps, input, pagination, server, health, errors, params
    "app.jobs": 5,  # transactional enqueue, what tasks share, the embedding loop
    "app.auth": 5,  # API keys, callers, their aliases
    "app.offload": 6,  # the engines: never import each other
    "app.notes": 6,
    "app.memories": 6,
    "app.recall": 6,
    "app.sessions": 7,  # the append, whole; session views and configuration
    "app.prompt": 8,  # build-prompt
    "app.erasure": 9,  # forget, delete, the erase job
    "app.agent": 10,  # what an agent calls: the memory tool, its definition and scopes, MCP
    "app.inspect": 11,
    "app.eval": 11,
    "app.runtime": 12,  # composition roots: API app, worker, CLI, embedded stack, processes
}
ROOTS = ("app.runtime",)
API_ROOT = "app.runtime.api"
# Rules of the product, no I/O: unit-tested without a database.
PURE = (
    "app.domain",
    "app.core.breaker",
    "app.offload.policy",
    "app.offload.chunking",
    "app.offload.cuts",
    "app.notes.policy",
    "app.notes.rules",
    "app.notes.sentences",
    "app.notes.notebook",
    "app.notes.constraints",
    "app.notes.decisions",
    "app.notes.facts",
    "app.notes.values",
    "app.notes.layering",
    "app.recall.adapter",
    "app.recall.bm25",
    "app.recall.fusion",
    "app.recall.rerank",
    "app.recall.rewrite",
    "app.recall.query",
    "app.recall.hits",
    "app.prompt.assembly",
    "app.prompt.blocks",
    "app.prompt.choosing",
    "app.prompt.clearing",
    "app.prompt.fitting",
    "app.prompt.manifest",
    "app.memories.policy",
    "app.agent.policy",
    "app.sessions.validation",
)
IO_LIBRARIES = (
    "sqlalchemy",
    "redis",
    "httpx",
    "psycopg",
    "procrastinate",
    "app.store",
    "app.core.db",
    "app.core.cache",
    "app.jobs",
)
# The build and recall paths (issue 35): short functions.
HOT_PATH = ("app.prompt", "app.recall", "app.sessions.append", "app.offload.service")
MAX_HOT_FUNCTION_LINES = 80
MAX_FILE_LINES = 600
FILE_SIZE_REASON = "Longer than 600 lines because"


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
            # `from app.x import module` names the module, not the package `app.x`
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            if any(name not in known for name in names):
                names.append(node.module)
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


def layer(module: str) -> str:
    """The `LAYERS` folder of `module`."""
    return max((p for p in LAYERS if within(module, (p,))), key=len)


def kind(module: str) -> str:
    last = module.rpartition(".")[2]
    if within(module, PURE):
        return "pure"
    if last == "endpoints":
        return "endpoints"
    return "service" if last in ("service", "tasks") else "other"


def violations(graph: Mapping[str, Iterable[str]]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for source, targets in graph.items():
        for target in targets:
            if not target.startswith("app"):
                if kind(source) == "pure" and within(target, IO_LIBRARIES):
                    out.add((source, target))
                continue
            a, b = layer(source), layer(target)
            if a != b and LAYERS[b] >= LAYERS[a]:
                out.add((source, target))  # upward, or sideways between folders of one rank
            if within(target, ROOTS) and not within(source, ROOTS):
                out.add((source, target))
            if kind(target) == "endpoints" and source != API_ROOT:
                out.add((source, target))
            if kind(source) == "pure" and (
                within(target, IO_LIBRARIES) or kind(target) in ("service", "endpoints")
            ):
                out.add((source, target))
    return out


def long_functions(root: Path = APP) -> set[str]:
    found: set[str] = set()
    for path in root.rglob("*.py"):
        module = module_name(path)
        if not within(module, HOT_PATH):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_HOT_FUNCTION_LINES:
                found.add(f"{module}.{node.name}")
    return found


def long_files(root: Path = APP) -> set[str]:
    return {
        module_name(p)
        for p in root.rglob("*.py")
        if len(p.read_text().splitlines()) > MAX_FILE_LINES
        and FILE_SIZE_REASON not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    }


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_dependencies_point_one_way() -> None:
    found = violations(import_graph())
    assert sorted(found) == [], "imports against the layers"


def test_the_build_and_recall_paths_have_short_functions() -> None:
    found = long_functions()
    assert sorted(found) == []


def test_long_files_say_why() -> None:
    found = long_files()
    assert sorted(found) == []


def test_the_checks_can_fail() -> None:
    graph = {
        "app.offload.service": {"app.recall.service"},
        "app.recall.service": {"app.offload.service"},
        "app.store.chunks": {"app.sessions.service", "app.store.models"},
        "app.offload.policy": {"sqlalchemy"},
        "app.core.x": {"app.http.deps"},
        "app.notes.service": {"app.runtime.api"},
        "app.prompt.service": {"app.sessions.endpoints"},
    }
    assert cycles(graph) == [["app.offload.service", "app.recall.service"]]
    assert violations(graph) == {
        ("app.offload.service", "app.recall.service"),
        ("app.recall.service", "app.offload.service"),
        ("app.store.chunks", "app.sessions.service"),
        ("app.offload.policy", "sqlalchemy"),
        ("app.core.x", "app.http.deps"),
        ("app.notes.service", "app.runtime.api"),
        ("app.prompt.service", "app.sessions.endpoints"),
    }
