"""Installing contextd prints no warning of its own making: both packages of this repository
are built as `pip install` builds them (an isolated build environment with the setuptools their
`pyproject.toml` asks for), and what the build says is read for setuptools' warnings."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGING_WARNINGS = ("deprecat", "buildbackendwarning", "setuptoolswarning", "userwarning")


@pytest.mark.parametrize("editable", [False, True], ids=["wheel", "editable"])
@pytest.mark.parametrize("project", [".", "integrations/openai_agents"])
def test_installing_a_package_prints_no_packaging_warning(
    project: str, editable: bool, tmp_path: Path
) -> None:
    """`make` installs contextd editable, the README installs the integration as a wheel and
    its test editable: each way, into a scratch prefix, with nothing from setuptools said."""
    # --ignore-installed: else pip uninstalls this venv's own install of the package first.
    into = ["--ignore-installed", "--prefix", str(tmp_path), "-e", project]
    where = into if editable else ["-w", str(tmp_path), project]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install" if editable else "wheel", "--no-deps", *where],
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
    assert list(tmp_path.rglob("*.whl" if not editable else "__editable__.*.pth")), said
    assert Path(sys.executable).with_name("contextd").exists()  # the venv's install untouched
