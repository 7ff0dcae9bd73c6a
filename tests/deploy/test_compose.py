"""docker-compose.yml and .env.example, validated offline: PyYAML parses the file, compose's
`${VAR:-default}` substitution is applied here, and the result is checked against the settings."""

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from app.core.config import load_settings, settings_table, to_sqlalchemy_url
from app.runtime.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
APP_SERVICES = ("migrate", "api", "worker")
DEPENDS_ON_STACK = {
    "postgres": {"condition": "service_healthy"},
    "redis": {"condition": "service_healthy"},
    "migrate": {"condition": "service_completed_successfully"},
}
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}; `$${` is a literal `${`
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")


def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in (ROOT / ".env.example").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"bad line: {raw!r}"
        assert name not in values, f"{name} listed twice"
        values[name] = value
    return values


def strings(value: Any) -> list[str]:
    """Every string (keys too) of the parsed file: what compose substitutes (comments are not)."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's substitution (the subset this file uses), then `$$` → `$`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, operator, default = match.groups()
        assert operator == ":-", f"${{{name}}} has no `:-default`"
        return env[name] if env.get(name) else default

    return VARIABLE.sub(substitute, value).replace("$$", "$")


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    parsed = yaml.safe_load(COMPOSE_TEXT)
    assert isinstance(parsed, dict)
    return parsed


@pytest.fixture(scope="module")
def services(raw: dict[str, Any]) -> dict[str, Any]:
    """The services as compose runs them with no .env: every default applied."""
    return interpolate(raw["services"], {})


def test_services_and_images(raw: dict[str, Any], services: dict[str, Any]) -> None:
    assert set(services) == {"postgres", "redis", "migrate", "api", "worker"}
    assert services["postgres"]["image"] == "pgvector/pgvector:pg16"
    assert services["redis"]["image"] == "redis:7"
    for name in APP_SERVICES:  # one image, built from this repository's Dockerfile
        assert raw["services"][name]["image"] == "${CONTEXTD_IMAGE:-contextd:local}"
        assert services[name]["build"] == {"context": "."}
        assert (ROOT / services[name]["build"]["context"] / "Dockerfile").is_file()


def test_commands_are_contextd_subcommands(services: dict[str, Any]) -> None:
    assert services["migrate"]["command"] == ["migrate"]
    assert services["api"]["command"] == ["serve", "--workers", "2"]
    assert build_parser().parse_args(services["api"]["command"]).workers == 2
    assert services["worker"]["command"] == ["worker"]
    for name in APP_SERVICES:
        args = build_parser().parse_args(services[name]["command"])
        assert args.command == services[name]["command"][0]


def test_postgres_has_a_named_volume_and_pg_isready(
    raw: dict[str, Any], services: dict[str, Any]
) -> None:
    postgres = services["postgres"]
    (volume,) = postgres["volumes"]
    source, target = volume.split(":")
    assert target == "/var/lib/postgresql/data"
    assert source in raw["volumes"], "a named (top-level) volume, not a bind mount"
    check = postgres["healthcheck"]
    assert check["test"][0] == "CMD-SHELL"
    assert check["test"][1].startswith("pg_isready ")
    # `$$` made it the container's own variable, not a compose substitution
    assert '"${POSTGRES_USER}"' in check["test"][1]
    assert '"${POSTGRES_DB}"' in check["test"][1]
    assert check["retries"] >= 5
    assert postgres["environment"] == {
        "POSTGRES_USER": "contextd",
        "POSTGRES_PASSWORD": "contextd",
        "POSTGRES_DB": "contextd",
    }


def test_redis_healthcheck_pings(services: dict[str, Any]) -> None:
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_migrate_runs_once_before_api_and_workers(services: dict[str, Any]) -> None:
    migrate = services["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["api"]["depends_on"] == DEPENDS_ON_STACK
    assert services["worker"]["depends_on"] == DEPENDS_ON_STACK


def test_only_the_api_keeps_the_image_http_healthcheck(services: dict[str, Any]) -> None:
    # the image's HEALTHCHECK probes /healthz; migrate and worker serve no HTTP
    assert "healthcheck" not in services["api"]
    assert services["migrate"]["healthcheck"] == {"disable": True}
    assert services["worker"]["healthcheck"] == {"disable": True}


def test_api_is_published_on_8080(raw: dict[str, Any], services: dict[str, Any]) -> None:
    api = services["api"]
    assert api["ports"] == ["8080:8080"]
    assert api["environment"]["CONTEXTD_HOST"] == "0.0.0.0"
    assert api["environment"]["CONTEXTD_PORT"] == "8080"
    moved = interpolate(raw["services"], {"CONTEXTD_API_PORT": "9000"})
    assert moved["api"]["ports"] == ["9000:8080"]


def test_worker_scales(services: dict[str, Any]) -> None:
    worker = services["worker"]
    for key in ("ports", "container_name", "hostname", "expose"):
        assert key not in worker, f"worker has {key}: `--scale worker=3` would clash"
    for name, service in services.items():
        assert "container_name" not in service, name


def test_app_environment_is_real_settings(services: dict[str, Any]) -> None:
    table = settings_table()
    for name in APP_SERVICES:
        env = services[name]["environment"]
        for key in env:
            assert f"| `{key}` |" in table, f"{name}: {key} is not a contextd setting"
        assert "CONTEXTD_AUTH_DISABLED" not in env
    env = {k: str(v) for k, v in services["api"]["environment"].items()}
    settings = load_settings(
        database_url=env["DATABASE_URL"],
        redis_url=env["REDIS_URL"],
        host=env["CONTEXTD_HOST"],
        port=env["CONTEXTD_PORT"],
    )
    assert settings.auth_disabled is False and settings.host == "0.0.0.0"
    database = urlsplit(env["DATABASE_URL"])
    assert (database.hostname, database.port, database.path) == ("postgres", 5432, "/contextd")
    assert (database.username, database.password) == ("contextd", "contextd")
    assert to_sqlalchemy_url(env["DATABASE_URL"]).startswith("postgresql+psycopg://")
    assert urlsplit(env["REDIS_URL"]).hostname == "redis"
    assert "CONTEXTD_AUTH_DISABLED" not in COMPOSE_TEXT


def test_every_variable_is_documented_in_env_example(raw: dict[str, Any]) -> None:
    documented = env_example()
    used: dict[str, str] = {}
    for text in strings(raw):
        for name, operator, default in VARIABLE.findall(text):
            assert operator == ":-", f"${{{name}}} needs a documented `:-default`"
            assert used.setdefault(name, default) == default, f"{name} has two defaults"
        bare = re.findall(r"(?<!\$)\$(?![{$])\w+", text.replace("$$", ""))
        assert bare == [], f"use ${{VAR:-default}}, not {bare}"
    assert len(used) >= 5
    assert set(used) == set(documented), (
        f"missing from .env.example: {sorted(set(used) - set(documented))}; "
        f"unused there: {sorted(set(documented) - set(used))}"
    )
    for name, default in used.items():
        assert documented[name] == default, f"{name}: .env.example says {documented[name]!r}"


def test_env_example_values_flow_through(raw: dict[str, Any]) -> None:
    custom = {**env_example(), "POSTGRES_PASSWORD": "s3cret", "CONTEXTD_LOG_LEVEL": "DEBUG"}
    services = interpolate(raw["services"], custom)
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "s3cret"
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert urlsplit(env["DATABASE_URL"]).password == "s3cret"
        assert env["CONTEXTD_LOG_LEVEL"] == "DEBUG"
