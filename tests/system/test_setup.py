"""A fresh machine following the README: `make test` sets up what its tests need beyond Python
or stops first saying precisely what to install; `make` installs the evaluation plots' extra;
a generated client is not left for git to pick up."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREREQUISITES = REPO / "tests" / "support" / "prerequisites.sh"


def prerequisites(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(PREREQUISITES)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )


def executable(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_missing_chromium_stops_make_test_with_the_command_to_run(tmp_path: Path) -> None:
    done = prerequisites(tmp_path, CONTEXTD_TEST_CHROMIUM=str(tmp_path / "no-chromium"))
    assert done.returncode == 1
    assert "the inspector's browser tests need Chromium" in done.stderr
    assert "sudo apt-get install chromium" in done.stderr
    assert "CONTEXTD_TEST_CHROMIUM=/path/to/chromium make test" in done.stderr


def test_an_old_node_stops_make_test_naming_the_version_it_needs(tmp_path: Path) -> None:
    chromium = executable(tmp_path / "chromium", "exit 0")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "node", 'case "$1" in -p) echo 18;; *) echo v18.19.0;; esac')
    path = f"{bin_dir}:{os.environ['PATH']}"
    done = prerequisites(tmp_path, CONTEXTD_TEST_CHROMIUM=str(chromium), PATH=path)
    assert done.returncode == 1
    assert "need Node.js 20 or newer with npm" in done.stderr and "v18.19.0" in done.stderr
    assert "Chromium" not in done.stderr


def test_a_machine_with_both_passes_silently(tmp_path: Path) -> None:
    chromium = executable(tmp_path / "chromium", "exit 0")
    done = prerequisites(tmp_path, CONTEXTD_TEST_CHROMIUM=str(chromium))
    assert (done.returncode, done.stderr) == (0, "")


def test_make_installs_the_eval_extra_for_the_plots() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "pip install -q -e '.[dev,eval]'" in makefile
    import matplotlib  # what `contextd eval` and `benchmarks.plots` draw with

    assert matplotlib.__version__


def test_a_generated_python_client_is_ignored_by_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "contextd-client/pyproject.toml"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0
