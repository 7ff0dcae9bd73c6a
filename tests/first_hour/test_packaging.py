"""Installing contextd prints no warning of its own making: both packages of this repository
are built as `pip install` builds them (an isolated build environment with the setuptools their
`pyproject.toml` asks for), and what the build says is read for setuptools' warnings."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGING_WARNINGS = ("deprecat", "buildbackendwarning", "setuptoolswarning", "userwarning")


@pytest.mark.parametrize("project", [".", "integrations/openai_agents"])
def test_building_a_package_prints_no_packaging_warning(project: str, tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), project],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    said = (built.stdout + built.stderr).splitlines()
    warnings = [line for line in said if any(w in line.lower() for w in PACKAGING_WARNINGS)]
    assert warnings == [], "\n".join(warnings)
    assert list(tmp_path.glob("*.whl")), said
