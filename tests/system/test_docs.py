"""The documentation cannot drift from the code or from itself: every relative link of the README
and of docs/ resolves (anchors included), the configuration page lists exactly the settings the
settings classes define with their defaults, the API page's endpoint list is the committed
OpenAPI document's, every figure in the README links to the results page, and the README stays
a ten-minute read."""

import json
import re
from pathlib import Path

from app.core.config import Settings, session_settings_table, settings_table
from app.domain.budget import BudgetConfig
from app.runtime.cli import OPENAPI_PATH, api_doc_with_index
from app.sessions.schemas import SessionConfigUpdate
from tests.clients.toolchain import TSCONFIG

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 460

FENCE_RE = re.compile(r"^```.*?^```[^\n]*$", re.DOTALL | re.MULTILINE)
LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^(#{1,6}) (.+?)\s*$", re.MULTILINE)
ENV_ROW_RE = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \| (.*?) \| (.*) \|$", re.MULTILINE)
SESSION_ROW_RE = re.compile(
    r"^\| `([a-z][a-z0-9_]*)` \| `(.*?)` \| `(CONTEXTD_[A-Z0-9_]+)` \| (.*) \|$", re.MULTILINE
)
# A measured figure: a share written the way the results are (.951, 1.000) or a ratio (1.33×).
FIGURE_RE = re.compile(r"(?<![\w.])(?:\d)?\.\d{3}\b|\b\d+\.\d+×")


def prose(text: str) -> str:
    """`text` without its fenced code blocks (a `# comment` in a shell block is no heading)."""
    return FENCE_RE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING_RE.findall(prose(page.read_text())):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def test_slug_is_githubs() -> None:
    assert slug("Degradation, never worse than truncation") == (
        "degradation-never-worse-than-truncation"
    )
    assert slug("A user's data") == "a-users-data"
    assert slug("Sizing contextd serve --workers N") == "sizing-contextd-serve---workers-n"
    assert slug("API conformance (tests/system/test_schemathesis.py)") == (
        "api-conformance-testssystemtest_schemathesispy"
    )


def test_every_relative_link_resolves_with_its_anchor() -> None:
    broken = []
    for page in PAGES:
        for target in LINK_RE.findall(prose(page.read_text())):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_every_docs_page_is_in_the_index_and_the_readme_links_the_index() -> None:
    index = (DOCS / "README.md").read_text()
    unlisted = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in index]
    assert unlisted == []
    assert "(docs/README.md)" in README.read_text()


def test_the_readme_is_a_ten_minute_read_in_the_users_order() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    order = [
        "## Quick start",
        "## Five minutes with curl",
        "## Integrations",
        "## Agents that call tools",
        "## Settings you change most",
        "## Operations",
        "## Limits and errors",
        "## Read more",
    ]
    positions = [text.index(title) for title in order]
    assert positions == sorted(positions)


def test_every_figure_in_the_readme_links_to_the_results_page() -> None:
    """A paragraph or table holding a measured figure links to docs/RESULTS.md, or follows a
    paragraph that does (a table under the sentence that says where it comes from)."""
    blocks = [b for b in re.split(r"\n\s*\n", prose(README.read_text())) if b.strip()]
    unlinked = []
    for i, block in enumerate(blocks):
        if not FIGURE_RE.search(block):
            continue
        linked = "docs/RESULTS.md" in block or (i > 0 and "docs/RESULTS.md" in blocks[i - 1])
        if not linked:
            unlinked.append(block[:120])
    assert unlinked == []
    assert sum(1 for b in blocks if FIGURE_RE.search(b)) >= 2  # the check saw the figures


def leaf_settings(model: type, prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            out |= leaf_settings(annotation, f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


def test_configuration_page_lists_every_setting_with_its_default() -> None:
    """Every field of the settings classes documented, nothing documented that does not exist,
    and each default (and meaning) as the code has it: `contextd config` prints the tables."""
    page = (DOCS / "CONFIGURATION.md").read_text()
    documented = {var: (default, meaning) for var, default, meaning in ENV_ROW_RE.findall(page)}
    defined = {
        var: (default, meaning) for var, default, meaning in ENV_ROW_RE.findall(settings_table())
    }
    assert len(defined) == len(leaf_settings(Settings))  # the table walks every field
    assert sorted(set(defined) - set(documented)) == [], "undocumented: paste `contextd config`"
    assert sorted(set(documented) - set(defined)) == [], "documented, but no such setting"
    stale = {var: documented[var] for var in defined if documented[var] != defined[var]}
    assert stale == {}, "defaults or meanings differ: paste `contextd config`"


def test_configuration_page_lists_every_session_setting_with_its_default() -> None:
    page = (DOCS / "CONFIGURATION.md").read_text()
    documented = {row[0]: row[1:] for row in SESSION_ROW_RE.findall(page)}
    defined = {row[0]: row[1:] for row in SESSION_ROW_RE.findall(session_settings_table())}
    assert set(defined) == set(BudgetConfig.model_fields)
    assert set(SessionConfigUpdate.model_fields) == set(defined) | {"user_id", "metadata"}
    assert documented == defined, "per-session settings differ: paste `contextd config`"
    assert all(f"`{name}`" in page for name in ("user_id", "metadata"))


def test_api_page_lists_the_committed_openapi_documents_endpoints() -> None:
    page = (DOCS / "API.md").read_text()
    spec = json.loads(OPENAPI_PATH.read_text())
    assert page == api_doc_with_index(page, spec), "run `contextd openapi`"
    paths = [f"`{path}`" for path in spec["paths"]]
    assert len(paths) >= 15 and all(path in page for path in paths)


def test_typescript_snippet_states_the_module_settings_the_tests_compile_with() -> None:
    section = README.read_text().split("### TypeScript", 1)[1].split("\n### ", 1)[0]
    options = TSCONFIG["compilerOptions"]
    assert '"type": "module"' in section and "npm pkg set type=module" in section
    for key in ("module", "moduleResolution", "target"):
        assert f'"{key}": "{options[key]}"' in section


def test_readme_settings_show_the_codes_defaults() -> None:
    section = README.read_text().split("## Settings you change most", 1)[1].split("\n## ", 1)[0]
    shown = {var: default for var, default, _ in ENV_ROW_RE.findall(section)}
    defined = {var: default for var, default, _ in ENV_ROW_RE.findall(settings_table())}
    assert len(shown) >= 8
    assert {var: defined.get(var) for var in shown} == shown
