from pathlib import Path

from app.core.config import settings_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_documents_every_setting_and_default() -> None:
    readme = README.read_text()
    missing = [row for row in settings_table().splitlines() if row not in readme]
    assert missing == [], "README configuration table is stale: paste `contextd config`"


def test_ci_runs_the_readme_test_command() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in README.read_text()
    assert ci.strip().splitlines()[-1] == "make test"
