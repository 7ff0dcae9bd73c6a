"""Client generators and the Node toolchain, installed on first use (never skipped).

Python tools go into the running venv with pip; the Node tools (pinned in `tests/clients/ts/
package.json` and its lockfile) go into `tests/clients/ts/node_modules` (ignored by git) with
`npm ci`, reused by later runs while the lockfile is unchanged. A failed install fails the test with
the installer's output.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC_PATH = REPO / "openapi" / "openapi.json"
NODE_DIR = Path(__file__).resolve().parent / "ts"
NODE_MODULES = NODE_DIR / "node_modules"
NODE_BIN = NODE_MODULES / ".bin"
_STAMP = NODE_MODULES / ".contextd-lock-sha256"
NODE_MAJOR_MIN = 20


def run(
    cmd: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    what: str,
) -> subprocess.CompletedProcess[str]:
    """Run a command; a non-zero exit fails the test with everything it printed."""
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
    return proc


def spec() -> dict:
    return json.loads(SPEC_PATH.read_text())


def ensure_pip_package(module: str, requirement: str) -> None:
    """Install `requirement` into this interpreter's environment unless `module` imports."""
    if importlib.util.find_spec(module) is not None:
        return
    run(
        [sys.executable, "-m", "pip", "install", "-q", requirement],
        what=f"installing {requirement} (a dev dependency: pip install -e '.[dev]')",
    )
    importlib.invalidate_caches()
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{requirement} installed but `{module}` does not import", pytrace=False)


def python_generator() -> list[str]:
    """The command that runs openapi-python-client, installing it first when missing."""
    ensure_pip_package("openapi_python_client", "openapi-python-client>=0.21")
    return [sys.executable, "-m", "openapi_python_client"]


def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.fail(
            "Node.js (>= 20) is needed on PATH for the TypeScript client tests", pytrace=False
        )
    version = run([found, "--version"], what="node --version").stdout.strip()
    major = int(version.lstrip("v").split(".")[0])
    if major < NODE_MAJOR_MIN:
        pytest.fail(f"Node.js >= {NODE_MAJOR_MIN} needed, found {version}", pytrace=False)
    return found


def node_toolchain() -> Path:
    """`tests/clients/ts/node_modules`, installed from the lockfile unless already current."""
    node()
    lock = NODE_DIR / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (NODE_DIR / "package.json").read_bytes())
    wanted = digest.hexdigest()
    if _STAMP.exists() and _STAMP.read_text() == wanted:
        return NODE_MODULES
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed on PATH for the TypeScript client tests", pytrace=False)
    run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=NODE_DIR,
        env={**os.environ, "NODE_ENV": "development"},
        what="npm ci in tests/clients/ts (openapi-typescript, openapi-fetch, typescript)",
    )
    for tool in ("tsc", "openapi-typescript"):
        if not (NODE_BIN / tool).exists():
            pytest.fail(f"npm ci finished but {NODE_BIN / tool} is missing", pytrace=False)
    _STAMP.write_text(wanted)
    return NODE_MODULES


TSCONFIG = {
    "compilerOptions": {
        "target": "ES2022",
        "module": "NodeNext",
        "moduleResolution": "NodeNext",
        "lib": ["ES2022", "DOM"],
        "types": ["node"],
        "strict": True,
        "skipLibCheck": True,
    },
    "include": ["*.ts"],
}


def compile_ts(work: Path, *, tsconfig: dict | None = None) -> Path:
    """Type-check (strict) and compile the `*.ts` in `work` (a scratch dir) to ESM in work/dist."""
    modules = node_toolchain()
    (work / "package.json").write_text('{"type": "module"}\n')
    if tsconfig is not None or not (work / "tsconfig.json").exists():
        (work / "tsconfig.json").write_text(json.dumps(tsconfig or TSCONFIG, indent=2))
    link = work / "node_modules"
    if not link.exists():
        link.symlink_to(modules, target_is_directory=True)
    out = work / "dist"
    run(
        [
            node(),
            str(modules / "typescript" / "bin" / "tsc"),
            "--project",
            str(work),
            "--outDir",
            str(out),
        ],
        cwd=work,
        what=f"tsc (strict type check of {', '.join(p.name for p in work.glob('*.ts'))})",
    )
    return out


def run_node(
    script: Path, *, env: dict[str, str], stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node(), str(script)],
        input=stdin,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
